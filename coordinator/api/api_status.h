// File: coordinator/api/api_status.h
//
// Errors at the edge of the coordinator's API (DESIGN.md "Errors and bad input", AIP-193).
//
// google.rpc.Status / ErrorInfo details are not available here (the system has no googleapis
// protos: /usr/include/google/rpc is absent), so the machine-readable reason travels in the status
// message as a suffix " (reason: UPPER_SNAKE)". Every error that leaves the API carries exactly
// one: the specific one the code chose (MISSING_TOKEN, INVALID_TOKEN, ...; the store's STORE_FULL,
// STORE_BUSY, STORE_CORRUPT, STORE_IO_ERROR, see coordinator/store/store.h) or the default for its
// code (DefaultReason). Clients may parse it with ReasonOf.
//
// gRPC codes are absl codes (same canonical set); REST maps them to HTTP (HttpStatusFor) and
// writes the body {"error": {"code": <http>, "status": "<CANONICAL_CODE>", "message": "...",
// "reason": "<REASON>"}}. FAILED_PRECONDITION maps to 400 as AIP-193 / google.rpc.Code documents
// (412 is reserved for HTTP conditional requests, which this API does not have).
#ifndef SWITCHYARD_COORDINATOR_API_API_STATUS_H_
#define SWITCHYARD_COORDINATOR_API_API_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace switchyard::api {

// "INVALID_ARGUMENT" for absl::StatusCode::kInvalidArgument, ...
std::string CodeName(absl::StatusCode code);

// The reason used when the code chose none: INVALID_ARGUMENT -> INVALID_REQUEST, NOT_FOUND ->
// NOT_FOUND, ALREADY_EXISTS -> REQUEST_ID_CONFLICT, FAILED_PRECONDITION -> INVALID_STATE,
// UNAUTHENTICATED -> INVALID_TOKEN, else the code name.
std::string DefaultReason(absl::StatusCode code);

// `status` with " (reason: `reason`)" appended to its message; OK and statuses that already
// carry a reason are returned unchanged.
absl::Status WithReason(const absl::Status& status, absl::string_view reason);
// WithReason(status, DefaultReason(status.code())).
absl::Status WithDefaultReason(const absl::Status& status);

// The reason carried by `status` ("" when none).
std::string ReasonOf(absl::string_view message);

// HTTP status for a canonical code (google/rpc/code.proto's HTTP mapping).
int HttpStatusFor(absl::StatusCode code);
// HTTP status for an error: HttpStatusFor(code), except a full store (reason STORE_FULL, code
// RESOURCE_EXHAUSTED) is 507 Insufficient Storage: 429 would tell clients to retry later, and a
// full disk does not drain by itself.
int HttpStatusOf(const absl::Status& status);

// The REST error body of a non-OK status (its reason added if missing). `http` is the body's
// "code": HttpStatusOf(status) when 0 (the gateway passes the HTTP status httplib chose
// for transport-level errors such as 413).
std::string ErrorJson(const absl::Status& status, int http = 0);

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_API_STATUS_H_
