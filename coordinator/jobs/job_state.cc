// File: coordinator/jobs/job_state.cc
#include "coordinator/jobs/job_state.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace switchyard::jobs {
namespace {

struct Edge {
  State from;
  State to;
};

constexpr Edge kTransitions[] = {
    {v1::Job::PENDING, v1::Job::STARTING},
    {v1::Job::PENDING, v1::Job::FAILED},
    {v1::Job::PENDING, v1::Job::CANCELLED},
    {v1::Job::STARTING, v1::Job::RUNNING},
    {v1::Job::STARTING, v1::Job::RESTARTING},
    {v1::Job::STARTING, v1::Job::FAILED},
    {v1::Job::STARTING, v1::Job::CANCELLED},
    {v1::Job::RUNNING, v1::Job::SUCCEEDED},
    {v1::Job::RUNNING, v1::Job::RESTARTING},
    {v1::Job::RUNNING, v1::Job::FAILED},
    {v1::Job::RUNNING, v1::Job::CANCELLED},
    {v1::Job::RESTARTING, v1::Job::STARTING},
    // Preempted at a checkpoint (scheduler.h "Preemption"): back to the queue, no restart spent.
    {v1::Job::RUNNING, v1::Job::PENDING},
    {v1::Job::RESTARTING, v1::Job::FAILED},
    {v1::Job::RESTARTING, v1::Job::CANCELLED},
};

std::string Name(State s) {
  return v1::Job::State_IsValid(s) ? v1::Job::State_Name(s) : absl::StrCat("State(", s, ")");
}

}  // namespace

bool IsTerminal(State state) {
  return state == v1::Job::SUCCEEDED || state == v1::Job::FAILED || state == v1::Job::CANCELLED;
}

std::vector<State> AllowedTargets(State from) {
  std::vector<State> targets;
  for (const Edge& e : kTransitions) {
    if (e.from == from) targets.push_back(e.to);
  }
  return targets;
}

absl::Status CheckTransition(State from, State to) {
  for (const Edge& e : kTransitions) {
    if (e.from == from && e.to == to) return absl::OkStatus();
  }
  std::vector<State> allowed = AllowedTargets(from);
  std::string what =
      allowed.empty()
          ? absl::StrCat(Name(from), IsTerminal(from) ? " is terminal" : " allows nothing")
          : absl::StrCat(Name(from), " allows ",
                         absl::StrJoin(allowed, ", ",
                                       [](std::string* out, State s) { out->append(Name(s)); }));
  return absl::FailedPreconditionError(
      absl::StrCat("job cannot go from ", Name(from), " to ", Name(to), " (", what, ")"));
}

absl::Status CheckReason(absl::string_view reason) {
  bool ok = !reason.empty() && reason.size() <= 63 && reason[0] >= 'A' && reason[0] <= 'Z';
  for (char c : reason) {
    ok = ok && ((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("reason (\"", absl::CHexEscape(reason.substr(0, 80)),
                   "\") must be 1 to 63 characters of A-Z, 0-9 and _, starting with a letter"));
}

absl::StatusOr<TransitionResult> ApplyTransition(const Lifecycle& before, State to,
                                                 absl::string_view reason,
                                                 absl::string_view message, int32_t max_restarts) {
  if (absl::Status s = CheckReason(reason); !s.ok()) return s;
  if (max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_restarts (", max_restarts, ") must be non-negative"));
  }
  if (absl::Status s = CheckTransition(before.state, to); !s.ok()) return s;
  TransitionResult result;
  result.after = before;
  result.after.state = to;
  result.reason = std::string(reason);
  result.message = std::string(message);
  switch (to) {
    case v1::Job::STARTING:
      ++result.after.generation;
      break;
    case v1::Job::RESTARTING:
      if (before.restart_count >= max_restarts) {
        result.after.state = v1::Job::FAILED;
        result.reason = std::string(kRestartLimitExceeded);
        result.message =
            absl::StrCat("restart budget spent (", before.restart_count, " of ", max_restarts,
                         " restarts used); cause: ", reason, message.empty() ? "" : ": ", message);
        result.after.failure_reason = absl::StrCat(result.reason, ": ", result.message);
      } else {
        ++result.after.restart_count;
      }
      break;
    case v1::Job::FAILED:
      result.after.failure_reason = absl::StrCat(reason, message.empty() ? "" : ": ", message);
      break;
    default:
      break;
  }
  return result;
}

}  // namespace switchyard::jobs
