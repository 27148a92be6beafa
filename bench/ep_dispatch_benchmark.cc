// Expert-parallel dispatch benchmark: the alltoall token dispatcher (worker/model/
// alltoall_dispatcher.h) over EP = 2 or 4 GPUs of one host, one forked process per GPU, NCCL
// rendezvous through a FileKvStore in a fresh temporary directory. For each config (H, E, k and
// tokens per GPU of bench/moe_layer_benchmark.cc / BASELINES.md), bf16 activations and fp32 probs,
// uniformly random top-k routing (k distinct experts per token), it times with CUDA events on the
// dispatcher's stream, median over --iters after --warmup:
//   dispatch   the Dispatch phase (count all-gather, the one D2H split copy + sync, the all-to-alls
//              of the token rows and of their routing rows: each token once per destination rank)
//   combine    the Combine phase (the all-to-all of the per-token partial sums back)
//   6 phases   DispatchPreprocess .. CombinePostprocess (no expert compute: expert_out is zeros)
// and, for comparison, a plain NcclCommunicator::AllToAllV moving the SAME bytes per peer (rows +
// routing rows for dispatch, rows for combine) on the same communicator: the "NCCL all-to-all peak
// for the same bytes". Bandwidth = bytes this rank sends to OTHER ranks / time, averaged over
// ranks, with each rank's median time and the SLOWEST rank's time used (a phase ends when the last
// rank is done). "slot MB" is what a per-(token, expert) dispatch (Megatron's alltoall) would send
// to other ranks for the same routing (H bf16 + one f32 prob per slot): the deduplication's saving.
// Prints a table and one JSON line (prefix "JSON ").
//
//   ep_dispatch_benchmark --ep 2|4 [--configs qwen3_30b_a3b,dsv3_layer] [--iters 20] [--warmup 5]
//                         [--dry_run]
// --dry_run validates the arguments and prints the plan (shapes, expected bytes) without a GPU.
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "common/command_line.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/cuda_status.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/model/alltoall_dispatcher.h"

ABSL_FLAG(int, ep, 2, "expert-parallel size: 2 or 4 (one GPU per rank)");
ABSL_FLAG(std::string, configs, "qwen3_30b_a3b,dsv3_layer", "configs to run");
ABSL_FLAG(int, iters, 20, "timed iterations (median reported)");
ABSL_FLAG(int, warmup, 5, "warm-up iterations");
ABSL_FLAG(bool, dry_run, false, "validate the arguments and print the plan; no GPU needed");

namespace switchyard::bench {
namespace {

using kernels::Buffer;
using nlohmann::json;

struct EpConfig {
  int64_t h, e, k, t;  // hidden, experts, top-k, tokens per GPU
};

// H, E, k and tokens per GPU of bench/moe_layer_benchmark.cc (BASELINES.md).
const std::map<std::string, EpConfig>& Configs() {
  static const auto* m = new std::map<std::string, EpConfig>{
      {"qwen3_30b_a3b", {2048, 128, 8, 8192}},
      {"dsv3_layer", {7168, 256, 8, 4096}},
  };
  return *m;
}

struct Args {
  int ep = 2, iters = 20, warmup = 5;
  std::vector<std::string> configs;
};

absl::StatusOr<Args> ParseArgs() {
  Args a;
  a.ep = absl::GetFlag(FLAGS_ep);
  a.iters = absl::GetFlag(FLAGS_iters);
  a.warmup = absl::GetFlag(FLAGS_warmup);
  if (a.ep != 2 && a.ep != 4) {
    return absl::InvalidArgumentError(absl::StrCat("--ep (", a.ep, ") must be 2 or 4"));
  }
  if (a.iters < 1) return absl::InvalidArgumentError("--iters must be >= 1");
  if (a.warmup < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_configs), ',')) {
    if (name.empty()) continue;
    const auto it = Configs().find(std::string(name));
    if (it == Configs().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--configs: unknown config '", name, "' (qwen3_30b_a3b, dsv3_layer)"));
    }
    if (it->second.e % a.ep != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--configs: ", name, " has E = ", it->second.e,
                                                     ", not divisible by --ep ", a.ep));
    }
    a.configs.push_back(std::string(name));
  }
  if (a.configs.empty()) return absl::InvalidArgumentError("--configs must name a config");
  return a;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One rank's measurements of one config.
struct RankResult {
  double dispatch_ms = 0, combine_ms = 0, total_ms = 0, nccl_dispatch_ms = 0, nccl_combine_ms = 0;
  int64_t dispatch_bytes_off = 0, combine_bytes_off = 0;  // sent to other ranks
  int64_t slot_bytes_off = 0;  // what a per-slot dispatch would send to other ranks
};

// k distinct uniformly random experts per token, probs in (0, 1); x uniform in [-1, 1) (bf16).
void MakeInputs(const EpConfig& c, uint64_t seed, std::vector<BF16>* x, std::vector<int32_t>* idx,
                std::vector<float>* probs) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  x->resize(c.t * c.h);
  for (BF16& v : *x) v = BF16::FromFloat(2.0f * unit(rng) - 1.0f);
  idx->resize(c.t * c.k);
  probs->resize(c.t * c.k);
  std::vector<int32_t> perm(c.e);
  for (int64_t t = 0; t < c.t; ++t) {
    for (int32_t e = 0; e < c.e; ++e) perm[e] = e;
    for (int64_t s = 0; s < c.k; ++s) {  // partial Fisher-Yates
      std::uniform_int_distribution<int64_t> pick(s, c.e - 1);
      std::swap(perm[s], perm[pick(rng)]);
      (*idx)[t * c.k + s] = perm[s];
      (*probs)[t * c.k + s] = 0.05f + 0.95f * unit(rng);
    }
  }
}

absl::StatusOr<Buffer> Upload(DType dtype, std::vector<int64_t> shape, const void* host, int dev) {
  SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(dtype, std::move(shape), Device::Cuda(dev)));
  SY_CUDA_RETURN_IF_ERROR(cudaMemcpy(b.data(), host, b.bytes(), cudaMemcpyHostToDevice));
  // A pageable H2D cudaMemcpy may return before the DMA lands; the phases run on another stream.
  SY_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return b;
}

// Times the dispatcher and the plain NCCL all-to-all of the same bytes for config `c` on `rank`.
absl::StatusOr<RankResult> RunConfig(comm::NcclCommunicator& comm, cudaStream_t cs, int rank,
                                     const EpConfig& c, const Args& a) {
  const int ep = comm.size();
  const Device dev = Device::Cuda(rank);
  const Stream stream{dev, cs};
  std::vector<BF16> hx;
  std::vector<int32_t> hidx;
  std::vector<float> hprobs;
  MakeInputs(c, 1234 + rank, &hx, &hidx, &hprobs);
  SY_ASSIGN_OR_RETURN(Buffer x, Upload(DType::kBF16, {c.t, c.h}, hx.data(), rank));
  SY_ASSIGN_OR_RETURN(Buffer idx, Upload(DType::kI32, {c.t, c.k}, hidx.data(), rank));
  SY_ASSIGN_OR_RETURN(Buffer probs, Upload(DType::kF32, {c.t, c.k}, hprobs.data(), rank));
  SY_ASSIGN_OR_RETURN(Buffer out, Buffer::ForTensor(DType::kBF16, {c.t, c.h}, dev));
  SY_ASSIGN_OR_RETURN(
      std::unique_ptr<model::AllToAllDispatcher> d,
      model::AllToAllDispatcher::Create(&comm, dev, DType::kBF16, DType::kF32, c.t, c.h,
                                        static_cast<int>(c.e), ep, static_cast<int>(c.k)));

  cudaEvent_t ev[6];
  for (cudaEvent_t& e : ev) SY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  auto elapsed = [&](int i, int j) -> absl::StatusOr<double> {
    float ms = 0;
    SY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev[i], ev[j]));
    return static_cast<double>(ms);
  };
  std::vector<double> dispatch, combine, total;
  // The expert side the zeros were written to: the alltoall dispatcher's expert buffers follow
  // the counts and may be reallocated by Dispatch (alltoall_dispatcher.h, "Receive buffers").
  void* zeroed = nullptr;
  for (int it = 0; it < a.warmup + a.iters; ++it) {
    model::DispatchState st;
    st.x = x.View();
    st.topk_idx = idx.View();
    st.topk_probs = probs.View();
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[0], cs));
    SY_RETURN_IF_ERROR(d->DispatchPreprocess(stream, &st));
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[1], cs));
    SY_RETURN_IF_ERROR(d->Dispatch(stream, &st));
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2], cs));
    SY_RETURN_IF_ERROR(d->DispatchPostprocess(stream, &st));
    if (st.expert_out.data != zeroed) {  // no expert compute: the experts' output is zeros
      SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(st.expert_out.data, 0, st.expert_out.bytes(), cs));
      zeroed = st.expert_out.data;
    }
    SY_RETURN_IF_ERROR(d->CombinePreprocess(stream, &st));
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[3], cs));
    SY_RETURN_IF_ERROR(d->Combine(stream, &st));
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[4], cs));
    SY_RETURN_IF_ERROR(d->CombinePostprocess(stream, &st, out.View()));
    SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[5], cs));
    // The collectives return once enqueued: a bounded wait (a stuck peer fails, never hangs).
    SY_RETURN_IF_ERROR(comm::WaitEvent(comm, ev[5], "ep_dispatch_benchmark dispatcher iteration"));
    if (it < a.warmup) continue;
    SY_ASSIGN_OR_RETURN(double dm, elapsed(1, 2));
    SY_ASSIGN_OR_RETURN(double cm, elapsed(3, 4));
    SY_ASSIGN_OR_RETURN(double tm, elapsed(0, 5));
    dispatch.push_back(dm);
    combine.push_back(cm);
    total.push_back(tm);
  }

  // The same bytes per peer through one plain AllToAllV (bf16 elements): dispatch moves H bf16 +
  // the routing row (2k f32 = 4k bf16 elements) per token row, combine H bf16 per row.
  const std::vector<int64_t>& in_rows = d->input_splits();
  const std::vector<int64_t>& out_rows = d->output_splits();
  RankResult r;
  const int64_t local = c.e / ep;
  for (int32_t e : hidx) {
    if (e >= 0 && e / local != rank) r.slot_bytes_off += (c.h + 2) * 2;
  }
  std::vector<int64_t> send_d(ep), recv_d(ep), send_c(ep), recv_c(ep);
  int64_t sent_d = 0, recv_dn = 0, sent_c = 0, recv_cn = 0;
  for (int j = 0; j < ep; ++j) {
    send_d[j] = in_rows[j] * (c.h + 4 * c.k);
    recv_d[j] = out_rows[j] * (c.h + 4 * c.k);
    send_c[j] = out_rows[j] * c.h;
    recv_c[j] = in_rows[j] * c.h;
    sent_d += send_d[j];
    recv_dn += recv_d[j];
    sent_c += send_c[j];
    recv_cn += recv_c[j];
    if (j != rank) {
      r.dispatch_bytes_off += send_d[j] * 2;
      r.combine_bytes_off += send_c[j] * 2;
    }
  }
  const int64_t in_n = std::max<int64_t>({sent_d, sent_c, 1}),
                out_n = std::max<int64_t>({recv_dn, recv_cn, 1});
  SY_ASSIGN_OR_RETURN(Buffer a2a_in, Buffer::ForTensor(DType::kBF16, {in_n}, dev));
  SY_ASSIGN_OR_RETURN(Buffer a2a_out, Buffer::ForTensor(DType::kBF16, {out_n}, dev));
  SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a2a_in.data(), 0, a2a_in.bytes(), cs));
  auto plain = [&](const std::vector<int64_t>& send, int64_t ns, const std::vector<int64_t>& recv,
                   int64_t nr) -> absl::StatusOr<double> {
    std::vector<double> ms;
    for (int it = 0; it < a.warmup + a.iters; ++it) {
      SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[0], cs));
      SY_RETURN_IF_ERROR(comm.AllToAllV(a2a_in.View(DType::kBF16, {ns}), send,
                                        a2a_out.View(DType::kBF16, {nr}), recv));
      SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[1], cs));
      SY_RETURN_IF_ERROR(comm::WaitEvent(comm, ev[1], "ep_dispatch_benchmark plain AllToAllV"));
      if (it < a.warmup) continue;
      SY_ASSIGN_OR_RETURN(double m, elapsed(0, 1));
      ms.push_back(m);
    }
    return Median(ms);
  };
  SY_ASSIGN_OR_RETURN(r.nccl_dispatch_ms, plain(send_d, sent_d, recv_d, recv_dn));
  SY_ASSIGN_OR_RETURN(r.nccl_combine_ms, plain(send_c, sent_c, recv_c, recv_cn));
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  r.dispatch_ms = Median(dispatch);
  r.combine_ms = Median(combine);
  r.total_ms = Median(total);
  return r;
}

// One rank: CUDA device `rank`, a non-blocking stream shared by the communicator and the
// dispatcher (the dispatcher's stream contract). Writes its results to <dir>/rank_<r>.json.
absl::Status RankMain(const Args& a, const std::string& dir, int rank) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
  cudaStream_t cs = nullptr;
  SY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  json results = json::object();
  {
    SY_ASSIGN_OR_RETURN(std::unique_ptr<comm::FileKvStore> store,
                        comm::FileKvStore::Create(dir + "/store"));
    comm::NcclOptions options;
    options.timeout = absl::Seconds(120);
    SY_ASSIGN_OR_RETURN(
        std::unique_ptr<comm::NcclCommunicator> comm,
        comm::NcclCommunicator::Create(std::shared_ptr<comm::KvStore>(std::move(store)), rank, a.ep,
                                       rank, cs, options, "ep"));
    for (const std::string& name : a.configs) {
      absl::StatusOr<RankResult> r = RunConfig(*comm, cs, rank, Configs().at(name), a);
      SY_RETURN_IF_ERROR(Annotate(r.status(), absl::StrCat("config ", name)));
      results[name] = {{"dispatch_ms", r->dispatch_ms},
                       {"combine_ms", r->combine_ms},
                       {"total_ms", r->total_ms},
                       {"nccl_dispatch_ms", r->nccl_dispatch_ms},
                       {"nccl_combine_ms", r->nccl_combine_ms},
                       {"dispatch_bytes_off", r->dispatch_bytes_off},
                       {"combine_bytes_off", r->combine_bytes_off},
                       {"slot_bytes_off", r->slot_bytes_off}};
    }
  }
  SY_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(cs));
  std::ofstream f(absl::StrCat(dir, "/rank_", rank, ".json"));
  f << results.dump();
  if (!f.good()) return absl::InternalError(absl::StrCat("writing ", dir, "/rank_", rank));
  return absl::OkStatus();
}

void PrintPlan(const Args& a) {
  std::printf("ep_dispatch_benchmark plan: EP=%d, %d warm-up + %d timed iterations\n", a.ep,
              a.warmup, a.iters);
  json plan = json::array();
  for (const std::string& name : a.configs) {
    const EpConfig& c = Configs().at(name);
    // Uniform routing (k distinct experts): a token reaches another given rank unless none of
    // its k slots is there, with probability 1 - C(E - L, k) / C(E, k); it is sent there once.
    const int64_t l = c.e / a.ep;
    double none = 1.0;
    for (int64_t s = 0; s < c.k; ++s) none *= static_cast<double>(c.e - l - s) / (c.e - s);
    const double rows_off = static_cast<double>(c.t) * (a.ep - 1) * (1.0 - none);
    const double mb = rows_off * (2.0 * c.h + 8.0 * c.k) / 1e6;
    std::printf(
        "  %-14s H=%ld E=%ld (L=%ld per rank) k=%ld T=%ld per GPU: ~%.0f token rows, ~%.1f MB "
        "off-rank per dispatch\n",
        name.c_str(), static_cast<long>(c.h), static_cast<long>(c.e), static_cast<long>(c.e / a.ep),
        static_cast<long>(c.k), static_cast<long>(c.t), rows_off, mb);
    plan.push_back({{"config", name},
                    {"h", c.h},
                    {"e", c.e},
                    {"k", c.k},
                    {"t", c.t},
                    {"expected_dispatch_mb_off_rank", mb}});
  }
  std::printf("JSON %s\n",
              json({{"bench", "ep_dispatch"}, {"ep", a.ep}, {"dry_run", true}, {"plan", plan}})
                  .dump()
                  .c_str());
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Expert-parallel dispatch benchmark: the alltoall dispatcher over EP = 2|4 GPUs, one process "
      "per GPU (bench/README.md).");
  switchyard::ParseCommandLine(argc, argv);
  absl::StatusOr<Args> a = ParseArgs();
  if (!a.ok()) {
    std::fprintf(stderr, "ep_dispatch_benchmark: %s\n", a.status().ToString().c_str());
    return 2;
  }
  PrintPlan(*a);
  if (absl::GetFlag(FLAGS_dry_run)) return 0;

  const std::string dir = MakeRunDirectory("ep_dispatch_benchmark");
  if (dir.empty()) return 1;
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink SHARP is off on the GPU hosts (KINDS.md)
  const std::vector<int> codes = ForkRanks(a->ep, absl::Minutes(9), [&](int rank) {
    const absl::Status s = RankMain(*a, dir, rank);
    if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return s.ok() ? 0 : 1;
  });
  for (int r = 0; r < a->ep; ++r) {
    if (codes[r] != 0) {
      std::fprintf(stderr, "ep_dispatch_benchmark: rank %d exited with %d (files in %s)\n", r,
                   codes[r], dir.c_str());
      return 1;
    }
  }
  std::vector<json> ranks(a->ep);
  for (int r = 0; r < a->ep; ++r) {
    std::ifstream f(absl::StrCat(dir, "/rank_", r, ".json"));
    std::stringstream ss;
    ss << f.rdbuf();
    ranks[r] = json::parse(ss.str(), nullptr, false);
    if (ranks[r].is_discarded()) {
      std::fprintf(stderr, "ep_dispatch_benchmark: bad results of rank %d in %s\n", r, dir.c_str());
      return 1;
    }
  }

  std::printf("\n%-14s %3s | %9s %9s %9s | %10s %9s %9s %9s %6s | %10s %9s %9s %6s\n", "config",
              "EP", "disp ms", "comb ms", "6ph ms", "slot MB", "disp MB", "disp GB/s", "nccl GB/s",
              "ratio", "comb MB", "comb GB/s", "nccl GB/s", "ratio");
  json rows = json::array();
  for (const std::string& name : a->configs) {
    // Slowest rank's median time; bytes averaged over ranks.
    double dm = 0, cm = 0, tm = 0, ndm = 0, ncm = 0, db = 0, cb = 0, sb = 0;
    for (const json& rj : ranks) {
      const json& v = rj.at(name);
      dm = std::max(dm, v.at("dispatch_ms").get<double>());
      cm = std::max(cm, v.at("combine_ms").get<double>());
      tm = std::max(tm, v.at("total_ms").get<double>());
      ndm = std::max(ndm, v.at("nccl_dispatch_ms").get<double>());
      ncm = std::max(ncm, v.at("nccl_combine_ms").get<double>());
      db += v.at("dispatch_bytes_off").get<double>() / a->ep;
      cb += v.at("combine_bytes_off").get<double>() / a->ep;
      sb += v.at("slot_bytes_off").get<double>() / a->ep;
    }
    auto gbs = [](double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e6) : 0.0; };
    const double dbw = gbs(db, dm), ndbw = gbs(db, ndm), cbw = gbs(cb, cm), ncbw = gbs(cb, ncm);
    std::printf(
        "%-14s %3d | %9.3f %9.3f %9.3f | %10.1f %10.1f %9.1f %9.1f %6.2f | %10.1f %9.1f %9.1f "
        "%6.2f\n",
        name.c_str(), a->ep, dm, cm, tm, sb / 1e6, db / 1e6, dbw, ndbw, ndbw > 0 ? dbw / ndbw : 0.0,
        cb / 1e6, cbw, ncbw, ncbw > 0 ? cbw / ncbw : 0.0);
    rows.push_back({{"config", name},
                    {"dispatch_ms", dm},
                    {"combine_ms", cm},
                    {"six_phases_ms", tm},
                    {"nccl_a2a_dispatch_bytes_ms", ndm},
                    {"nccl_a2a_combine_bytes_ms", ncm},
                    {"dispatch_bytes_off_rank", db},
                    {"combine_bytes_off_rank", cb},
                    {"slot_bytes_off_rank", sb},
                    {"dispatch_gbps", dbw},
                    {"nccl_peak_dispatch_gbps", ndbw},
                    {"combine_gbps", cbw},
                    {"nccl_peak_combine_gbps", ncbw}});
  }
  std::printf(
      "(times: slowest rank's median of %d iterations; GB/s = bytes sent to other ranks / "
      "time, mean over ranks; nccl = plain AllToAllV of the same bytes per peer)\n",
      a->iters);
  std::printf("JSON %s\n", json({{"bench", "ep_dispatch"},
                                 {"ep", a->ep},
                                 {"iters", a->iters},
                                 {"warmup", a->warmup},
                                 {"results", rows}})
                               .dump()
                               .c_str());
  return 0;
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
