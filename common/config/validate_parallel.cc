// File: common/config/validate_parallel.cc
//
// Parallel mapping (megatron_moe.md §5.2), training schedule and optimizer, elastic range and
// data rules.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/config/parallel_rules.h"
#include "common/config/validate.h"
#include "common/config/validate_internal.h"

namespace switchyard {
namespace validate_internal {
namespace {

bool ParseNonNegative(absl::string_view text, double* out) {
  return absl::SimpleAtod(text, out) && std::isfinite(*out) && *out >= 0;
}

}  // namespace

void CheckParallel(const v1::JobSpec& spec, Violations* v) {
  const v1::ParallelConfig& pc = spec.parallel();
  const v1::ModelConfig& m = spec.model();
  const ParallelSizes p = ParallelSizes::From(pc);
  if (!p.valid) return;  // the range rules reported the bad size
  // model_parallel_config.py:502-504.
  if (pc.sequence_parallel() && p.tp <= 1) {
    v->Add("parallel.sequence_parallel requires parallel.tensor_model_parallel_size > 1 (got ",
           p.tp, ")");
  }
  if (p.ep > 1 && !m.has_num_experts()) {
    v->Add("parallel.expert_model_parallel_size (", p.ep, ") > 1 requires model.num_experts");
  }
  // arguments.py:1335-1338: causal context parallelism cuts every sequence into 2·CP chunks (rank
  // r keeps chunks r and 2·CP−1−r, megatron_parallel.md §2.1); with TP > 1 sequence parallelism
  // then splits each rank's chunks over TP, so the rule is written as 2·CP·TP.
  if (p.cp > 1 && m.seq_length() > 0 && m.seq_length() % (2 * p.cp * p.tp) != 0) {
    v->Add("model.seq_length (", m.seq_length(),
           ") must be divisible by 2 * parallel.context_parallel_size * "
           "parallel.tensor_model_parallel_size (2 * ",
           p.cp, " * ", p.tp, " = ", 2 * p.cp * p.tp,
           "): causal context parallelism splits each sequence into 2 * CP chunks");
  }
  if (pc.has_virtual_pipeline_model_parallel_size() && p.pp <= 1) {
    v->Add("parallel.virtual_pipeline_model_parallel_size (", p.vpp,
           ") requires parallel.pipeline_model_parallel_size > 1 (got ", p.pp, ")");
  }
  // How the layers split over the stages (even, or the first / last stage fixed): the one rule
  // set, which the trainer's stage assignment (common/model/pipeline_layout.h) reports too.
  if (m.num_layers() > 0 && p.pp > 0) {
    const int64_t vpp = pc.has_virtual_pipeline_model_parallel_size() && p.pp > 1 ? p.vpp : 1;
    auto given = [](bool has, int64_t v) { return has ? std::optional<int64_t>(v) : std::nullopt; };
    for (const std::string& why :
         PipelineLayoutViolations(m.num_layers(), p.pp, vpp,
                                  given(pc.has_decoder_first_pipeline_num_layers(),
                                        pc.decoder_first_pipeline_num_layers()),
                                  given(pc.has_decoder_last_pipeline_num_layers(),
                                        pc.decoder_last_pipeline_num_layers()))) {
      v->Add(why);
    }
  }
  if (p.instances > 1 && !pc.use_distributed_optimizer()) {
    v->Add("parallel.num_distributed_optimizer_instances (", p.instances,
           ") > 1 requires parallel.use_distributed_optimizer");
  }
  if (p.world <= 0) return;  // the rules below need the world size
  // parallel_state.py:823, :881-884, :922-926 and :1447-1449: the same rules ParallelLayout
  // enforces, with the job spec's field paths.
  for (std::string& message : ParallelDivisibilityViolations("parallel.", p.world, p.tp, p.cp, p.pp,
                                                             p.ep, p.etp, p.instances)) {
    v->Add(message);
  }
}

void CheckTraining(const v1::JobSpec& spec, Violations* v) {
  const v1::TrainingConfig& t = spec.training();
  const ParallelSizes p = ParallelSizes::From(spec.parallel());
  const int64_t dp = p.DataParallel();
  const int64_t mbs = t.has_micro_batch_size() ? t.micro_batch_size() : 1;
  if (dp > 0 && mbs > 0 && t.global_batch_size() > 0 && t.global_batch_size() % (mbs * dp) != 0) {
    v->Add("training.global_batch_size (", t.global_batch_size(),
           ") must be divisible by training.micro_batch_size * data-parallel size (", mbs, " * ",
           dp, " = ", mbs * dp, "; data-parallel size = parallel.world_size / (TP * CP * PP))");
  } else if (dp > 0 && mbs > 0 && t.global_batch_size() > 0 && p.pp > 1) {
    // Pipeline schedules (megatron_parallel.md, PP/VPP): 1F1B keeps up to PP micro-batches in
    // flight, so with fewer than PP every stage idles for most of the step; Switchyard refuses it
    // rather than run a schedule that is mostly bubble. The interleaved schedule walks the
    // micro-batches in groups of PP per virtual stage (schedules.py asserts
    // num_microbatches % pipeline_parallel_size == 0).
    const int64_t micro = t.global_batch_size() / (mbs * dp);
    if (micro < p.pp) {
      v->Add("training.global_batch_size / (training.micro_batch_size * data-parallel size) (",
             t.global_batch_size(), " / (", mbs, " * ", dp, ") = ", micro,
             " micro-batches) must be at least parallel.pipeline_model_parallel_size (", p.pp,
             "): the pipeline schedule needs one micro-batch per stage in flight");
    } else if (spec.parallel().has_virtual_pipeline_model_parallel_size() && p.vpp > 1 &&
               micro % p.pp != 0) {
      v->Add("training.global_batch_size / (training.micro_batch_size * data-parallel size) (",
             t.global_batch_size(), " / (", mbs, " * ", dp, ") = ", micro,
             " micro-batches) must be a multiple of parallel.pipeline_model_parallel_size (", p.pp,
             ") with parallel.virtual_pipeline_model_parallel_size (", p.vpp,
             "): the interleaved schedule runs the micro-batches in groups of PP");
    }
  }
  CheckOneOf(v, "training.lr_decay_style", t.lr_decay_style(), {"cosine", "linear", "constant"});
  if (t.has_lr() && t.lr() < 0) v->Add("training.lr (", Num(t.lr()), ") must be non-negative");
  if (t.has_min_lr() && t.min_lr() < 0) {
    v->Add("training.min_lr (", Num(t.min_lr()), ") must be non-negative");
  }
  const double lr = t.has_lr() ? t.lr() : 1e-4;
  if (t.has_min_lr() && t.min_lr() > lr) {
    v->Add("training.min_lr (", Num(t.min_lr()), ") must be at most training.lr (", Num(lr), ")");
  }
  const int64_t decay = t.has_lr_decay_iters() ? t.lr_decay_iters() : t.train_iters();
  // Megatron's scheduler asserts warmup < decay: it divides by their difference.
  if (t.lr_warmup_iters() > 0 && decay > 0 && t.lr_warmup_iters() >= decay) {
    v->Add("training.lr_warmup_iters (", t.lr_warmup_iters(),
           ") must be less than training.lr_decay_iters (", decay, ")");
  }
  if (t.has_adam_beta1() && !(t.adam_beta1() >= 0 && t.adam_beta1() < 1)) {
    v->Add("training.adam_beta1 (", Num(t.adam_beta1()), ") must be in [0, 1)");
  }
  if (t.has_adam_beta2() && !(t.adam_beta2() >= 0 && t.adam_beta2() < 1)) {
    v->Add("training.adam_beta2 (", Num(t.adam_beta2()), ") must be in [0, 1)");
  }
  if (t.has_adam_eps() && !(t.adam_eps() > 0)) {
    v->Add("training.adam_eps (", Num(t.adam_eps()), ") must be positive");
  }
  if (t.has_weight_decay() && t.weight_decay() < 0) {
    v->Add("training.weight_decay (", Num(t.weight_decay()), ") must be non-negative");
  }
  if (t.has_clip_grad() && t.clip_grad() < 0) {
    v->Add("training.clip_grad (", Num(t.clip_grad()), ") must be non-negative (0 disables)");
  }
  if (t.has_save_interval() && t.save().empty()) {
    v->Add("training.save_interval requires training.save (the checkpoint directory)");
  }
}

void CheckElasticAndData(const v1::JobSpec& spec, Violations* v) {
  if (spec.has_min_workers() && spec.has_max_workers() && spec.min_workers() > 0 &&
      spec.min_workers() > spec.max_workers()) {
    v->Add("min_workers (", spec.min_workers(), ") must be at most max_workers (",
           spec.max_workers(), ")");
  } else if (spec.parallel().world_size() > 0) {
    const int64_t w = spec.parallel().world_size();
    if (spec.has_min_workers() && spec.min_workers() > w) {
      v->Add("parallel.world_size (", w, ") must be at least min_workers (", spec.min_workers(),
             ")");
    }
    if (spec.has_max_workers() && spec.max_workers() > 0 && spec.max_workers() < w) {
      v->Add("parallel.world_size (", w, ") must be at most max_workers (", spec.max_workers(),
             ")");
    }
  }

  const v1::DataConfig& d = spec.data();
  // Megatron's weighted form: ["0.7", "prefix_a", "0.3", "prefix_b"] (IsWeightedDataPath).
  double weight = 0;
  if (IsWeightedDataPath(d)) {
    if (d.data_path_size() % 2 != 0) {
      v->Add("data.data_path has ", d.data_path_size(),
             " entries: the weighted form [weight, prefix, weight, prefix, ...] needs an even "
             "number");
    }
    for (int i = 0; i < d.data_path_size(); i += 2) {
      if (!ParseNonNegative(d.data_path(i), &weight)) {
        v->Add("data.data_path[", i, "] (\"", config_internal::DisplayKey(d.data_path(i)),
               "\") must be a non-negative weight in the weighted form [weight, prefix, ...]");
        break;
      }
    }
  }
  if (!d.split().empty()) {
    std::vector<std::string> parts = absl::StrSplit(d.split(), absl::ByAnyChar(",/"));
    double sum = 0, part = 0;
    bool ok = parts.size() <= 3;
    for (const std::string& s : parts) {
      ok = ok && ParseNonNegative(s, &part);
      sum += ok ? part : 0;
    }
    if (!ok || !(sum > 0)) {
      v->Add("data.split (\"", config_internal::DisplayKey(d.split()),
             "\") must be up to 3 non-negative numbers separated by ',' or '/' with a positive sum "
             "(e.g. \"969,30,1\")");
    } else if (spec.training().has_eval_interval()) {
      // Evaluation reads the second share (worker/train/data_split.h): a zero weight leaves it
      // empty on every dataset. (A positive weight that rounds to no document on a small dataset
      // is refused by the worker, which knows the document count.)
      double valid = 0;
      if (parts.size() < 2 || !ParseNonNegative(parts[1], &valid) || !(valid > 0)) {
        v->Add("data.split (\"", config_internal::DisplayKey(d.split()),
               "\") must give the valid split a positive weight (its second number, e.g. "
               "\"969,30,1\") when training.eval_interval is set");
      }
    }
  }
}

}  // namespace validate_internal

bool IsWeightedDataPath(const v1::DataConfig& data) {
  double weight = 0;
  return data.data_path_size() > 1 && absl::SimpleAtod(data.data_path(0), &weight);
}

}  // namespace switchyard
