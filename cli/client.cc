#include "cli/client.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "cli/render.h"

namespace switchyard::cli {
namespace {

constexpr char kDefaultCoordinator[] = "localhost:50051";

std::string FromEnv(const std::string& value, const char* variable) {
  if (!value.empty()) return value;
  const char* env = std::getenv(variable);
  return env == nullptr ? "" : env;
}

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream s;
  s << in.rdbuf();
  *text = s.str();
  return !in.bad();
}

}  // namespace

std::unique_ptr<Client> Client::Create(const ClientOptions& options, int* exit_code) {
  *exit_code = kExitConnection;
  std::unique_ptr<Client> client(new Client());
  client->target_ = FromEnv(options.coordinator, "SYCTL_COORDINATOR");
  if (client->target_.empty()) client->target_ = kDefaultCoordinator;

  const std::string token_file = FromEnv(options.token_file, "SYCTL_TOKEN_FILE");
  if (token_file.empty()) {
    std::fprintf(stderr,
                 "syctl: no API token: pass --token-file FILE or set SYCTL_TOKEN_FILE "
                 "(the file holds the coordinator's bearer token)\n");
    return nullptr;
  }
  std::string token;
  if (!ReadFile(token_file, &token)) {
    std::fprintf(stderr, "syctl: cannot read the token file '%s'\n", token_file.c_str());
    return nullptr;
  }
  client->token_ = std::string(absl::StripAsciiWhitespace(token));
  if (client->token_.empty()) {
    std::fprintf(stderr, "syctl: the token file '%s' is empty\n", token_file.c_str());
    return nullptr;
  }

  std::shared_ptr<grpc::ChannelCredentials> credentials;
  const std::string root_cert = FromEnv(options.tls_root_cert, "SYCTL_TLS_ROOT_CERT");
  if (root_cert.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    if (!ReadFile(root_cert, &ssl.pem_root_certs) || ssl.pem_root_certs.empty()) {
      std::fprintf(stderr, "syctl: cannot read the TLS root certificate '%s'\n", root_cert.c_str());
      return nullptr;
    }
    credentials = grpc::SslCredentials(ssl);
  }
  client->channel_ = grpc::CreateChannel(client->target_, credentials);
  client->jobs_ = v1::JobService::NewStub(client->channel_);
  client->plans_ = v1::PlanService::NewStub(client->channel_);
  client->workers_ = v1::WorkerAdminService::NewStub(client->channel_);
  *exit_code = kExitOk;
  return client;
}

std::unique_ptr<grpc::ClientContext> Client::Context(int seconds) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("authorization", "Bearer " + token_);
  if (seconds > 0) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  }
  return context;
}

int Client::Fail(const std::string& verb, const grpc::Status& status) const {
  const std::string code =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  std::fprintf(stderr, "syctl %s: %s: %s\n", verb.c_str(), code.c_str(),
               TerminalSafe(status.error_message()).c_str());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      std::fprintf(stderr, "syctl: cannot reach the coordinator at %s (--coordinator)\n",
                   target_.c_str());
      return kExitConnection;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      std::fprintf(stderr, "syctl: the coordinator at %s refused the token (--token-file)\n",
                   target_.c_str());
      return kExitConnection;
    default:
      return kExitFailure;
  }
}

}  // namespace switchyard::cli
