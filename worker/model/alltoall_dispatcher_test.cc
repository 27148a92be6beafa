// File: worker/model/alltoall_dispatcher_test.cc
//
// AllToAllDispatcher with real processes: each multi-rank test forks W children (before any
// thread exists in the parent), each connects a GlooCommunicator on loopback through a FileKvStore
// in TEST_TMPDIR, runs one forward + backward micro-batch through the six phases and reports
// through its exit code. Every child generates the WHOLE global batch from one seed (drawn by the
// parent from std::random_device and printed), so it can compare its own results with two
// single-process references:
//   (a) LocalDispatcher on the concatenated global batch (ranks' tokens in rank order): the rows,
//       probs and counts this rank's experts receive, and the expert-side gradient rows, must
//       equal that run's rows for the same global experts, bit for bit and in the same order;
//   (b) LocalDispatcher on this rank's own tokens: the combined output, dx and d_topk_probs must be
//       bit-identical (both sum the same expert rows in the same slot order).
// The "experts" are identity experts that apply the routing prob (expert_out = expert_x * prob;
// backward d_expert_x = d_expert_out * prob, d_prob = <d_expert_out, expert_x>), so the round trip
// returns out[t] = sum over kept slots s of x[t] * p[t, s], i.e. x times the sum of the token's
// kept routing probs (Megatron's combine with probs applied in the experts); this is checked
// exactly against that sum computed in fp64 and rounded once (Unpermute's arithmetic).
// Routing is deliberately uneven (some experts 5x more likely, some slots dropped, ranks with very
// different token counts) and one expert receives no token from any rank.
#include "worker/model/alltoall_dispatcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"

namespace switchyard::model {
namespace {

int g_rank = -1;

#define CHILD_CHECK(cond)                                                                    \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", g_rank, __FILE__, __LINE__, \
                   #cond);                                                                   \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)
#define CHILD_OK(expr)                                                                    \
  do {                                                                                    \
    absl::Status s_ = (expr);                                                             \
    if (!s_.ok()) {                                                                       \
      std::fprintf(stderr, "rank %d: %s:%d: %s: %s\n", g_rank, __FILE__, __LINE__, #expr, \
                   s_.ToString().c_str());                                                \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

struct Config {
  int world = 2;
  int num_experts = 4;
  int topk = 2;
  int64_t hidden = 8;
  std::vector<int64_t> tokens;  // per rank
  int dead_expert = -1;         // never routed to
};

// One rank's micro-batch.
struct Batch {
  int64_t t = 0;
  std::vector<float> x, probs, dout;  // [T,H], [T,k], [T,H]
  std::vector<int32_t> idx;           // [T,k]
};

// Every rank's batch from one seed: experts e % 3 == 0 are 5x more likely, distinct experts per
// token, ~10% of the slots dropped (-1), the dead expert never chosen.
std::vector<Batch> MakeGlobal(const Config& c, uint32_t seed) {
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

Batch Concat(const std::vector<Batch>& all) {
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

// Runs the six phases, identity-prob experts, and both backward phases.
absl::Status RunStep(TokenDispatcher& d, Batch b, int64_t hidden, int topk, Result* res) {
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
  const float* dy = st.d_expert_out.as<float>();
  res->d_expert_out.assign(dy, dy + rows * hidden);
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

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

absl::StatusOr<Result> RunLocal(const Batch& b, const Config& c) {
  SY_ASSIGN_OR_RETURN(
      std::unique_ptr<LocalDispatcher> d,
      LocalDispatcher::Create(Device::Cpu(), DType::kF32, DType::kF32, std::max<int64_t>(b.t, 1),
                              c.hidden, c.num_experts, c.topk, 0));
  Result r;
  SY_RETURN_IF_ERROR(RunStep(*d, b, c.hidden, c.topk, &r));
  return r;
}

// Checks a dispatcher's result for `rank` against both references (see the file comment).
int CheckAgainstReferences(const Config& c, const std::vector<Batch>& all, int rank,
                           const Result& got) {
  const int ep = c.world, nl = c.num_experts / ep;
  const Batch& mine = all[rank];
  // (a) the global batch through one LocalDispatcher.
  absl::StatusOr<Result> global = RunLocal(Concat(all), c);
  CHILD_OK(global.status());
  std::vector<int64_t> start(c.num_experts + 1, 0);
  for (int e = 0; e < c.num_experts; ++e) start[e + 1] = start[e] + global->tokens_per_expert[e];
  CHILD_CHECK(static_cast<int>(got.tokens_per_expert.size()) == nl);
  int64_t row = 0;
  for (int l = 0; l < nl; ++l) {
    const int e = rank * nl + l;
    CHILD_CHECK(got.tokens_per_expert[l] == global->tokens_per_expert[e]);
    if (e == c.dead_expert) CHILD_CHECK(got.tokens_per_expert[l] == 0);
    const int64_t n = got.tokens_per_expert[l], h = c.hidden;
    for (int64_t i = 0; i < n * h; ++i) {
      CHILD_CHECK(got.expert_x[row * h + i] == global->expert_x[start[e] * h + i]);
      CHILD_CHECK(got.d_expert_out[row * h + i] == global->d_expert_out[start[e] * h + i]);
    }
    for (int64_t i = 0; i < n; ++i) {
      CHILD_CHECK(got.expert_probs[row + i] == global->expert_probs[start[e] + i]);
    }
    row += n;
  }
  // (b) this rank's tokens through one LocalDispatcher: bit-identical output and gradients.
  absl::StatusOr<Result> local = RunLocal(mine, c);
  CHILD_OK(local.status());
  CHILD_CHECK(SameBits(got.out, local->out));
  CHILD_CHECK(SameBits(got.dx, local->dx));
  CHILD_CHECK(SameBits(got.d_topk_probs, local->d_topk_probs));
  // The round trip is x * (sum of the kept probs), summed in slot order in fp64, rounded once.
  for (int64_t t = 0; t < mine.t; ++t) {
    for (int64_t h = 0; h < c.hidden; ++h) {
      double acc = 0;
      for (int s = 0; s < c.topk; ++s) {
        if (mine.idx[t * c.topk + s] < 0) continue;
        acc += mine.x[t * c.hidden + h] * mine.probs[t * c.topk + s];
      }
      CHILD_CHECK(got.out[t * c.hidden + h] == static_cast<float>(acc));
    }
  }
  return 0;
}

std::string StoreDir(const std::string& name) {
  static int counter = 0;
  const char* t = std::getenv("TEST_TMPDIR");
  return absl::StrCat(t ? t : "/tmp", "/a2a_test_", name, "_", getpid(), "_", counter++);
}

// Forks `world` children running body(rank); returns their exit codes (128 + signal if killed).
std::vector<int> RunProcesses(int world, absl::Duration limit,
                              const std::function<int(int rank)>& body) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(world);
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      g_rank = r;
      int code = body(r);
      std::fflush(nullptr);
      _exit(code);
    }
    pids[r] = pid;
  }
  std::vector<int> codes(world, -1);
  const absl::Time deadline = absl::Now() + limit;
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (codes[r] != -1) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --remaining;
      }
    }
    if (remaining > 0 && absl::Now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (codes[r] == -1) kill(pids[r], SIGKILL);
      }
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return codes;
}

int DistributedChild(const Config& c, uint32_t seed, const std::string& dir, int rank) {
  absl::StatusOr<std::unique_ptr<comm::FileKvStore>> store = comm::FileKvStore::Create(dir);
  CHILD_OK(store.status());
  comm::GlooOptions options;
  options.timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> world = comm::GlooCommunicator::Create(
      std::shared_ptr<comm::KvStore>(std::move(*store)), rank, c.world, options);
  CHILD_OK(world.status());
  const std::vector<Batch> all = MakeGlobal(c, seed);
  int64_t max_tokens = 1;
  for (int64_t t : c.tokens) max_tokens = std::max(max_tokens, t);
  absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> d =
      AllToAllDispatcher::Create(world->get(), Device::Cpu(), DType::kF32, DType::kF32, max_tokens,
                                 c.hidden, c.num_experts, c.world, c.topk);
  CHILD_OK(d.status());
  // Two micro-batches through the same dispatcher: the second one must not see the first's state.
  for (int step = 0; step < 2; ++step) {
    const std::vector<Batch> batches = step == 0 ? all : MakeGlobal(c, seed + 1);
    Result got;
    CHILD_OK(RunStep(**d, batches[rank], c.hidden, c.topk, &got));
    if (CheckAgainstReferences(c, batches, rank, got) != 0) return 1;
  }
  int64_t sent = 0, recv = 0;
  for (int j = 0; j < c.world; ++j) {
    sent += (*d)->input_splits()[j];
    recv += (*d)->output_splits()[j];
  }
  std::fprintf(stderr, "rank %d/%d: T=%ld sent %ld rows, received %ld rows: OK\n", rank, c.world,
               static_cast<long>(c.tokens[rank]), static_cast<long>(sent), static_cast<long>(recv));
  return 0;
}

void RunDistributed(const Config& c, const std::string& name) {
  const uint32_t seed = std::random_device{}();
  std::printf("%s: W=%d E=%d k=%d H=%ld tokens per rank [", name.c_str(), c.world, c.num_experts,
              c.topk, static_cast<long>(c.hidden));
  for (int64_t t : c.tokens) std::printf(" %ld", static_cast<long>(t));
  std::printf(" ] dead expert %d seed %u\n", c.dead_expert, seed);
  const std::string dir = StoreDir(name);
  std::vector<int> codes = RunProcesses(
      c.world, absl::Seconds(25), [&](int rank) { return DistributedChild(c, seed, dir, rank); });
  for (int r = 0; r < c.world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " seed " << seed;
}

TEST(AllToAllDispatcherTest, TwoRanksTwoLocalExperts) {
  Config c;
  c.world = 2;
  c.num_experts = 4;
  c.topk = 2;
  c.hidden = 8;
  c.tokens = {7, 12};
  c.dead_expert = 3;  // rank 1's local expert 1 receives nothing
  RunDistributed(c, "w2");
}

TEST(AllToAllDispatcherTest, FourRanksUnevenTokens) {
  Config c;
  c.world = 4;
  c.num_experts = 8;
  c.topk = 3;
  c.hidden = 5;
  c.tokens = {9, 1, 16, 4};  // rank 1 reaches at most 3 of the 4 ranks: zero splits
  c.dead_expert = 2;
  RunDistributed(c, "w4");
}

TEST(AllToAllDispatcherTest, FourRanksOneLocalExpert) {
  Config c;
  c.world = 4;
  c.num_experts = 4;
  c.topk = 2;
  c.hidden = 3;
  c.tokens = {6, 6, 6, 6};
  c.dead_expert = 0;  // rank 0 has no rows at all for its only expert
  RunDistributed(c, "w4l1");
}

// EP = 1 degenerates to the local path: same rows, counts, output and gradients, bit for bit.
TEST(AllToAllDispatcherTest, SingleRankMatchesLocalDispatcher) {
  Config c;
  c.world = 1;
  c.num_experts = 6;
  c.topk = 2;
  c.hidden = 4;
  c.tokens = {11};
  c.dead_expert = 5;
  const std::vector<Batch> all = MakeGlobal(c, std::random_device{}());
  absl::StatusOr<std::unique_ptr<comm::SingleRankCommunicator>> ep =
      comm::SingleRankCommunicator::Create("ep");
  ASSERT_TRUE(ep.ok());
  absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> d = AllToAllDispatcher::Create(
      ep->get(), Device::Cpu(), DType::kF32, DType::kF32, 11, c.hidden, 6, 1, 2);
  ASSERT_TRUE(d.ok()) << d.status();
  Result got;
  ASSERT_TRUE(RunStep(**d, all[0], c.hidden, c.topk, &got).ok());
  absl::StatusOr<Result> ref = RunLocal(all[0], c);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(got.tokens_per_expert, ref->tokens_per_expert);
  EXPECT_TRUE(SameBits(got.expert_x, ref->expert_x));
  EXPECT_TRUE(SameBits(got.expert_probs, ref->expert_probs));
  EXPECT_TRUE(SameBits(got.d_expert_out, ref->d_expert_out));
  EXPECT_TRUE(SameBits(got.out, ref->out));
  EXPECT_TRUE(SameBits(got.dx, ref->dx));
  EXPECT_TRUE(SameBits(got.d_topk_probs, ref->d_topk_probs));
  EXPECT_EQ(got.tokens_per_expert[5], 0);
  g_rank = 0;
  EXPECT_EQ(CheckAgainstReferences(c, all, 0, got), 0);
}

TEST(AllToAllDispatcherTest, RejectsBadArgumentsAndPhaseOrder) {
  absl::StatusOr<std::unique_ptr<comm::SingleRankCommunicator>> ep =
      comm::SingleRankCommunicator::Create("ep");
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ(
      AllToAllDispatcher::Create(ep->get(), Device::Cpu(), DType::kF32, DType::kF32, 4, 4, 4, 2, 2)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);  // ep_size != group size
  EXPECT_EQ(
      AllToAllDispatcher::Create(nullptr, Device::Cpu(), DType::kF32, DType::kF32, 4, 4, 4, 1, 2)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AllToAllDispatcher::Create(ep->get(), Device::Cuda(0), DType::kF32, DType::kF32, 4, 4,
                                       4, 1, 2)
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  absl::StatusOr<std::unique_ptr<AllToAllDispatcher>> d =
      AllToAllDispatcher::Create(ep->get(), Device::Cpu(), DType::kF32, DType::kF32, 4, 4, 4, 1, 2);
  ASSERT_TRUE(d.ok());
  DispatchState st;
  EXPECT_EQ((*d)->Dispatch(Stream::Cpu(), &st).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*d)->Combine(Stream::Cpu(), &st).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace switchyard::model
