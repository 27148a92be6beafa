#include "worker/agent/coordinator_channel.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace switchyard::agent {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " '", path, "' cannot be read"));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat(what, " '", path, "' cannot be read"));
  return s.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& address, const std::string& tls_root_cert_path) {
  if (address.empty()) {
    return absl::InvalidArgumentError("coordinator address must be host:port, got \"\"");
  }
  grpc::ChannelArguments args;
  // A restarted coordinator should be found again quickly (the default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (tls_root_cert_path.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    absl::StatusOr<std::string> pem = ReadWholeFile(tls_root_cert_path, "TLS root certificate");
    if (!pem.ok()) return pem.status();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *pem;
    creds = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path, "token file");
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' holds no token"));
  }
  for (char c : token) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file '", path, "': the token must not contain whitespace or control characters"));
    }
  }
  return token;
}

void AddBearerToken(absl::string_view token, grpc::ClientContext* context) {
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

}  // namespace switchyard::agent
