#include "coordinator/api/auth.h"

#include <grpcpp/server_context.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "coordinator/api/api_status.h"

namespace switchyard::api {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (b.empty() ? 0 : b[i % b.size()]));
  }
  return diff == 0;
}

// The token after "Bearer " in `token`; false when the scheme is not Bearer.
bool BearerToken(absl::string_view authorization, absl::string_view* token) {
  if (!absl::StartsWithIgnoreCase(authorization, kBearer)) return false;
  *token = absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
  return true;
}

}  // namespace

// --- AuthAudit ------------------------------------------------------------------------------

AuthAudit::AuthAudit(prometheus::Registry* registry, absl::Duration window, int burst)
    : window_(window), burst_(burst) {
  if (registry != nullptr) {
    family_ = &prometheus::BuildCounter()
                   .Name(std::string(kAuthFailuresMetric))
                   .Help(
                       "Failed authentications by the role of the service called and the "
                       "reason (MISSING_TOKEN, INVALID_TOKEN, WRONG_ROLE).")
                   .Register(*registry);
  }
}

void AuthAudit::Record(absl::string_view role, absl::string_view reason, absl::string_view method,
                       absl::string_view peer, absl::string_view message) {
  if (family_ != nullptr) {
    // Family::Add returns the existing child for known labels; role and reason are closed sets.
    family_->Add({{"role", std::string(role)}, {"reason", std::string(reason)}}).Increment();
  }
  int64_t suppressed = 0;
  {
    absl::MutexLock lock(&mu_);
    ++failures_;
    const absl::Time now = absl::Now();
    if (now - window_start_ >= window_) {
      window_start_ = now;
      lines_in_window_ = 0;
    }
    if (lines_in_window_ >= burst_) {
      ++suppressed_;
      return;
    }
    ++lines_in_window_;
    ++lines_;
    suppressed = suppressed_;
    suppressed_ = 0;
  }
  SY_LOG(WARNING) << "auth failure: peer " << (peer.empty() ? "unknown" : peer) << " method "
                  << (method.empty() ? "unknown" : method) << " role " << role << " reason "
                  << reason << ": " << message
                  << (suppressed > 0 ? absl::StrCat(" (", suppressed, " more failures not logged)")
                                     : "");
}

int64_t AuthAudit::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

int64_t AuthAudit::lines_logged() const {
  absl::MutexLock lock(&mu_);
  return lines_;
}

// --- TokenAuth ------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::FromToken(absl::string_view token,
                                                                absl::string_view role) {
  token = absl::StripAsciiWhitespace(token);
  if (token.empty()) return absl::InvalidArgumentError("token: must not be empty");
  for (char c : token) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError("token: must not contain whitespace or control characters");
    }
  }
  return std::unique_ptr<TokenAuth>(new TokenAuth(std::string(token), role));
}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::FromFile(const std::string& path,
                                                               absl::string_view role) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("token file ", path, ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::unique_ptr<TokenAuth>> auth = FromToken(text.str(), role);
  if (!auth.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": ", auth.status().message()));
  }
  return auth;
}

bool TokenAuth::SameToken(const TokenAuth& other) const {
  return ConstantTimeEquals(token_, other.token_);
}

absl::Status TokenAuth::Verify(absl::string_view authorization) const {
  if (authorization.empty()) {
    return WithReason(absl::UnauthenticatedError(absl::StrCat(
                          "missing credentials: send the header 'authorization: Bearer <token>' "
                          "with the ",
                          role_, " token")),
                      kMissingToken);
  }
  absl::string_view presented;
  if (!BearerToken(authorization, &presented)) {
    return WithReason(
        absl::UnauthenticatedError("authorization: expected the scheme 'Bearer <token>'"),
        kInvalidToken);
  }
  if (ConstantTimeEquals(presented, token_)) return absl::OkStatus();
  if (other_ != nullptr && ConstantTimeEquals(presented, other_->token_)) {
    return WithReason(absl::UnauthenticatedError(
                          absl::StrCat("authorization: this is the ", other_->role_,
                                       " token; this service accepts only the ", role_, " token")),
                      kWrongRole);
  }
  return WithReason(absl::UnauthenticatedError(absl::StrCat(
                        "authorization: the bearer token is not a valid ", role_, " token")),
                    kInvalidToken);
}

absl::Status TokenAuth::Check(const Caller& caller, absl::string_view method) const {
  absl::Status status = Verify(caller.authorization);
  if (!status.ok() && audit_ != nullptr) {
    audit_->Record(role_, ReasonOf(status.message()), method, caller.peer, status.message());
  }
  return status;
}

Caller AuthorizationOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  std::string authorization;
  if (it != metadata.end()) authorization.assign(it->second.data(), it->second.size());
  return Caller(std::move(authorization), context.peer());
}

}  // namespace switchyard::api
