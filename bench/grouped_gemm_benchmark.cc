// Grouped-GEMM tile sweep (issue 16 item 3): every CUTLASS SM90 tile (kernels/gemm GroupedGemmTile)
// on the expert GEMMs of the BASELINES.md MoE configs and of train_benchmark's benchmark model, on
// one GPU, to measure the rule ChooseGroupedGemmTile should follow. bf16 inputs, fp32
// accumulation, bf16 y and dx, fp32 dW (what the MoE layer runs), random N(0, 1) activations and
// N(0, 0.02) weights. dW is accumulated (dW += xᵀ dy, reading and writing the fp32 buffer) as the
// training step does over its micro-batches, unless --wgrad_accumulate=false: a tile that wins
// with dW overwritten did not win in the step (session 16: ping-pong 128x128 for the benchmark
// model's fc1 dW, 483 vs 440 TFLOP/s overwritten, 44.00 vs 43.34 ms of the step accumulated).
//
// Shapes: rows R = tokens · top-k over E experts (the layer's capacity at EP = 1), split evenly
// (R / E rows per expert) and skewed (sizes spread evenly over [0, 2·R/E] in a fixed shuffled
// order: max/mean ~2, the smallest groups nearly empty). Ops, with w [E, K, N] (grouped_gemm.h):
//   fc1_fprop [R, H] x [H, 2F]    fc2_fprop [R, F] x [F, H]
//   fc1_dgrad [R, 2F] x [H, 2F]ᵀ  fc2_dgrad [R, H] x [F, H]ᵀ
//   fc1_wgrad x [R, H]ᵀ dy [R, 2F] -> fp32 [E, H, 2F]   fc2_wgrad x [R, F]ᵀ dy [R, H] -> fp32 [E,
//   F, H]
// Each (shape, op, tile): --warmup calls, then the median of --iters CUDA-event samples, each a
// batch of back-to-back calls of at least ~1 ms (so the host's launch gaps of sub-millisecond
// calls do not count), divided by the batch. TFLOP/s = 2·R·K·N / time. Prints one row per (shape,
// op): each tile's TFLOP/s, the best tile, and the tile ChooseGroupedGemmTile picks today with its
// fraction of the best; --json PATH writes every row with times. Without a usable GPU it prints a
// FAILED_PRECONDITION message and exits 2. --dry_run prints the plan (group sizes, FLOPs, memory)
// without touching CUDA.
//
//   grouped_gemm_benchmark [--configs a,b] [--tiles t1,t2] [--iters 10] [--warmup 2]
//                          [--json PATH] [--dry_run]
//
// --gather (issue 16 item 1): instead of the sweep, the gathered grouped GEMM
// (kernels/gemm/grouped_gemm_gather_sm90.h) against what the layer runs today, per op, on a
// random top-k routing of the shape's tokens (each token to k distinct experts, uniform; rows of
// an expert in ascending token order, as Permute orders them): `tma` = GroupedGemm (the rule's
// tile) on the permuted copy; `copy` = the row copy that makes that copy (UnpermuteBackward of a
// [T, C] source: the bytes Permute moves); `gather_perm` = the gathered kernel on the permuted
// copy (no index: its mainloop against TMA's); `gather_idx` = the gathered kernel reading the
// unpermuted [T, C] source through the index, for the ops whose operand is a permutation of one
// (fc1_fprop and fc1_wgrad: x; fc2_dgrad and fc2_wgrad: the output gradient). Each gathered
// result is first checked against the TMA kernel on the permuted copy (relative L2, dW
// overwritten) and the check printed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/moe_configs.h"
#include "common/command_line.h"
#include "common/status.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_gather_sm90.h"
#include "kernels/moe/permute.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/cuda_status.h"

ABSL_FLAG(std::string, configs,
          "mixtral8x7b,qwen3_30b_a3b,dsv3_layer,bench_model_mb2,bench_model_mb4,bench_model_mb8",
          "shapes to run");
ABSL_FLAG(std::string, tiles, "",
          "comma-separated GroupedGemmTileNames to time (default: every tile)");
ABSL_FLAG(int, iters, 10, "timed samples per (shape, op, tile); the median is reported");
ABSL_FLAG(int, warmup, 2, "untimed calls per (shape, op, tile) first");
ABSL_FLAG(std::string, json, "", "write every row (times and TFLOP/s per tile) to this file");
ABSL_FLAG(bool, dry_run, false, "print the plan without touching CUDA");
ABSL_FLAG(bool, wgrad_accumulate, true,
          "weight gradients dW += x^T dy into the fp32 buffer, as the training step does over its "
          "micro-batches (false: dW = x^T dy, the single-micro-batch MoE layer benchmark's mode)");
ABSL_FLAG(bool, gather, false,
          "time the gathered grouped GEMM against the permuted copy + the rule's tile, per op, "
          "instead of the tile sweep (see the file comment)");

namespace switchyard::bench {
namespace {

using kernels::Buffer;
using kernels::GroupedGemm;
using kernels::GroupedGemmTile;
using kernels::internal::GroupedGemmOp;
using nlohmann::json;

// One MoE layer's expert GEMMs: T tokens routed to top-k of E experts of hidden H and ffn F.
struct MoeShape {
  std::string name;
  int64_t t, k, e, h, f;
};

// The layer benchmarks' shared table (moe_configs.h): BASELINES.md's three configs, then
// train_benchmark's benchmark model at micro-batch 2, 4 and 8.
const std::vector<MoeShape>& Shapes() {
  static const auto* v = [] {
    auto* s = new std::vector<MoeShape>;
    for (const MoeLayerConfig& c : MoeLayerConfigs()) {
      s->push_back({c.name, c.tokens, c.topk, c.experts, c.hidden, c.ffn});
    }
    return s;
  }();
  return *v;
}

struct OpSpec {
  const char* name;
  GroupedGemmOp op;
  int64_t k, n;  // w [E, K, N]
};

std::vector<OpSpec> Ops(const MoeShape& s) {
  return {{"fc1_fprop", GroupedGemmOp::kFprop, s.h, 2 * s.f},
          {"fc2_fprop", GroupedGemmOp::kFprop, s.f, s.h},
          {"fc1_dgrad", GroupedGemmOp::kDgrad, s.h, 2 * s.f},
          {"fc2_dgrad", GroupedGemmOp::kDgrad, s.f, s.h},
          {"fc1_wgrad", GroupedGemmOp::kWgrad, s.h, 2 * s.f},
          {"fc2_wgrad", GroupedGemmOp::kWgrad, s.f, s.h}};
}

// Rows per expert summing to `rows`: even (rows / e, the remainder one row each to the first
// experts) or skewed (expert i of e gets (i + 1/2) · 2·rows/e² before rounding, i.e. sizes spread
// evenly over [0, 2·mean], rounded by largest remainder, then shuffled with a fixed seed).
std::vector<int32_t> SplitRows(int64_t rows, int64_t e, bool skewed) {
  std::vector<int32_t> counts(e);
  if (!skewed) {
    for (int64_t i = 0; i < e; ++i) counts[i] = static_cast<int32_t>(rows / e + (i < rows % e));
    return counts;
  }
  std::vector<double> exact(e);
  std::vector<std::pair<double, int64_t>> remainders;
  int64_t assigned = 0;
  for (int64_t i = 0; i < e; ++i) {
    exact[i] = (i + 0.5) * 2.0 * static_cast<double>(rows) / (static_cast<double>(e) * e);
    counts[i] = static_cast<int32_t>(std::floor(exact[i]));
    assigned += counts[i];
    remainders.push_back({exact[i] - counts[i], i});
  }
  std::sort(remainders.begin(), remainders.end(), std::greater<>());
  for (int64_t j = 0; assigned < rows; ++j, ++assigned) ++counts[remainders[j % e].second];
  std::mt19937_64 rng(static_cast<uint64_t>(e));
  std::shuffle(counts.begin(), counts.end(), rng);
  return counts;
}

std::string ShortTileName(GroupedGemmTile tile) {
  // pingpong_128x128x64 -> pp128x128, cooperative_256x128x64 -> co256x128 (every K is 64).
  std::string s = kernels::GroupedGemmTileName(tile);
  const std::pair<const char*, const char*> prefixes[] = {{"pingpong_", "pp"},
                                                          {"cooperative_", "co"}};
  for (const auto& [from, to] : prefixes) {
    const std::string f = from;
    if (s.rfind(f, 0) == 0) s = to + s.substr(f.size());
  }
  if (s.size() > 3 && s.compare(s.size() - 3, 3, "x64") == 0) s.resize(s.size() - 3);
  return s;
}

absl::StatusOr<std::vector<GroupedGemmTile>> TilesFlag() {
  const std::string flag = absl::GetFlag(FLAGS_tiles);
  if (flag.empty()) {
    return std::vector<GroupedGemmTile>(std::begin(kernels::kGroupedGemmTiles),
                                        std::end(kernels::kGroupedGemmTiles));
  }
  std::vector<GroupedGemmTile> tiles;
  for (absl::string_view name : absl::StrSplit(flag, ',')) {
    absl::StatusOr<GroupedGemmTile> tile = kernels::ParseGroupedGemmTile(name);
    if (!tile.ok()) return Annotate(tile.status(), "--tiles");
    if (*tile == GroupedGemmTile::kAuto) {
      return absl::InvalidArgumentError("--tiles: auto is not a tile (its pick is printed)");
    }
    tiles.push_back(*tile);
  }
  return tiles;
}

absl::StatusOr<std::vector<MoeShape>> ConfigsFlag() {
  std::vector<MoeShape> shapes;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_configs), ',')) {
    auto it = std::find_if(Shapes().begin(), Shapes().end(),
                           [&](const MoeShape& s) { return name == s.name; });
    if (it == Shapes().end()) {
      std::vector<std::string> names;
      for (const MoeShape& s : Shapes()) names.push_back(s.name);
      return absl::InvalidArgumentError(
          absl::StrCat("--configs: '", name, "' is not one of ", absl::StrJoin(names, ", ")));
    }
    shapes.push_back(*it);
  }
  return shapes;
}

double Flops(const MoeShape& s, const OpSpec& o) { return 2.0 * s.t * s.k * o.k * o.n; }

// Device bytes RunShape holds for `s`: x, dy and the bf16 output [R, max(H, 2F)], w (bf16) and
// dW (f32) [E, H, 2F] (the larger of fc1's and fc2's), and the counts.
double ShapeBytes(const MoeShape& s) {
  const double r = static_cast<double>(s.t * s.k), wide = std::max(s.h, 2 * s.f);
  return 3 * r * wide * 2 + static_cast<double>(s.e) * s.h * 2 * s.f * (2 + 4) + 4.0 * s.e;
}

struct TileTime {
  GroupedGemmTile tile;
  double ms = 0, tflops = 0;
  int batch = 0;
  std::string error;  // non-empty: the tile failed
};

struct Row {
  std::string config, split, op;
  int64_t rows, groups, k, n, min_rows, max_rows;
  double flops;
  std::vector<TileTime> tiles;
  GroupedGemmTile best = GroupedGemmTile::kAuto, rule = GroupedGemmTile::kAuto;
};

// Median ms of one call of `fn`: a first median over --warmup calls sizes the batch (calls per
// CUDA-event sample, at least ~1 ms of work), then the median of --iters samples over the batch.
template <typename Fn>
absl::StatusOr<TileTime> TimeCall(Fn fn, int warmup, int iters) {
  TileTime t;
  SY_ASSIGN_OR_RETURN(const double first, MedianMs(fn, warmup, 3));
  t.batch = static_cast<int>(std::clamp(std::ceil(1.0 / std::max(first, 1e-3)), 1.0, 64.0));
  auto batch = [&]() -> absl::Status {
    for (int i = 0; i < t.batch; ++i) SY_RETURN_IF_ERROR(fn());
    return absl::OkStatus();
  };
  SY_ASSIGN_OR_RETURN(const double ms, MedianMs(batch, 0, iters));
  t.ms = ms / t.batch;
  return t;
}

// Every op of `shape` with its rows split by `counts`, on every tile of `gg`.
absl::StatusOr<std::vector<Row>> RunShape(
    const MoeShape& shape, const std::vector<std::pair<std::string, std::vector<int32_t>>>& splits,
    const std::vector<GroupedGemmTile>& tiles, std::vector<std::unique_ptr<GroupedGemm>>& gg,
    int warmup, int iters) {
  const Device dev = Device::Cuda(0);
  const Stream s{dev, nullptr};
  const int64_t r = shape.t * shape.k, e = shape.e, wide = std::max(shape.h, 2 * shape.f);
  SY_ASSIGN_OR_RETURN(Buffer x, Buffer::ForTensor(DType::kBF16, {r * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dy, Buffer::ForTensor(DType::kBF16, {r * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer out, Buffer::ForTensor(DType::kBF16, {r * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer w, Buffer::ForTensor(DType::kBF16, {e * shape.h * 2 * shape.f}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dw, Buffer::ForTensor(DType::kF32, {e * shape.h * 2 * shape.f}, dev));
  SY_ASSIGN_OR_RETURN(Buffer counts, Buffer::ForTensor(DType::kI32, {e}, dev));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, x.View(), 1, 1.0f));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, dy.View(), 2, 1.0f));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, w.View(), 3, 0.02f));
  SY_RETURN_IF_ERROR(kernels::FillBytes(dw.View(), 0));  // finite values to accumulate into
  const bool accumulate = absl::GetFlag(FLAGS_wgrad_accumulate);
  std::vector<Row> rows;
  for (const auto& [split, host_counts] : splits) {
    std::vector<int32_t> c = host_counts;
    SY_RETURN_IF_ERROR(
        kernels::CopyTensor(Tensor(DType::kI32, {e}, Device::Cpu(), c.data()), counts.View()));
    for (const OpSpec& o : Ops(shape)) {
      Row row{shape.name,
              split,
              o.name,
              r,
              e,
              o.k,
              o.n,
              *std::min_element(c.begin(), c.end()),
              *std::max_element(c.begin(), c.end()),
              Flops(shape, o)};
      row.rule = kernels::internal::ChooseGroupedGemmTile(o.op, r, static_cast<int>(e), o.k, o.n);
      const Tensor w_view = w.View(DType::kBF16, {e, o.k, o.n});
      const Tensor dw_view = dw.View(DType::kF32, {e, o.k, o.n});
      // Fprop: x [R, K] -> out [R, N]; Dgrad: dy [R, N] -> out [R, K]; Wgrad: x, dy -> dW.
      const Tensor x_view = x.View(DType::kBF16, {r, o.k});
      const Tensor dy_view = dy.View(DType::kBF16, {r, o.n});
      const Tensor out_view =
          out.View(DType::kBF16, {r, o.op == GroupedGemmOp::kFprop ? o.n : o.k});
      double best_tflops = 0;
      for (size_t t = 0; t < tiles.size(); ++t) {
        GroupedGemm& g = *gg[t];
        auto call = [&]() -> absl::Status {
          switch (o.op) {
            case GroupedGemmOp::kFprop:
              return g.Fprop(s, x_view, w_view, counts.View(), out_view);
            case GroupedGemmOp::kDgrad:
              return g.Dgrad(s, dy_view, w_view, counts.View(), out_view);
            case GroupedGemmOp::kWgrad:
              return g.Wgrad(s, x_view, dy_view, counts.View(), dw_view, accumulate);
          }
          return absl::InternalError("unknown op");
        };
        absl::StatusOr<TileTime> tt = TimeCall(call, warmup, iters);
        TileTime result{tiles[t]};
        if (tt.ok()) {
          result = *tt;
          result.tile = tiles[t];
          result.tflops = row.flops / result.ms / 1e9;
          if (result.tflops > best_tflops) {
            best_tflops = result.tflops;
            row.best = tiles[t];
          }
        } else {
          result.error = tt.status().ToString();
          // A failed launch may leave a sticky error; a later allocation would then fail too.
          SY_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        }
        row.tiles.push_back(result);
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

json RowJson(const Row& r) {
  json tiles = json::object();
  double best_ms = 0, rule_ms = 0;
  for (const TileTime& t : r.tiles) {
    const std::string name = kernels::GroupedGemmTileName(t.tile);
    if (!t.error.empty()) {
      tiles[name] = {{"error", t.error}};
      continue;
    }
    tiles[name] = {{"ms", t.ms}, {"tflops", t.tflops}, {"calls_per_sample", t.batch}};
    if (t.tile == r.best) best_ms = t.ms;
    if (t.tile == r.rule) rule_ms = t.ms;
  }
  json j = {{"config", r.config},
            {"split", r.split},
            {"op", r.op},
            {"rows", r.rows},
            {"groups", r.groups},
            {"rows_per_group", r.rows / r.groups},
            {"min_group_rows", r.min_rows},
            {"max_group_rows", r.max_rows},
            {"k", r.k},
            {"n", r.n},
            {"flops", r.flops},
            {"tiles", tiles},
            {"best", kernels::GroupedGemmTileName(r.best)},
            {"rule", kernels::GroupedGemmTileName(r.rule)}};
  if (best_ms > 0 && rule_ms > 0) j["rule_fraction_of_best"] = best_ms / rule_ms;
  return j;
}

void PrintHeader(const std::vector<GroupedGemmTile>& tiles) {
  std::printf("%-16s %-6s %-9s %7s %4s %6s %6s", "config", "split", "op", "R", "G", "K", "N");
  for (GroupedGemmTile t : tiles) std::printf(" %9s", ShortTileName(t).c_str());
  std::printf("  %-9s %-9s %s\n", "best", "rule", "rule/best");
}

void PrintRow(const Row& r) {
  std::printf("%-16s %-6s %-9s %7ld %4ld %6ld %6ld", r.config.c_str(), r.split.c_str(),
              r.op.c_str(), static_cast<long>(r.rows), static_cast<long>(r.groups),
              static_cast<long>(r.k), static_cast<long>(r.n));
  double best = 0, rule = 0;
  for (const TileTime& t : r.tiles) {
    if (t.error.empty()) {
      std::printf(" %9.0f", t.tflops);
    } else {
      std::printf(" %9s", "FAIL");
    }
    if (t.tile == r.best) best = t.tflops;
    if (t.tile == r.rule && t.error.empty()) rule = t.tflops;
  }
  const std::string best_name =
      r.best == GroupedGemmTile::kAuto ? std::string("-") : ShortTileName(r.best);
  if (rule > 0 && best > 0) {
    std::printf("  %-9s %-9s %.3f\n", best_name.c_str(), ShortTileName(r.rule).c_str(),
                rule / best);
  } else {
    std::printf("  %-9s %-9s %s\n", best_name.c_str(), ShortTileName(r.rule).c_str(), "-");
  }
  std::fflush(stdout);
}

using Splits = std::vector<std::pair<std::string, std::vector<int32_t>>>;

Splits MakeSplits(const MoeShape& s) {
  return {{"even", SplitRows(s.t * s.k, s.e, false)}, {"skewed", SplitRows(s.t * s.k, s.e, true)}};
}

// --dry_run: the plan, checked (every split sums to R with no negative group), without CUDA.
int DryRun(const std::vector<MoeShape>& shapes, const std::vector<GroupedGemmTile>& tiles) {
  int rc = 0;
  double total_flops = 0, gpu_s = 0;
  const int warmup = absl::GetFlag(FLAGS_warmup), iters = absl::GetFlag(FLAGS_iters);
  std::vector<std::string> names;
  for (GroupedGemmTile t : tiles) names.push_back(kernels::GroupedGemmTileName(t));
  std::printf("grouped_gemm_benchmark --dry_run: tiles %s; %d warm-up + %d timed samples each\n",
              absl::StrJoin(names, ", ").c_str(), warmup, iters);
  for (const MoeShape& s : shapes) {
    const int64_t r = s.t * s.k;
    for (const auto& [split, c] : MakeSplits(s)) {
      const int64_t sum = std::accumulate(c.begin(), c.end(), int64_t{0});
      const int32_t lo = *std::min_element(c.begin(), c.end());
      const int32_t hi = *std::max_element(c.begin(), c.end());
      const bool ok = sum == r && lo >= 0 && static_cast<int64_t>(c.size()) == s.e;
      std::printf(
          "%-16s %-6s R=%ld G=%ld rows per group %d..%d (mean %ld)%s; device memory %.1f GB\n",
          s.name.c_str(), split.c_str(), static_cast<long>(r), static_cast<long>(s.e), lo, hi,
          static_cast<long>(r / s.e), ok ? "" : " BAD SPLIT", ShapeBytes(s) / 1e9);
      if (!ok) rc = 1;
      for (const OpSpec& o : Ops(s)) {
        total_flops += Flops(s, o);
        // At a nominal 400 TFLOP/s: warm-up and sizing calls, then samples of at least ~1 ms.
        const double call_s = Flops(s, o) / 400e12;
        gpu_s += tiles.size() * ((warmup + 3) * call_s + iters * std::max(call_s, 1e-3));
        std::printf("    %-9s K=%-6ld N=%-6ld %.3f TFLOP, rule picks %s\n", o.name,
                    static_cast<long>(o.k), static_cast<long>(o.n), Flops(s, o) / 1e12,
                    kernels::GroupedGemmTileName(kernels::internal::ChooseGroupedGemmTile(
                        o.op, r, static_cast<int>(s.e), o.k, o.n)));
      }
    }
  }
  std::printf(
      "total %.1f TFLOP per tile; ~%.0f s on the GPU at a nominal 400 TFLOP/s for %zu tiles\n",
      total_flops / 1e12, gpu_s, tiles.size());
  return rc;
}

// --gather: one row per op.
struct GatherRow {
  std::string config, op;
  double flops = 0;
  double tma_ms = 0, copy_ms = 0, gather_perm_ms = 0, gather_idx_ms = 0;  // 0: not applicable
  double check_err = -1;  // relative L2 of the gathered result against tma's (-1: not checked)
};

// Relative L2 distance of two device tensors of one shape (bf16 or f32), on the host.
absl::StatusOr<double> DeviceRelL2(const Tensor& a, const Tensor& b) {
  std::vector<float> ha(a.numel()), hb(b.numel());
  for (auto [t, h] : {std::pair<const Tensor*, std::vector<float>*>{&a, &ha}, {&b, &hb}}) {
    Buffer f32 = Buffer::ForTensor(DType::kF32, t->shape, Device::Cpu()).value();
    if (t->dtype == DType::kF32) {
      SY_RETURN_IF_ERROR(kernels::CopyTensor(*t, f32.View()));
    } else {
      std::vector<BF16> raw(t->numel());
      SY_RETURN_IF_ERROR(
          kernels::CopyTensor(*t, Tensor(DType::kBF16, t->shape, Device::Cpu(), raw.data())));
      float* o = static_cast<float*>(f32.data());
      for (size_t i = 0; i < raw.size(); ++i) o[i] = raw[i].ToFloat();
    }
    std::memcpy(h->data(), f32.data(), h->size() * sizeof(float));
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < ha.size(); ++i) {
    num += (double(ha[i]) - hb[i]) * (double(ha[i]) - hb[i]);
    den += double(hb[i]) * hb[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

absl::StatusOr<std::vector<GatherRow>> RunGatherShape(const MoeShape& shape, GroupedGemm& gg,
                                                      int warmup, int iters) {
  const Device dev = Device::Cuda(0);
  const Stream s{dev, nullptr};
  const int64_t t = shape.t, topk = shape.k, e = shape.e, r = t * topk;
  const int64_t wide = std::max(shape.h, 2 * shape.f);
  // The routing: k distinct experts per token; expert-major rows, ascending tokens inside.
  std::mt19937_64 rng(1234);
  std::vector<std::vector<int32_t>> expert_tokens(e);
  std::vector<int64_t> pick(e);
  std::iota(pick.begin(), pick.end(), 0);
  std::vector<std::vector<int64_t>> token_experts(t);
  for (int64_t tok = 0; tok < t; ++tok) {
    for (int64_t j = 0; j < topk; ++j) {  // partial Fisher-Yates: k distinct experts
      std::uniform_int_distribution<int64_t> d(j, e - 1);
      std::swap(pick[j], pick[d(rng)]);
      expert_tokens[pick[j]].push_back(static_cast<int32_t>(tok));
      token_experts[tok].push_back(pick[j]);
    }
  }
  std::vector<int32_t> counts(e), index(r), row_map(r);
  std::vector<int64_t> first(e);
  for (int64_t g = 0, p = 0; g < e; ++g) {
    counts[g] = static_cast<int32_t>(expert_tokens[g].size());
    first[g] = p;
    for (int32_t tok : expert_tokens[g]) index[p++] = tok;
  }
  std::vector<int64_t> next = first;
  for (int64_t tok = 0; tok < t; ++tok) {
    for (int64_t j = 0; j < topk; ++j) {
      row_map[tok * topk + j] = static_cast<int32_t>(next[token_experts[tok][j]]++);
    }
  }
  SY_ASSIGN_OR_RETURN(Buffer src_x, Buffer::ForTensor(DType::kBF16, {t * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer src_dy, Buffer::ForTensor(DType::kBF16, {t * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer x_perm, Buffer::ForTensor(DType::kBF16, {r * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dy_perm, Buffer::ForTensor(DType::kBF16, {r * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer out, Buffer::ForTensor(DType::kBF16, {r * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer out2, Buffer::ForTensor(DType::kBF16, {r * wide}, dev));
  SY_ASSIGN_OR_RETURN(Buffer w, Buffer::ForTensor(DType::kBF16, {e * shape.h * 2 * shape.f}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dw, Buffer::ForTensor(DType::kF32, {e * shape.h * 2 * shape.f}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dw2, Buffer::ForTensor(DType::kF32, {e * shape.h * 2 * shape.f}, dev));
  SY_ASSIGN_OR_RETURN(Buffer d_counts, Buffer::ForTensor(DType::kI32, {e}, dev));
  SY_ASSIGN_OR_RETURN(Buffer d_index, Buffer::ForTensor(DType::kI32, {r}, dev));
  SY_ASSIGN_OR_RETURN(Buffer d_row_map, Buffer::ForTensor(DType::kI32, {t, topk}, dev));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, src_x.View(), 1, 1.0f));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, src_dy.View(), 2, 1.0f));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, w.View(), 3, 0.02f));
  SY_RETURN_IF_ERROR(kernels::FillBytes(dw.View(), 0));
  SY_RETURN_IF_ERROR(
      kernels::CopyTensor(Tensor(DType::kI32, {e}, Device::Cpu(), counts.data()), d_counts.View()));
  SY_RETURN_IF_ERROR(
      kernels::CopyTensor(Tensor(DType::kI32, {r}, Device::Cpu(), index.data()), d_index.View()));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(
      Tensor(DType::kI32, {t, topk}, Device::Cpu(), row_map.data()), d_row_map.View()));
  const bool accumulate = absl::GetFlag(FLAGS_wgrad_accumulate);
  const int32_t* idx = static_cast<const int32_t*>(d_index.data());

  std::vector<GatherRow> rows;
  for (const OpSpec& o : Ops(shape)) {
    GatherRow row{shape.name, o.name, Flops(shape, o)};
    const bool fc1 = o.k == shape.h;
    // The operand that is a permutation of a [T, C] source, if any: fc1's x (A, C = H) in fprop
    // and wgrad; fc2's output gradient (C = H) in dgrad (A) and wgrad (B).
    const bool gather_a =
        (fc1 && o.op != GroupedGemmOp::kDgrad) || (!fc1 && o.op == GroupedGemmOp::kDgrad);
    const bool gather_b = !fc1 && o.op == GroupedGemmOp::kWgrad;
    const int64_t a_cols = o.op == GroupedGemmOp::kDgrad ? o.n : o.k;
    const int64_t out_cols = o.op == GroupedGemmOp::kFprop ? o.n : o.k;
    const Tensor src_a = (gather_a && fc1 ? src_x : src_dy).View(DType::kBF16, {t, a_cols});
    const Tensor src_b = src_dy.View(DType::kBF16, {t, o.n});
    const Tensor a_perm = x_perm.View(DType::kBF16, {r, a_cols});
    const Tensor b_perm = dy_perm.View(DType::kBF16, {r, o.n});
    // The permuted copies, made as the layer makes them.
    SY_RETURN_IF_ERROR(kernels::UnpermuteBackward(s, src_a, d_row_map.View(), a_perm, false));
    SY_RETURN_IF_ERROR(kernels::UnpermuteBackward(s, src_b, d_row_map.View(), b_perm, false));
    const Tensor w_view = w.View(DType::kBF16, {e, o.k, o.n});
    const Tensor out_view = out.View(DType::kBF16, {r, out_cols});
    const Tensor out2_view = out2.View(DType::kBF16, {r, out_cols});
    const Tensor dw_view = dw.View(DType::kF32, {e, o.k, o.n});
    const Tensor dw2_view = dw2.View(DType::kF32, {e, o.k, o.n});
    auto tma = [&](bool acc) -> absl::Status {
      switch (o.op) {
        case GroupedGemmOp::kFprop:
          return gg.Fprop(s, a_perm, w_view, d_counts.View(), out_view);
        case GroupedGemmOp::kDgrad:
          return gg.Dgrad(s, a_perm, w_view, d_counts.View(), out_view);
        case GroupedGemmOp::kWgrad:
          return gg.Wgrad(s, a_perm, b_perm, d_counts.View(), dw_view, acc);
      }
      return absl::InternalError("unknown op");
    };
    auto gathered = [&](bool use_index, bool acc, bool second_out) -> absl::Status {
      kernels::internal::GatherGemmCall c;
      c.op = o.op;
      c.a = use_index && gather_a ? src_a.data : a_perm.data;
      c.a_index = use_index && gather_a ? idx : nullptr;
      c.b = o.op == GroupedGemmOp::kWgrad ? (use_index && gather_b ? src_b.data : b_perm.data)
                                          : w_view.data;
      c.b_index = use_index && gather_b ? idx : nullptr;
      c.out_dtype = o.op == GroupedGemmOp::kWgrad ? DType::kF32 : DType::kBF16;
      c.out = o.op == GroupedGemmOp::kWgrad ? (second_out ? dw2_view.data : dw_view.data)
                                            : (second_out ? out2_view.data : out_view.data);
      c.tokens_per_group = static_cast<const int32_t*>(d_counts.data());
      c.rows = r;
      c.k = o.k;
      c.n = o.n;
      c.groups = static_cast<int>(e);
      c.accumulate = acc;
      return kernels::internal::RunGatherGemmSm90(c);
    };
    // Check: the gathered kernel (through the index where it applies) against TMA, dW fresh.
    SY_RETURN_IF_ERROR(tma(false));
    SY_RETURN_IF_ERROR(gathered(gather_a || gather_b, false, true));
    SY_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    if (o.op == GroupedGemmOp::kWgrad) {
      SY_ASSIGN_OR_RETURN(row.check_err, DeviceRelL2(dw2_view, dw_view));
    } else {
      SY_ASSIGN_OR_RETURN(row.check_err, DeviceRelL2(out2_view, out_view));
    }
    SY_ASSIGN_OR_RETURN(TileTime tt, TimeCall([&] { return tma(accumulate); }, warmup, iters));
    row.tma_ms = tt.ms;
    SY_ASSIGN_OR_RETURN(
        tt, TimeCall([&] { return gathered(false, accumulate, false); }, warmup, iters));
    row.gather_perm_ms = tt.ms;
    if (gather_a || gather_b) {
      const Tensor src = gather_b ? src_b : src_a;
      const Tensor dst = gather_b ? b_perm : a_perm;
      SY_ASSIGN_OR_RETURN(
          tt,
          TimeCall([&] { return kernels::UnpermuteBackward(s, src, d_row_map.View(), dst, false); },
                   warmup, iters));
      row.copy_ms = tt.ms;
      SY_ASSIGN_OR_RETURN(
          tt, TimeCall([&] { return gathered(true, accumulate, false); }, warmup, iters));
      row.gather_idx_ms = tt.ms;
    }
    rows.push_back(row);
  }
  return rows;
}

int GatherMain(const std::vector<MoeShape>& shapes, int warmup, int iters, const char* device) {
  int64_t max_groups = 1;
  for (const MoeShape& s : shapes) max_groups = std::max(max_groups, s.e);
  absl::StatusOr<std::unique_ptr<GroupedGemm>> gg =
      GroupedGemm::Create(Device::Cuda(0), static_cast<int>(max_groups));
  if (!gg.ok()) {
    std::fprintf(stderr, "grouped_gemm_benchmark: %s\n", gg.status().ToString().c_str());
    return 2;
  }
  std::printf(
      "device: %s; gathered grouped GEMM vs permuted copy + rule tile; fp32 dW %s; median of %d "
      "samples after %d warm-ups\n",
      device, absl::GetFlag(FLAGS_wgrad_accumulate) ? "+=" : "=", iters, warmup);
  std::printf("%-16s %-10s %9s %9s %9s %11s %10s %8s %8s %9s\n", "config", "op", "tma ms",
              "copy ms", "g.perm ms", "g.index ms", "tma TF/s", "g.idx TF", "fused/", "check");
  std::printf("%-16s %-10s %9s %9s %9s %11s %10s %8s %8s %9s\n", "", "", "", "", "", "", "", "",
              "unfused", "rel L2");
  int rc = 0;
  for (const MoeShape& s : shapes) {
    absl::StatusOr<std::vector<GatherRow>> rows = RunGatherShape(s, **gg, warmup, iters);
    if (!rows.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name.c_str(), rows.status().ToString().c_str());
      rc = 1;
      continue;
    }
    for (const GatherRow& r : *rows) {
      const bool idx = r.gather_idx_ms > 0;
      std::printf("%-16s %-10s %9.3f %9.3f %9.3f %11.3f %10.0f %8.0f %8.3f %9.2g\n",
                  r.config.c_str(), r.op.c_str(), r.tma_ms, r.copy_ms, r.gather_perm_ms,
                  r.gather_idx_ms, r.flops / r.tma_ms / 1e9,
                  idx ? r.flops / r.gather_idx_ms / 1e9 : r.flops / r.gather_perm_ms / 1e9,
                  idx ? r.gather_idx_ms / (r.tma_ms + r.copy_ms) : r.gather_perm_ms / r.tma_ms,
                  r.check_err);
      if (!(r.check_err >= 0 && r.check_err < 1e-2)) {
        std::fprintf(stderr, "%s %s: gathered result differs from TMA's (rel L2 %g)\n",
                     r.config.c_str(), r.op.c_str(), r.check_err);
        rc = 1;
      }
    }
  }
  return rc;
}

int Main() {
  absl::StatusOr<std::vector<MoeShape>> shapes = ConfigsFlag();
  absl::StatusOr<std::vector<GroupedGemmTile>> tiles = TilesFlag();
  for (const absl::Status& st : {shapes.status(), tiles.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "grouped_gemm_benchmark: %s\n", st.ToString().c_str());
      return 2;
    }
  }
  const int warmup = absl::GetFlag(FLAGS_warmup), iters = absl::GetFlag(FLAGS_iters);
  if (warmup < 1 || iters < 1) {
    std::fprintf(stderr,
                 "grouped_gemm_benchmark: INVALID_ARGUMENT: --warmup (%d) and --iters "
                 "(%d) must be at least 1\n",
                 warmup, iters);
    return 2;
  }
  if (absl::GetFlag(FLAGS_dry_run)) return DryRun(*shapes, *tiles);

  int devices = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&devices);
  cudaDeviceProp prop;
  if (count_err != cudaSuccess || devices == 0 ||
      cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr,
                 "grouped_gemm_benchmark: FAILED_PRECONDITION: needs a CUDA device (%s); "
                 "--dry_run prints the plan without one\n",
                 count_err != cudaSuccess ? cudaGetErrorString(count_err) : "none found");
    return 2;
  }
  if (absl::GetFlag(FLAGS_gather)) return GatherMain(*shapes, warmup, iters, prop.name);
  std::vector<std::unique_ptr<GroupedGemm>> gg;
  int64_t max_groups = 1;
  for (const MoeShape& s : *shapes) max_groups = std::max(max_groups, s.e);
  for (GroupedGemmTile t : *tiles) {
    kernels::GroupedGemmOptions options;
    options.path = kernels::GroupedGemmPath::kCutlassSm90;
    options.tile = t;
    absl::StatusOr<std::unique_ptr<GroupedGemm>> g =
        GroupedGemm::Create(Device::Cuda(0), static_cast<int>(max_groups), options);
    if (!g.ok()) {
      // FAILED_PRECONDITION from Create when the GPU is not compute capability 9.0.
      std::fprintf(stderr, "grouped_gemm_benchmark: %s (%s)\n", g.status().ToString().c_str(),
                   prop.name);
      return 2;
    }
    gg.push_back(std::move(*g));
  }
  std::printf(
      "device: %s; grouped GEMM bf16 -> bf16 y/dx, fp32 dW %s; median of %d samples after %d "
      "warm-ups; TFLOP/s per tile\n",
      prop.name, absl::GetFlag(FLAGS_wgrad_accumulate) ? "+= (accumulated)" : "= (overwritten)",
      iters, warmup);
  PrintHeader(*tiles);
  const absl::Time start = absl::Now();
  std::vector<Row> rows;
  int rc = 0;
  for (const MoeShape& s : *shapes) {
    absl::StatusOr<std::vector<Row>> shape_rows =
        RunShape(s, MakeSplits(s), *tiles, gg, warmup, iters);
    if (!shape_rows.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name.c_str(), shape_rows.status().ToString().c_str());
      rc = 1;
      continue;
    }
    for (Row& r : *shape_rows) {
      PrintRow(r);
      for (const TileTime& t : r.tiles) {
        if (!t.error.empty()) {
          std::fprintf(stderr, "%s %s %s %s: %s\n", r.config.c_str(), r.split.c_str(), r.op.c_str(),
                       kernels::GroupedGemmTileName(t.tile), t.error.c_str());
          rc = 1;
        }
      }
      rows.push_back(std::move(r));
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("%zu rows in %.1f s\n", rows.size(), seconds);
  const std::string path = absl::GetFlag(FLAGS_json);
  if (!path.empty()) {
    json j = {
        {"bench", "grouped_gemm"}, {"device", prop.name},
        {"iters", iters},          {"wgrad_accumulate", absl::GetFlag(FLAGS_wgrad_accumulate)},
        {"warmup", warmup},        {"seconds", seconds},
        {"rows", json::array()}};
    for (const Row& r : rows) j["rows"].push_back(RowJson(r));
    std::ofstream f(path);
    f << j.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "grouped_gemm_benchmark: could not write --json %s\n", path.c_str());
      rc = 1;
    }
  }
  return rc;
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Grouped-GEMM tile sweep: every CUTLASS SM90 tile on the MoE expert GEMMs of the "
      "BASELINES.md configs and the benchmark model, one GPU; prints TFLOP/s per tile per (shape, "
      "op) and the best (bench/README.md).");
  switchyard::ParseCommandLine(argc, argv);
  return switchyard::bench::Main();
}
