// File: worker/model/testing/ep_fork.h
//
// Test-only helpers shared by the expert-parallel dispatcher tests (alltoall_dispatcher_test.cc,
// allgather_dispatcher_test.cc), on top of worker/comm/testing/forked_ranks.h (fork one process
// per rank, SY_CHILD_CHECK / SY_CHILD_OK): connecting a GlooCommunicator on loopback through a
// FileKvStore, a deterministic uneven global batch, one forward + backward micro-batch through the
// six TokenDispatcher phases with identity-prob experts, and the expert-side comparison against
// LocalDispatcher on the concatenated global batch.
//
// The "experts" are identity experts that apply the routing prob (expert_out = expert_x * prob;
// backward d_expert_x = d_expert_out * prob, d_prob = <d_expert_out, expert_x>), so the round trip
// returns out[t] = x[t] times the sum of the token's kept routing probs.
#ifndef SWITCHYARD_WORKER_MODEL_TESTING_EP_FORK_H_
#define SWITCHYARD_WORKER_MODEL_TESTING_EP_FORK_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/tensor.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/model/dispatcher.h"

namespace switchyard::model::ep_test {

struct Config {
  int world = 2;
  int num_experts = 4;
  int topk = 2;
  int64_t hidden = 8;
  std::vector<int64_t> tokens;   // per rank
  int dead_expert = -1;          // never routed to
  std::vector<int> hot_experts;  // 200x more likely than the others (uneven loads)
};

// One rank's micro-batch.
struct Batch {
  int64_t t = 0;
  std::vector<float> x, probs, dout;  // [T,H], [T,k], [T,H]
  std::vector<int32_t> idx;           // [T,k]
};

// Every rank's batch from one seed: experts e % 3 == 0 are 5x more likely (hot_experts 200x),
// distinct experts per token, ~10% of the slots dropped (-1), the dead expert never chosen.
inline std::vector<Batch> MakeGlobal(const Config& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f), prob(0.05f, 1.0f), unit(0.0f, 1.0f);
  std::vector<Batch> all(c.world);
  for (int r = 0; r < c.world; ++r) {
    Batch& b = all[r];
    b.t = c.tokens[r];
    for (int64_t i = 0; i < b.t * c.hidden; ++i) b.x.push_back(val(rng));
    for (int64_t i = 0; i < b.t * c.hidden; ++i) b.dout.push_back(val(rng));
    for (int64_t t = 0; t < b.t; ++t) {
      std::vector<double> w(c.num_experts);
      for (int e = 0; e < c.num_experts; ++e) w[e] = e == c.dead_expert ? 0 : (e % 3 == 0 ? 5 : 1);
      for (int e : c.hot_experts) w[e] = 200;
      for (int s = 0; s < c.topk; ++s) {
        std::discrete_distribution<int> pick(w.begin(), w.end());
        const int e = pick(rng);
        w[e] = 0;
        b.idx.push_back(unit(rng) < 0.1f ? -1 : e);
        b.probs.push_back(prob(rng));
      }
    }
  }
  return all;
}

// The ranks' batches concatenated in rank order.
inline Batch Concat(const std::vector<Batch>& all) {
  Batch g;
  for (const Batch& b : all) {
    g.t += b.t;
    g.x.insert(g.x.end(), b.x.begin(), b.x.end());
    g.dout.insert(g.dout.end(), b.dout.begin(), b.dout.end());
    g.idx.insert(g.idx.end(), b.idx.begin(), b.idx.end());
    g.probs.insert(g.probs.end(), b.probs.begin(), b.probs.end());
  }
  return g;
}

// What one forward + backward micro-batch produced.
struct Result {
  std::vector<int32_t> tokens_per_expert;     // [local experts]
  std::vector<float> expert_x, expert_probs;  // first sum(tokens_per_expert) rows
  std::vector<float> d_expert_out;            // same rows
  std::vector<float> out, dx, d_topk_probs;   // [T,H], [T,H], [T,k]
};

template <typename T>
Tensor View(DType dtype, std::vector<T>& v, std::vector<int64_t> shape) {
  return Tensor(dtype, std::move(shape), Device::Cpu(), v.data());
}

// Runs the six phases, identity-prob experts, and both backward phases (f32, CPU).
inline absl::Status RunStep(TokenDispatcher& d, Batch b, int64_t hidden, int topk, Result* res) {
  const Stream stream = Stream::Cpu();
  DispatchState st;
  st.x = View(DType::kF32, b.x, {b.t, hidden});
  st.topk_idx = View(DType::kI32, b.idx, {b.t, topk});
  st.topk_probs = View(DType::kF32, b.probs, {b.t, topk});
  SY_RETURN_IF_ERROR(d.DispatchPreprocess(stream, &st));
  SY_RETURN_IF_ERROR(d.Dispatch(stream, &st));
  SY_RETURN_IF_ERROR(d.DispatchPostprocess(stream, &st));
  const int32_t* tpe = st.tokens_per_expert.as<int32_t>();
  res->tokens_per_expert.assign(tpe, tpe + d.num_local_experts());
  int64_t rows = 0;
  for (int32_t n : res->tokens_per_expert) rows += n;
  const float* ex = st.expert_x.as<float>();
  const float* ep = st.expert_probs.as<float>();
  res->expert_x.assign(ex, ex + rows * hidden);
  res->expert_probs.assign(ep, ep + rows);
  float* eo = st.expert_out.as<float>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t h = 0; h < hidden; ++h) eo[i * hidden + h] = ex[i * hidden + h] * ep[i];
  }
  SY_RETURN_IF_ERROR(d.CombinePreprocess(stream, &st));
  SY_RETURN_IF_ERROR(d.Combine(stream, &st));
  res->out.assign(b.t * hidden, std::nanf(""));
  SY_RETURN_IF_ERROR(d.CombinePostprocess(stream, &st, View(DType::kF32, res->out, {b.t, hidden})));

  SY_RETURN_IF_ERROR(d.CombineBackward(stream, View(DType::kF32, b.dout, {b.t, hidden}), &st));
  const float* dy_view = st.d_expert_out.as<float>();
  res->d_expert_out.assign(dy_view, dy_view + rows * hidden);
  // d_expert_x may share d_expert_out's memory (dispatcher.h): read the copy.
  const float* dy = res->d_expert_out.data();
  float* dex = st.d_expert_x.as<float>();
  float* dep = st.d_expert_probs.as<float>();
  for (int64_t i = 0; i < rows; ++i) {
    double dot = 0;
    for (int64_t h = 0; h < hidden; ++h) {
      dex[i * hidden + h] = dy[i * hidden + h] * ep[i];
      dot += static_cast<double>(dy[i * hidden + h]) * ex[i * hidden + h];
    }
    dep[i] = static_cast<float>(dot);
  }
  res->dx.assign(b.t * hidden, std::nanf(""));
  res->d_topk_probs.assign(b.t * topk, std::nanf(""));
  return d.DispatchBackward(stream, &st, View(DType::kF32, res->dx, {b.t, hidden}),
                            View(DType::kF32, res->d_topk_probs, {b.t, topk}));
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The batch through one LocalDispatcher (all experts local).
inline absl::StatusOr<Result> RunLocal(const Batch& b, const Config& c) {
  SY_ASSIGN_OR_RETURN(
      std::unique_ptr<LocalDispatcher> d,
      LocalDispatcher::Create(Device::Cpu(), DType::kF32, DType::kF32, std::max<int64_t>(b.t, 1),
                              c.hidden, c.num_experts, c.topk, 0));
  Result r;
  SY_RETURN_IF_ERROR(RunStep(*d, b, c.hidden, c.topk, &r));
  return r;
}

// What the token-deduplicating AllToAllDispatcher returns for `b` (alltoall_dispatcher.h,
// "Numerics of the sums"), computed directly: each EP rank j (experts [j*L, (j+1)*L)) first sums
// the token's identity-expert rows on its experts in slot order (fp64, rounded once to f32, as
// Unpermute / PermuteBackward do on the CPU), then the token's rank partials are summed in rank
// order (fp64, rounded once). out uses the rows x * p, dx the rows dout * p; d_topk_probs is
// LocalDispatcher's (each slot's gradient comes from the one rank owning it, exactly).
inline absl::StatusOr<Result> RunTwoLevel(const Batch& b, const Config& c, int ep_size) {
  SY_ASSIGN_OR_RETURN(Result r, RunLocal(b, c));
  const int local = c.num_experts / ep_size;
  for (int64_t t = 0; t < b.t; ++t) {
    for (int64_t h = 0; h < c.hidden; ++h) {
      double out = 0, dx = 0;
      for (int j = 0; j < ep_size; ++j) {
        double part_out = 0, part_dx = 0;
        for (int s = 0; s < c.topk; ++s) {
          const int32_t e = b.idx[t * c.topk + s];
          if (e < 0 || e / local != j) continue;
          const float p = b.probs[t * c.topk + s];
          part_out += b.x[t * c.hidden + h] * p;
          part_dx += b.dout[t * c.hidden + h] * p;
        }
        out += static_cast<float>(part_out);
        dx += static_cast<float>(part_dx);
      }
      r.out[t * c.hidden + h] = static_cast<float>(out);
      r.dx[t * c.hidden + h] = static_cast<float>(dx);
    }
  }
  return r;
}

// The expert side of `got` (rank `rank`, experts [rank*L, (rank+1)*L)) against LocalDispatcher on
// the concatenated global batch: counts, rows, probs and d_expert_out rows bit for bit, in the same
// order; the dead expert receives nothing. Returns 0 when all hold.
inline int CheckExpertSide(const Config& c, const std::vector<Batch>& all, int rank,
                           const Result& got) {
  const int nl = c.num_experts / c.world;
  absl::StatusOr<Result> global = RunLocal(Concat(all), c);
  SY_CHILD_OK(global.status());
  std::vector<int64_t> start(c.num_experts + 1, 0);
  for (int e = 0; e < c.num_experts; ++e) start[e + 1] = start[e] + global->tokens_per_expert[e];
  SY_CHILD_CHECK(static_cast<int>(got.tokens_per_expert.size()) == nl);
  int64_t row = 0;
  for (int l = 0; l < nl; ++l) {
    const int e = rank * nl + l;
    SY_CHILD_CHECK(got.tokens_per_expert[l] == global->tokens_per_expert[e]);
    if (e == c.dead_expert) SY_CHILD_CHECK(got.tokens_per_expert[l] == 0);
    const int64_t n = got.tokens_per_expert[l], h = c.hidden;
    for (int64_t i = 0; i < n * h; ++i) {
      SY_CHILD_CHECK(got.expert_x[row * h + i] == global->expert_x[start[e] * h + i]);
      SY_CHILD_CHECK(got.d_expert_out[row * h + i] == global->d_expert_out[start[e] * h + i]);
    }
    for (int64_t i = 0; i < n; ++i) {
      SY_CHILD_CHECK(got.expert_probs[row + i] == global->expert_probs[start[e] + i]);
    }
    row += n;
  }
  return 0;
}

// Connects rank `rank` of `world` through a FileKvStore in `dir` (10 s Gloo timeout).
inline absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> ConnectGloo(const std::string& dir,
                                                                           int rank, int world) {
  SY_ASSIGN_OR_RETURN(std::unique_ptr<comm::FileKvStore> store, comm::FileKvStore::Create(dir));
  comm::GlooOptions options;
  options.timeout = absl::Seconds(10);
  return comm::GlooCommunicator::Create(std::shared_ptr<comm::KvStore>(std::move(store)), rank,
                                        world, options);
}

// Prints the test's configuration and seed (one line).
inline void PrintConfig(const std::string& name, const Config& c, uint32_t seed) {
  std::printf("%s: W=%d E=%d k=%d H=%ld tokens per rank [", name.c_str(), c.world, c.num_experts,
              c.topk, static_cast<long>(c.hidden));
  for (int64_t t : c.tokens) std::printf(" %ld", static_cast<long>(t));
  std::printf(" ] dead expert %d seed %u\n", c.dead_expert, seed);
}

}  // namespace switchyard::model::ep_test

#endif  // SWITCHYARD_WORKER_MODEL_TESTING_EP_FORK_H_
