// File: coordinator/api/api_call.h
//
// The one path every API call takes, gRPC or REST: authenticate, run the method, attach a reason
// to any error (api_status.h), record switchyard_coordinator_rpc_duration_seconds{method,code}.
// Keeping it in one function is what makes "the token is checked on every call" hold by
// construction: JobService, PlanService and the REST gateway call nothing else.
#ifndef SWITCHYARD_COORDINATOR_API_API_CALL_H_
#define SWITCHYARD_COORDINATOR_API_API_CALL_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "coordinator/api/auth.h"
#include "coordinator/metrics/coordinator_metrics.h"

namespace switchyard::api {

// Checks `caller` with `auth` (a failure is logged and counted there, auth.h); when it passes
// runs `body`. Returns the outcome with a reason attached. `metrics` may be null.
absl::Status RunApiCall(const TokenAuth& auth, metrics::CoordinatorMetrics* metrics,
                        absl::string_view method, const Caller& caller,
                        absl::FunctionRef<absl::Status()> body);

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_API_CALL_H_
