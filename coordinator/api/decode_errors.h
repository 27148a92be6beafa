// File: coordinator/api/decode_errors.h
//
// Undecodable requests get INVALID_ARGUMENT. gRPC C++'s generated sync handlers answer a request
// whose bytes do not parse as the method's message with INTERNAL and an empty message (proto3's
// InitializationErrorString() is empty), which tells the caller nothing and looks like a server
// bug. Every deserializer is instantiated inside the generated *.grpc.pb.cc, so it cannot be
// replaced without regenerating the code; a server interceptor sees the failure instead:
// POST_RECV_MESSAGE carries a null message exactly when deserialization failed, and the status
// it is about to send (PRE_SEND_STATUS) is then rewritten to
//
//   INVALID_ARGUMENT "/switchyard.v1.JobService/CreateJob: the request bytes are not a valid
//   serialized request message of this method (reason: INVALID_REQUEST)"
//
// Statuses of calls whose request decoded are never touched. Covers unary and server-streaming
// methods of sync services (the gRPC server reads their one request before the handler runs).
// A bidi stream (WorkerService.Attach, callback API) sees an undecodable message as the end of
// its reads; WORKER_PROTOCOL.md documents that.
//
// Use: builder.experimental().SetInterceptorCreators(DecodeErrorInterceptors());
#ifndef SWITCHYARD_COORDINATOR_API_DECODE_ERRORS_H_
#define SWITCHYARD_COORDINATOR_API_DECODE_ERRORS_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

namespace switchyard::api {

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
DecodeErrorInterceptors();

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_DECODE_ERRORS_H_
