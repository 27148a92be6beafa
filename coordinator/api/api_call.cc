#include "coordinator/api/api_call.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "coordinator/api/api_status.h"

namespace switchyard::api {

absl::Status RunApiCall(const TokenAuth& auth, metrics::CoordinatorMetrics* metrics,
                        absl::string_view method, const Caller& caller,
                        absl::FunctionRef<absl::Status()> body) {
  const absl::Time start = absl::Now();
  absl::Status status = auth.Check(caller, method);
  if (status.ok()) status = body();
  status = WithDefaultReason(status);
  if (status.code() == absl::StatusCode::kInternal || status.code() == absl::StatusCode::kUnknown) {
    SY_LOG(ERROR) << method << ": " << status;
  }
  if (metrics != nullptr) {
    metrics->ObserveRpc(method, CodeName(status.code()),
                        absl::ToDoubleSeconds(absl::Now() - start));
  }
  return status;
}

}  // namespace switchyard::api
