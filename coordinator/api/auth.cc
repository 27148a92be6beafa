#include "coordinator/api/auth.h"

#include <grpcpp/server_context.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::FromToken(absl::string_view token) {
  token = absl::StripAsciiWhitespace(token);
  if (token.empty()) return absl::InvalidArgumentError("token: must not be empty");
  for (char c : token) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError("token: must not contain whitespace or control characters");
    }
  }
  return std::unique_ptr<TokenAuth>(new TokenAuth(std::string(token)));
}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("token file ", path, ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::unique_ptr<TokenAuth>> auth = FromToken(text.str());
  if (!auth.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": ", auth.status().message()));
  }
  return auth;
}

absl::Status TokenAuth::Check(absl::string_view authorization) const {
  if (authorization.empty()) {
    return WithReason(absl::UnauthenticatedError(
                          "missing credentials: send the header 'authorization: Bearer <token>'"),
                      kMissingToken);
  }
  if (!absl::StartsWithIgnoreCase(authorization, kBearer)) {
    return WithReason(
        absl::UnauthenticatedError("authorization: expected the scheme 'Bearer <token>'"),
        kInvalidToken);
  }
  absl::string_view presented = absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
  if (!ConstantTimeEquals(presented, token_)) {
    return WithReason(absl::UnauthenticatedError("authorization: the bearer token is not valid"),
                      kInvalidToken);
  }
  return absl::OkStatus();
}

std::string AuthorizationOf(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace switchyard::api
