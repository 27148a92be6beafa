#include "coordinator/api/decode_errors.h"

#include <grpcpp/support/interceptor.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace switchyard::api {
namespace {

using grpc::experimental::InterceptionHookPoints;

class DecodeErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit DecodeErrorInterceptor(grpc::experimental::ServerRpcInfo* info)
      : method_(info->method() != nullptr ? info->method() : "") {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      undecodable_ = true;
    }
    if (undecodable_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat(method_,
                       ": the request bytes are not a valid serialized request message of this "
                       "method (reason: INVALID_REQUEST)")));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool undecodable_ = false;  // the interceptor is per call; its hooks run one at a time
};

class DecodeErrorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new DecodeErrorInterceptor(info);
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
DecodeErrorInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
  out.push_back(std::make_unique<DecodeErrorFactory>());
  return out;
}

}  // namespace switchyard::api
