// File: common/model/pipeline_schedule.cc
//
// Megatron-Core's 1F1B and interleaved 1F1B op orders (see the header).
#include "common/model/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace switchyard {
namespace {

// Virtual micro-batch k of the interleaved schedule (schedules.py get_model_chunk_id and
// get_microbatch_id_in_model_chunk with microbatch_group_size_per_vp_stage = PP).
PipelineOp Virtual(int64_t k, bool forward, int64_t pp, int64_t vpp) {
  PipelineOp op;
  op.forward = forward;
  const int64_t in_group = k % (pp * vpp);
  op.chunk = in_group / pp;
  if (!forward) op.chunk = vpp - op.chunk - 1;
  op.micro = (k / (pp * vpp)) * pp + k % pp;
  return op;
}

// PipelineSchedule's argument rules (PipelineAliveMicroBatches, PipelineReceiveBuffers and
// PipelinePoolBuffers share them and their messages).
absl::Status CheckArguments(int64_t pp, int64_t stage, int64_t vpp, int64_t num_micro) {
  if (pp < 1) return absl::InvalidArgumentError(absl::StrCat("pp (", pp, ") must be at least 1"));
  if (stage < 0 || stage >= pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage (", stage, ") must be in [0, pp ", pp, ")"));
  }
  if (vpp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vpp (", vpp, ") must be at least 1"));
  }
  if (num_micro < pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_micro (", num_micro, ") must be at least pp (", pp,
                     "): the pipeline schedule needs one micro-batch per stage in flight"));
  }
  if (vpp > 1 && num_micro % pp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_micro (", num_micro, ") must be a multiple of pp (", pp, ") with vpp (",
                     vpp, ") > 1: the interleaved schedule runs groups of pp"));
  }
  return absl::OkStatus();
}

// Warm-up forwards of stage `stage` (schedules.py get_pp_rank_microbatches; 1F1B:
// num_warmup_microbatches), of valid arguments.
int64_t Warmup(int64_t pp, int64_t stage, int64_t vpp, int64_t num_micro) {
  if (vpp == 1) return std::min(pp - stage - 1, num_micro);
  // get_pp_rank_microbatches: capped at the total ("all micro-batches in warm-up").
  return std::min((pp - stage - 1) * 2 + (vpp - 1) * pp, num_micro * vpp);
}

}  // namespace

absl::StatusOr<std::vector<PipelineOp>> PipelineSchedule(int64_t pp, int64_t stage, int64_t vpp,
                                                         int64_t num_micro, bool forward_only) {
  if (absl::Status st = CheckArguments(pp, stage, vpp, num_micro); !st.ok()) return st;
  std::vector<PipelineOp> ops;
  if (forward_only) {
    // schedules.py: forward_only puts every virtual micro-batch in warm-up.
    for (int64_t k = 0; k < num_micro * vpp; ++k) {
      ops.push_back(vpp == 1 ? PipelineOp{true, k, 0} : Virtual(k, true, pp, vpp));
    }
    return ops;
  }
  if (vpp == 1) {
    const int64_t warmup = Warmup(pp, stage, 1, num_micro);
    for (int64_t i = 0; i < warmup; ++i) ops.push_back({true, i, 0});
    for (int64_t i = 0; i < num_micro - warmup; ++i) {
      ops.push_back({true, warmup + i, 0});
      ops.push_back({false, i, 0});
    }
    for (int64_t i = num_micro - warmup; i < num_micro; ++i) ops.push_back({false, i, 0});
    return ops;
  }
  const int64_t total = num_micro * vpp;
  const int64_t warmup = Warmup(pp, stage, vpp, num_micro);
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(Virtual(k, true, pp, vpp));
  for (int64_t k = 0; k < total - warmup; ++k) {
    ops.push_back(Virtual(warmup + k, true, pp, vpp));
    ops.push_back(Virtual(k, false, pp, vpp));
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back(Virtual(k, false, pp, vpp));
  return ops;
}

absl::StatusOr<std::vector<PipelineRound>> PipelineProgram(int64_t pp, int64_t vpp,
                                                           int64_t num_micro, bool forward_only) {
  // The argument rules are PipelineSchedule's (stage 0 exists for every valid pp).
  absl::StatusOr<std::vector<PipelineOp>> first =
      PipelineSchedule(pp, 0, vpp, num_micro, forward_only);
  if (!first.ok()) return first.status();
  std::vector<std::vector<PipelineOp>> ops(pp);
  ops[0] = *std::move(first);
  for (int64_t s = 1; s < pp; ++s) {
    absl::StatusOr<std::vector<PipelineOp>> o =
        PipelineSchedule(pp, s, vpp, num_micro, forward_only);
    if (!o.ok()) return o.status();
    ops[s] = *std::move(o);
  }
  const int64_t last_virtual = pp * vpp - 1;
  // delivered[(activation, stage, micro, chunk)]: the round whose messages brought that input.
  std::map<std::tuple<bool, int64_t, int64_t, int64_t>, int64_t> delivered;
  auto has_input = [&](const PipelineOp& op, int64_t s, int64_t round) {
    const int64_t virt = op.chunk * pp + s;
    if (op.forward && virt == 0) return true;              // embeds its ids
    if (!op.forward && virt == last_virtual) return true;  // its forward computed the loss
    auto it = delivered.find({op.forward, s, op.micro, op.chunk});
    return it != delivered.end() && it->second < round;
  };
  std::vector<size_t> next(pp, 0);
  size_t remaining = 0;
  for (const auto& o : ops) remaining += o.size();
  std::vector<PipelineRound> rounds;
  for (int64_t round = 0; remaining > 0; ++round) {
    PipelineRound r;
    r.ops.assign(pp, PipelineOp{});
    r.has_op.assign(pp, false);
    std::vector<PipelineMessage> grads;
    for (int64_t s = 0; s < pp; ++s) {
      if (next[s] == ops[s].size()) continue;
      const PipelineOp& op = ops[s][next[s]];
      // A backward also needs its own forward: the stage's order has it earlier (every order
      // of PipelineSchedule runs F(m, c) before B(m, c)).
      if (!has_input(op, s, round)) continue;
      r.ops[s] = op;
      r.has_op[s] = true;
      ++next[s];
      --remaining;
      const int64_t virt = op.chunk * pp + s;
      if (op.forward ? virt == last_virtual : virt == 0) continue;  // nothing to hand on
      const int64_t to_virt = op.forward ? virt + 1 : virt - 1;
      PipelineMessage m;
      m.activation = op.forward;
      m.micro = op.micro;
      m.chunk = to_virt / pp;
      m.from = s;
      m.to = to_virt % pp;
      m.tag = static_cast<uint32_t>(2 * (m.micro * vpp + m.chunk) + (op.forward ? 0 : 1));
      delivered[{op.forward, m.to, m.micro, m.chunk}] = round;
      (op.forward ? r.messages : grads).push_back(m);
    }
    r.messages.insert(r.messages.end(), grads.begin(), grads.end());
    bool any = false;
    for (bool b : r.has_op) any = any || b;
    if (!any) {
      return absl::InternalError(absl::StrCat("PipelineProgram(pp ", pp, ", vpp ", vpp,
                                              ", num_micro ", num_micro, "): stuck in round ",
                                              round, " with ", remaining, " ops left"));
    }
    rounds.push_back(std::move(r));
  }
  return rounds;
}

int64_t MaxAliveMicroBatches(const std::vector<PipelineOp>& ops) {
  std::set<int64_t> alive;
  size_t most = 0;
  for (const PipelineOp& op : ops) {
    if (op.forward && op.chunk == 0) alive.insert(op.micro);
    most = std::max(most, alive.size());
    if (!op.forward && op.chunk == 0) alive.erase(op.micro);
  }
  return static_cast<int64_t>(most);
}

absl::StatusOr<int64_t> PipelineAliveMicroBatches(int64_t pp, int64_t stage, int64_t vpp,
                                                  int64_t num_micro) {
  if (absl::Status st = CheckArguments(pp, stage, vpp, num_micro); !st.ok()) return st;
  const int64_t group = pp * vpp, total = num_micro * vpp;
  const int64_t warmup = Warmup(pp, stage, vpp, num_micro);
  // Chunk-0 forwards and chunk-0 backwards among the table's first n entries (see the header).
  auto started = [&](int64_t n) { return n / group * pp + std::min(n % group, pp); };
  auto finished = [&](int64_t n) {
    return n / group * pp + std::max<int64_t>(0, n % group - (vpp - 1) * pp);
  };
  if (warmup == total) return started(total);
  int64_t most = 0;
  for (int64_t j = warmup; j < std::min(total, warmup + group); ++j) {
    most = std::max(most, started(j + 1) - finished(j - warmup));
  }
  return most;
}

absl::StatusOr<int64_t> PipelineReceiveBuffers(int64_t pp, int64_t stage, int64_t vpp,
                                               int64_t num_micro) {
  if (absl::Status st = CheckArguments(pp, stage, vpp, num_micro); !st.ok()) return st;
  if (vpp == 1) return 0;
  // 2·PP is a multiple of PP (the interleaved rule) and at least PP.
  absl::StatusOr<std::vector<PipelineRound>> program =
      PipelineProgram(pp, vpp, std::min(num_micro, 2 * pp));
  if (!program.ok()) return program.status();
  return PipelineReceiveBuffers(*program, vpp, stage);
}

int64_t PipelineReceiveBuffers(const std::vector<PipelineRound>& program, int64_t vpp,
                               int64_t stage) {
  // Trainer::InterleavedMicroBatches' buffers by (kind, micro, chunk): 0 a received activation,
  // 1 a received gradient, 2 the head chunk's input gradient; the count is taken at every take.
  std::set<std::tuple<int, int64_t, int64_t>> held;
  size_t most = 0;
  auto take = [&](int kind, int64_t micro, int64_t chunk) {
    held.insert({kind, micro, chunk});
    most = std::max(most, held.size());
  };
  for (const PipelineRound& round : program) {
    const int64_t pp = static_cast<int64_t>(round.ops.size());
    if (stage < 0 || stage >= pp) return 0;
    bool free_sent = false;
    PipelineOp sent;
    if (round.has_op[stage]) {
      const PipelineOp& op = round.ops[stage];
      const bool head = stage == pp - 1 && op.chunk == vpp - 1;  // computes the loss
      if (op.forward) {
        if (head) take(2, op.micro, op.chunk);  // ForwardBackward's input gradient, kept
        held.erase({0, op.micro, op.chunk});    // its input (none on the embedding chunk)
      } else if (head) {
        free_sent = true;  // sent in this round's messages, freed after them
        sent = op;
      } else {
        held.erase({1, op.micro, op.chunk});
      }
    }
    for (const PipelineMessage& m : round.messages) {
      if (m.to == stage) take(m.activation ? 0 : 1, m.micro, m.chunk);
    }
    if (free_sent) held.erase({2, sent.micro, sent.chunk});
  }
  return static_cast<int64_t>(most);
}

int64_t PipelineForwardOnlyBuffers(const std::vector<PipelineRound>& program, int64_t stage) {
  // Trainer::PipelineForwardOnly: a round's op frees its input after its forward, then the round's
  // messages to this stage each take a buffer.
  std::set<std::pair<int64_t, int64_t>> held;  // (micro, chunk)
  size_t most = 0;
  for (const PipelineRound& round : program) {
    if (stage < 0 || stage >= static_cast<int64_t>(round.ops.size())) return 0;
    if (round.has_op[stage]) held.erase({round.ops[stage].micro, round.ops[stage].chunk});
    for (const PipelineMessage& m : round.messages) {
      if (m.to != stage) continue;
      held.insert({m.micro, m.chunk});
      most = std::max(most, held.size());
    }
  }
  return static_cast<int64_t>(most);
}

absl::StatusOr<int64_t> PipelinePoolBuffers(int64_t pp, int64_t stage, int64_t vpp,
                                            int64_t num_micro) {
  if (absl::Status st = CheckArguments(pp, stage, vpp, num_micro); !st.ok()) return st;
  if (pp == 1) return 0;
  absl::StatusOr<int64_t> step = PipelineReceiveBuffers(pp, stage, vpp, num_micro);
  if (!step.ok()) return step.status();
  absl::StatusOr<std::vector<PipelineRound>> eval =
      PipelineProgram(pp, vpp, std::min(num_micro, 2 * pp), /*forward_only=*/true);
  if (!eval.ok()) return eval.status();
  return std::max(*step, PipelineForwardOnlyBuffers(*eval, stage));
}

}  // namespace switchyard
