#include "coordinator/api/api_status.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace switchyard::api {
namespace {
constexpr absl::string_view kReasonPrefix = " (reason: ";
}  // namespace

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

std::string DefaultReason(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
      return "INVALID_REQUEST";
    case absl::StatusCode::kAlreadyExists:
      return "REQUEST_ID_CONFLICT";
    case absl::StatusCode::kFailedPrecondition:
      return "INVALID_STATE";
    case absl::StatusCode::kUnauthenticated:
      return "INVALID_TOKEN";
    default:
      return CodeName(code);
  }
}

absl::Status WithReason(const absl::Status& status, absl::string_view reason) {
  if (status.ok() || absl::StrContains(status.message(), kReasonPrefix)) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), kReasonPrefix, reason, ")"));
}

absl::Status WithDefaultReason(const absl::Status& status) {
  return WithReason(status, DefaultReason(status.code()));
}

std::string ReasonOf(absl::string_view message) {
  const size_t at = message.rfind(kReasonPrefix);
  if (at == absl::string_view::npos) return "";
  absl::string_view rest = message.substr(at + kReasonPrefix.size());
  const size_t end = rest.find(')');
  return std::string(rest.substr(0, end));
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

int HttpStatusOf(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kResourceExhausted &&
      ReasonOf(status.message()) == "STORE_FULL") {
    return 507;
  }
  return HttpStatusFor(status.code());
}

std::string ErrorJson(const absl::Status& status, int http) {
  const absl::Status s = WithDefaultReason(status);
  nlohmann::json body = {{"error",
                          {{"code", http != 0 ? http : HttpStatusOf(s)},
                           {"status", CodeName(s.code())},
                           {"message", std::string(s.message())},
                           {"reason", ReasonOf(s.message())}}}};
  return body.dump();
}

}  // namespace switchyard::api
