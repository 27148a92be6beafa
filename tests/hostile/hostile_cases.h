// File: tests/hostile/hostile_cases.h
//
// The hostile-input table and the environment it runs against: the real coordinator process, a
// REST client, gRPC stubs and the syctl binary. A case is a name, the front door it uses, a call
// that returns what came back, the expected code and the strings the message must contain (the
// field path and the rule).
//
// Extending: add a row to one of the tables in hostile_cases.cc. A bad job spec goes in
// kSpecCases (it then runs through REST CreateJob, gRPC CreateJob and `syctl submit -f`); a raw
// body that is not a valid spec document goes in kBodyCases (REST and syctl); anything else is a
// Case appended in AllCases() with a lambda doing the call (helpers: Rest, Grpc..., Syctl).
#ifndef SWITCHYARD_TESTS_HOSTILE_HOSTILE_CASES_H_
#define SWITCHYARD_TESTS_HOSTILE_HOSTILE_CASES_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "switchyard/v1/job.grpc.pb.h"
#include "switchyard/v1/plan.grpc.pb.h"
#include "tests/e2e/e2e_util.h"

namespace switchyard::hostile {

enum class Via { kRest, kGrpc, kSyctl };
const char* ViaName(Via via);

// The running coordinator and clients. The sentinel job (jobs/1, valid) exists before any case.
class Env {
 public:
  // nullptr (and the log printed) when the coordinator does not start or the sentinel job
  // cannot be created.
  static std::unique_ptr<Env> Start(const std::string& coordinator, const std::string& syctl);

  e2e::CoordinatorProcess& coordinator() { return *coordinator_; }
  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::PlanService::Stub& plans() { return *plans_; }
  const std::string& syctl() const { return syctl_; }
  const std::string& token_file() const { return token_file_; }
  // A fresh file path in TEST_TMPDIR.
  std::string NewPath(const std::string& suffix);

 private:
  std::unique_ptr<e2e::CoordinatorProcess> coordinator_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::PlanService::Stub> plans_;
  std::string syctl_;
  std::string token_file_;
  int files_ = 0;
};

// What a call returned: `code` is the HTTP status, the gRPC code or syctl's exit code; `message`
// the error message (REST: error.message; syctl: stderr); `printed` what syctl wrote.
struct Outcome {
  int code = -1;
  std::string message;
  std::string printed;
};

struct Case {
  std::string name;
  Via via;
  std::function<Outcome(Env&)> run;
  int want;
  std::vector<std::string> needles;
};

// Every case, in table order.
std::vector<Case> AllCases();

// What "nothing was persisted" compares: the number of jobs and jobs/1's last event sequence.
struct Snapshot {
  bool ok = false;  // /healthz answered 200 and ListJobs succeeded
  int jobs = -1;
  int64_t sentinel_events = -1;
};
Snapshot TakeSnapshot(Env& env);

}  // namespace switchyard::hostile

#endif  // SWITCHYARD_TESTS_HOSTILE_HOSTILE_CASES_H_
