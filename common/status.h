// File: common/status.h
//
// One error currency: absl::Status / absl::StatusOr above the kernels. Errors from CUDA, cuBLAS,
// NCCL, gRPC and SQLite are converted once, at the edge, by the macros below, which keep the
// text of the failing expression:
//
//   SY_RETURN_IF_ERROR(LoadConfig(path, &spec));
//   SY_ASSIGN_OR_RETURN(auto plan, planner.Plan(spec));
//   SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
//   SY_NCCL_RETURN_IF_ERROR(ncclAllReduce(...));
//
// Our Abseil (20220623) has no status macros, so the project keeps this one pair. CUDA, cuBLAS and
// NCCL converters live in kernels/runtime/cuda_status.h and the gRPC ones in common/grpc_status.h,
// so that a target pays only for the libraries it uses.
#ifndef SWITCHYARD_COMMON_STATUS_H_
#define SWITCHYARD_COMMON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace switchyard {

// Prefixes `status`'s message with `context` ("context: message"), keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

namespace status_internal {
inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace status_internal

}  // namespace switchyard

#define SY_STATUS_CONCAT_INNER_(a, b) a##b
#define SY_STATUS_CONCAT_(a, b) SY_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status or StatusOr) is not OK.
#define SY_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                \
    const auto& sy_status_ = (expr);                                                  \
    if (!sy_status_.ok()) return ::switchyard::status_internal::AsStatus(sy_status_); \
  } while (0)

// `SY_ASSIGN_OR_RETURN(lhs, rexpr)`: evaluates `rexpr` (a StatusOr<T>); on error returns its
// status, otherwise move-assigns the value to `lhs` (which may be a declaration: `auto x`).
#define SY_ASSIGN_OR_RETURN(lhs, rexpr) \
  SY_ASSIGN_OR_RETURN_IMPL_(SY_STATUS_CONCAT_(sy_statusor_, __LINE__), lhs, rexpr)
#define SY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)    \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

// Builds an error status whose message says which expression failed and where.
#define SY_EXPR_ERROR_(code, expr_text, detail)                                              \
  absl::Status((code), absl::StrCat((expr_text), " failed: ", (detail), " [", __FILE__, ":", \
                                    __LINE__, "]"))

#endif  // SWITCHYARD_COMMON_STATUS_H_
