// File: kernels/gemm/grouped_gemm.h
//
// Grouped GEMM for the MoE experts (spec §4.1: fc1 and fc2 of TEGroupedMLP, forward and backward),
// with the group sizes on the DEVICE and no host synchronisation.
//
// Row layout (shared with permute/unpermute): the activation matrices hold their rows grouped by
// expert. Group g owns rows [off_g, off_g + m_g), m_g = tokens_per_group[g], off_g = m_0 + ... +
// m_{g-1}. The buffers have a static row capacity R; rows at or past the total are never read or
// written. Counts are read on the device only: a negative count counts as 0, and a total above R
// is clamped (the groups that overflow lose their tail rows) rather than overrunning the buffers.
//
// Weights are [G, K, N] row-major per group ("x·W" form: fc1 W1 [E, H, 2F], fc2 W2 [E, F, H]).
//
//   Fprop  y_g  = x_g · W_g          x [R, K], w [G, K, N], y [R, N]
//   Dgrad  dx_g = dy_g · W_gᵀ        dy [R, N], w [G, K, N], dx [R, K]
//   Wgrad  dW_g = x_gᵀ · dy_g (+= dW_g when accumulating)      x [R, K], dy [R, N], dw [G, K, N]
//          A group with zero rows gets dW_g = 0 (unchanged when accumulating).
//
// Dtypes. CUDA: x, w, dy bf16; y, dx bf16; dw bf16 or f32 (fp32 grads accumulate in place);
// fp32 accumulation throughout. CPU: the fp64-accumulating reference, inputs f32, f64 or bf16 (all
// inputs the same dtype), outputs any of those. tokens_per_group is int32 [G] on the op's device.
//
// Paths (GroupedGemmPath):
//   kCutlassSm90  CUTLASS 4.2 Hopper grouped GEMM (TMA + wgmma, warp-specialised, persistent),
//                 on compute capability 9.0 devices. A one-block setup kernel writes the per-group
//                 problem shapes, pointers and strides from the device counts; CUTLASS reads them
//                 on the device (its host problem-shape pointer is null). Requires K and N to be
//                 multiples of 8 and 16-byte aligned data pointers (TMA): other shapes get
//                 INVALID_ARGUMENT (use kFallback for them). Tiles (GroupedGemmTile): five
//                 configurations; kAuto picks one by the measured rule ChooseGroupedGemmTile, any
//                 other is used as asked. bf16 dW uses the 128x128 ping-pong tile only.
//   kFallback     a portable tiled SIMT kernel (any CUDA GPU, any shape); also used on non-9.0
//                 devices. Correct, not fast: it exists for portability and for comparison.
//   kCpuReference the CPU path (tensors on the CPU).
#ifndef SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_H_
#define SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_H_

#include <cstdint>
#include <limits>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tensor.h"

namespace switchyard::kernels {

enum class GroupedGemmPath { kAuto, kCpuReference, kCutlassSm90, kFallback };
const char* GroupedGemmPathName(GroupedGemmPath path);

// CUTLASS SM90 kernel configuration: CTA tile M x N x K, cluster shape and schedule (ping-pong:
// two consumer warp groups on two tiles, one's epilogue overlapping the other's mainloop;
// cooperative: both on one tile). All are persistent kernels with the group tile scheduler,
// which rounds a group's tiles up to a multiple of the cluster in M and N. kAuto:
// ChooseGroupedGemmTile. grouped_gemm_sm90.cuh says what each is for.
enum class GroupedGemmTile {
  kAuto,
  kPingpong128x128,     // 128x128x64 ping-pong, cluster 1x1
  kCooperative256x128,  // 256x128x64 cooperative, cluster 1x2
  kCooperative128x128,  // 128x128x64 cooperative, cluster 1x2
  kPingpong64x128,      // 64x128x64 ping-pong, cluster 1x1
  kCooperative128x256,  // 128x256x64 cooperative, cluster 1x1
};
// Every tile but kAuto, in enum order (the benchmarks and tests iterate over it).
inline constexpr GroupedGemmTile kGroupedGemmTiles[] = {
    GroupedGemmTile::kPingpong128x128, GroupedGemmTile::kCooperative256x128,
    GroupedGemmTile::kCooperative128x128, GroupedGemmTile::kPingpong64x128,
    GroupedGemmTile::kCooperative128x256};
// "auto", "pingpong_128x128x64", "cooperative_256x128x64", "cooperative_128x128x64",
// "pingpong_64x128x64", "cooperative_128x256x64".
const char* GroupedGemmTileName(GroupedGemmTile tile);
// The tile whose GroupedGemmTileName is `name` ("auto" included); INVALID_ARGUMENT listing the
// names otherwise.
absl::StatusOr<GroupedGemmTile> ParseGroupedGemmTile(absl::string_view name);

struct GroupedGemmOptions {
  // kAuto: the CPU reference for a CPU device; CUTLASS SM90 on a compute capability 9.0 device;
  // the fallback otherwise. A forced path the device cannot run gets FAILED_PRECONDITION.
  GroupedGemmPath path = GroupedGemmPath::kAuto;
  GroupedGemmTile tile = GroupedGemmTile::kAuto;  // CUTLASS path only
};

namespace internal {

enum class GroupedGemmOp { kFprop, kDgrad, kWgrad };
const char* GroupedGemmOpName(GroupedGemmOp op);

// One validated call as the paths see it (pointers on the op's device):
//   kFprop: a = x [R, K], b = w [G, K, N], out = y [R, N]
//   kDgrad: a = dy [R, N], b = w [G, K, N], out = dx [R, K]
//   kWgrad: a = x [R, K], b = dy [R, N], out = dw [G, K, N]
struct GroupedGemmCall {
  GroupedGemmOp op = GroupedGemmOp::kFprop;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  const int32_t* tokens_per_group = nullptr;
  DType in_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  int64_t rows = 0;  // R, the row capacity
  int64_t k = 0;
  int64_t n = 0;
  int groups = 0;
  bool accumulate = false;
  CUstream_st* cuda_stream = nullptr;  // a cudaStream_t
  GroupedGemmTile tile = GroupedGemmTile::kAuto;
};

// The CUDA paths. Run validates path-specific requirements (alignment) before launching.
class GroupedGemmCudaPath {
 public:
  virtual ~GroupedGemmCudaPath() = default;
  virtual absl::Status Run(const GroupedGemmCall& call) = 0;
};

absl::Status GroupedGemmCpu(const GroupedGemmCall& call);

// grouped_gemm_fallback.cu
absl::StatusOr<std::unique_ptr<GroupedGemmCudaPath>> CreateGroupedGemmFallback(int device,
                                                                               int max_groups);
// grouped_gemm_sm90.cu. Sm90GroupedGemmCompiled(): whether this build holds the CUTLASS kernels.
bool Sm90GroupedGemmCompiled();
absl::StatusOr<std::unique_ptr<GroupedGemmCudaPath>> CreateGroupedGemmSm90(int device,
                                                                           int max_groups);

// One row of the tile rule: `tile` serves `op` when the average rows per group (R / G: the row
// capacity over the groups, as the host knows no per-group counts) is at most
// max_rows_per_group, K is at most max_k and N at most max_n (K and N as in the header comment:
// w [G, K, N]; 0 = no bound). The first matching row wins.
struct GroupedGemmTileRule {
  GroupedGemmOp op;
  int64_t max_rows_per_group;
  int64_t max_k;
  int64_t max_n;
  GroupedGemmTile tile;
};
inline constexpr int64_t kAnyRows = std::numeric_limits<int64_t>::max();

// The measured rule (bench/grouped_gemm_benchmark times every tile on the BASELINES.md and
// train_benchmark shapes; put its winners here, most specific rows first, and keep a catch-all
// row per op last).
//
// Measured on one H100 80GB HBM3 (2026-12-07, `bench_grouped_gemm_benchmark --iters 5`, every
// tile on every shape of the four configs, even and skewed splits; table in bench/README.md):
//   - wgrad with K <= 768 (fc2's dW [F, H] of fine-grained experts): ping-pong 128x128 beats
//     cooperative 256x128 on every such shape: the benchmark model's fc2 (K 384) by 1.37-1.40x
//     (e.g. 443 vs 322 TFLOP/s at 1024 rows per group, 573 vs 418 at 4096), qwen3_30b_a3b's
//     (K 768) by 1.07-1.15x. With K >= 1536 it does not hold (the benchmark model's fc1 at
//     micro-batch 8: 477 vs 581), so the bound stays at what was measured.
//   - dgrad with K <= 384 (fc2's dx [R, F]): ping-pong 128x128 by 1.04-1.20x (484 vs 404 at 1024
//     rows per group); at K 768 (qwen3) it wins the even split and loses the skewed one, so no.
//   - everything else: cooperative 256x128 is the best or within ~10 % of it; where 128x256 or
//     128x128 cooperative win (mixtral's large N, dsv3's dgrad) the margins are 3-12 % and not
//     consistent across the splits, so the catch-all stays the tile the whole-layer runs chose
//     (one H200, 2026-11-22, whole MoE layer fwd+bwd: cooperative 256x128 over ping-pong 128x128
//     on every BASELINES config: dsv3_layer 35.9 vs 39.2 ms, qwen3_30b_a3b 4.76 vs 4.87 ms,
//     mixtral8x7b 29.7 vs 33.6 ms, with one tile for all three ops).
inline constexpr GroupedGemmTileRule kGroupedGemmTileRules[] = {
    {GroupedGemmOp::kWgrad, kAnyRows, 768, 0, GroupedGemmTile::kPingpong128x128},
    {GroupedGemmOp::kDgrad, kAnyRows, 384, 0, GroupedGemmTile::kPingpong128x128},
    {GroupedGemmOp::kFprop, kAnyRows, 0, 0, GroupedGemmTile::kCooperative256x128},
    {GroupedGemmOp::kDgrad, kAnyRows, 0, 0, GroupedGemmTile::kCooperative256x128},
    {GroupedGemmOp::kWgrad, kAnyRows, 0, 0, GroupedGemmTile::kCooperative256x128},
};

// The tile of the first row of `rules` that serves (op, rows / groups, k, n); the 256x128
// cooperative tile when none does. groups < 1 counts as one group.
inline GroupedGemmTile ChooseGroupedGemmTileFrom(absl::Span<const GroupedGemmTileRule> rules,
                                                 GroupedGemmOp op, int64_t rows, int groups,
                                                 int64_t k, int64_t n) {
  const int64_t rows_per_group = rows / (groups > 1 ? groups : 1);
  for (const GroupedGemmTileRule& r : rules) {
    if (r.op == op && rows_per_group <= r.max_rows_per_group && (r.max_k == 0 || k <= r.max_k) &&
        (r.max_n == 0 || n <= r.max_n)) {
      return r.tile;
    }
  }
  return GroupedGemmTile::kCooperative256x128;
}

// The tile kAuto resolves to for `op` over `rows` rows (the capacity R) in `groups` groups with
// w [G, K, N]: kGroupedGemmTileRules.
inline GroupedGemmTile ChooseGroupedGemmTile(GroupedGemmOp op, int64_t rows, int groups, int64_t k,
                                             int64_t n) {
  return ChooseGroupedGemmTileFrom(kGroupedGemmTileRules, op, rows, groups, k, n);
}

}  // namespace internal

// Owns the device argument arrays (problem shapes, pointers, strides: max_groups each) and the
// CUTLASS workspace of the grouped GEMMs on one device, allocated once by Create. The ops are then
// allocation-free and never synchronise with the host; after one warm-up call per (op, G,
// accumulate) they do no host-side setup either, so they can be captured in a CUDA graph.
//
// Threading: use from one thread at a time. Fprop, Dgrad and Wgrad each have their own arrays and
// workspace, so calls of DIFFERENT ops may run concurrently on different streams; calls of the
// SAME op must be ordered (same stream, or synchronised by events).
class GroupedGemm {
 public:
  // `max_groups` in [1, 65535] bounds G of every call.
  static absl::StatusOr<std::unique_ptr<GroupedGemm>> Create(
      Device device, int max_groups, const GroupedGemmOptions& options = {});
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // y_g = x_g · W_g. x [R, K], w [G, K, N], tokens_per_group int32 [G], y [R, N].
  absl::Status Fprop(const Stream& stream, const Tensor& x, const Tensor& w,
                     const Tensor& tokens_per_group, const Tensor& y);
  // dx_g = dy_g · W_gᵀ. dy [R, N], w [G, K, N], tokens_per_group int32 [G], dx [R, K].
  absl::Status Dgrad(const Stream& stream, const Tensor& dy, const Tensor& w,
                     const Tensor& tokens_per_group, const Tensor& dx);
  // dW_g = x_gᵀ · dy_g, or dW_g += x_gᵀ · dy_g when `accumulate`. x [R, K], dy [R, N],
  // tokens_per_group int32 [G], dw [G, K, N] (bf16 or f32 on CUDA). Every dW_g is written (zero
  // for an empty group) unless accumulating.
  absl::Status Wgrad(const Stream& stream, const Tensor& x, const Tensor& dy,
                     const Tensor& tokens_per_group, const Tensor& dw, bool accumulate);

  // Gathered operands (issue 16 item 1; grouped_gemm_gather_sm90.h): an activation operand read
  // through a row index instead of from a permuted copy. A gathered operand is (src [S, C], rows
  // int32 [R]): row p of the operand is src[rows[p]] for p below the counts' total (clamped to R);
  // rows past it, and their index entries, are never read. An empty `rows` (a default Tensor)
  // means src is the permuted operand itself, [R, C]. Same results as the ops above on the
  // gathered copy (y [R, N] and dx [R, K]: rows past the total untouched). Paths: the CPU
  // reference (gathers into a copy, then runs the op above) and CUTLASS SM90 when
  // GatherSupported(K, N); otherwise FAILED_PRECONDITION. Index values are checked on the CPU
  // only (INVALID_ARGUMENT); on CUDA the caller's permutation must be in range.
  bool GatherSupported(int64_t k, int64_t n) const;
  // y_g = x_g · W_g, x = gather(x_src [S, K], x_rows [R]).
  absl::Status FpropGathered(const Stream& stream, const Tensor& x_src, const Tensor& x_rows,
                             const Tensor& w, const Tensor& tokens_per_group, const Tensor& y);
  // dx_g = dy_g · W_gᵀ, dy = gather(dy_src [S, N], dy_rows [R]).
  absl::Status DgradGathered(const Stream& stream, const Tensor& dy_src, const Tensor& dy_rows,
                             const Tensor& w, const Tensor& tokens_per_group, const Tensor& dx);
  // dW_g (+)= x_gᵀ · dy_g with either or both gathered (f32 dw on CUDA).
  absl::Status WgradGathered(const Stream& stream, const Tensor& x_src, const Tensor& x_rows,
                             const Tensor& dy_src, const Tensor& dy_rows,
                             const Tensor& tokens_per_group, const Tensor& dw, bool accumulate);

  Device device() const { return device_; }
  int max_groups() const { return max_groups_; }
  GroupedGemmPath path() const { return path_; }  // never kAuto

 private:
  GroupedGemm(Device device, int max_groups, GroupedGemmPath path, GroupedGemmTile tile,
              std::unique_ptr<internal::GroupedGemmCudaPath> cuda_path);
  // Fprop or Dgrad (`op`): the checks of `a` (x or dy), w and `out` (y or dx), then Run.
  absl::Status RunOnWeights(internal::GroupedGemmOp op, const Stream& stream, const Tensor& a,
                            const Tensor& w, const Tensor& tokens_per_group, const Tensor& out);
  absl::Status Run(const char* what, const Stream& stream, internal::GroupedGemmCall call);
  // What Run and RunGathered check of every call: the stream's device, G against max_groups, K
  // and N positive and R, K, N below 2^31, and the dtypes the path takes.
  absl::Status CheckCall(const char* what, const Stream& stream,
                         const internal::GroupedGemmCall& call) const;
  // The gathered ops: a (Fprop: x, Dgrad: dy, Wgrad: x) and b (Wgrad: dy; else w), each with its
  // rows (empty: not gathered), validated, then the CPU reference or the SM90 gather kernel.
  absl::Status RunGathered(internal::GroupedGemmOp op, const Stream& stream, const Tensor& a_src,
                           const Tensor& a_rows, const Tensor& b_src, const Tensor& b_rows,
                           const Tensor& tokens_per_group, const Tensor& out, bool accumulate);

  Device device_;
  int max_groups_;
  GroupedGemmPath path_;
  GroupedGemmTile tile_;
  std::unique_ptr<internal::GroupedGemmCudaPath> cuda_path_;  // null on the CPU
};

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_GEMM_GROUPED_GEMM_H_
