// The project's status macros and the gRPC converters (the CUDA/cuBLAS/NCCL ones are tested in
// kernels/runtime/cuda_status_test.cc).
#include "common/status.h"

#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

#include "common/grpc_status.h"

namespace switchyard {
namespace {

absl::StatusOr<int> Half(int v) {
  if (v % 2 != 0) return absl::InvalidArgumentError("odd");
  return v / 2;
}

absl::Status UseAssign(int v, int* out) {
  SY_ASSIGN_OR_RETURN(*out, Half(v));
  SY_ASSIGN_OR_RETURN(int quarter, Half(*out));
  *out = quarter;
  return absl::OkStatus();
}

absl::Status UseReturn(bool fail, bool* reached) {
  SY_RETURN_IF_ERROR(fail ? absl::NotFoundError("x") : absl::OkStatus());
  SY_RETURN_IF_ERROR(Half(4));  // a StatusOr works too
  *reached = true;
  return absl::OkStatus();
}

TEST(StatusTest, AssignOrReturnAndReturnIfError) {
  int out = 0;
  EXPECT_TRUE(UseAssign(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(UseAssign(6, &out).code(), absl::StatusCode::kInvalidArgument);  // 3 is odd
  bool reached = false;
  EXPECT_EQ(UseReturn(true, &reached).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(reached);
  EXPECT_TRUE(UseReturn(false, &reached).ok());
  EXPECT_TRUE(reached);
}

TEST(StatusTest, GrpcRoundTripAndAnnotate) {
  const absl::Status s = absl::FailedPreconditionError("job is SUCCEEDED");
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_EQ(Annotate(s, "CancelJob").message(), "CancelJob: job is SUCCEEDED");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace switchyard
