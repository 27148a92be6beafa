// File: common/grpc_status.h
//
// absl::Status <-> grpc::Status at the edge of the gRPC services and clients. The codes are the
// same canonical set; the message is kept.
#ifndef SWITCHYARD_COMMON_GRPC_STATUS_H_
#define SWITCHYARD_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace switchyard {

absl::Status FromGrpcStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_GRPC_STATUS_H_
