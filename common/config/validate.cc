// File: common/config/validate.cc
//
// Entry points, shared helpers, required fields and ranges, and the dense-model rules.
#include "common/config/validate.h"

#include <cassert>
#include <cmath>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/config_reflect.h"
#include "common/config/validate_internal.h"
#include "google/protobuf/descriptor.h"

namespace switchyard {
namespace validate_internal {
namespace {

constexpr int64_t kMaxParallel = int64_t{1} << 20;

struct Range {
  const char* path;
  int64_t min;
  int64_t max;
};

// Every integer size, count and interval, where set. The upper bounds are sanity limits far above
// any real model; they also keep products of sizes far from int64 overflow.
constexpr Range kRanges[] = {
    {"model.num_layers", 1, int64_t{1} << 14},
    {"model.hidden_size", 1, int64_t{1} << 20},
    {"model.num_attention_heads", 1, int64_t{1} << 16},
    {"model.num_query_groups", 1, int64_t{1} << 16},
    {"model.ffn_hidden_size", 1, int64_t{1} << 24},
    {"model.kv_channels", 1, int64_t{1} << 16},
    {"model.seq_length", 1, int64_t{1} << 24},
    {"model.max_position_embeddings", 1, int64_t{1} << 26},
    {"model.vocab_size", 1, int64_t{1} << 26},
    {"model.num_experts", 1, int64_t{1} << 16},
    {"model.moe_ffn_hidden_size", 1, int64_t{1} << 24},
    {"model.moe_router_topk", 1, int64_t{1} << 16},
    {"model.moe_router_num_groups", 1, int64_t{1} << 16},
    {"model.moe_router_group_topk", 1, int64_t{1} << 16},
    {"model.moe_shared_expert_intermediate_size", 1, int64_t{1} << 24},
    {"model.moe_layer_freq", 1, int64_t{1} << 14},
    {"parallel.tensor_model_parallel_size", 1, kMaxParallel},
    {"parallel.pipeline_model_parallel_size", 1, kMaxParallel},
    {"parallel.context_parallel_size", 1, kMaxParallel},
    {"parallel.expert_model_parallel_size", 1, kMaxParallel},
    {"parallel.expert_tensor_parallel_size", 1, kMaxParallel},
    {"parallel.virtual_pipeline_model_parallel_size", 1, int64_t{1} << 10},
    {"parallel.decoder_first_pipeline_num_layers", 1, int64_t{1} << 14},
    {"parallel.decoder_last_pipeline_num_layers", 1, int64_t{1} << 14},
    {"parallel.num_distributed_optimizer_instances", 1, kMaxParallel},
    {"parallel.world_size", 1, kMaxParallel},
    {"training.micro_batch_size", 1, int64_t{1} << 20},
    {"training.global_batch_size", 1, int64_t{1} << 30},
    {"training.train_iters", 1, int64_t{1} << 40},
    {"training.lr_warmup_iters", 0, int64_t{1} << 40},
    {"training.lr_decay_iters", 1, int64_t{1} << 40},
    {"training.save_interval", 1, int64_t{1} << 40},
    {"training.log_interval", 1, int64_t{1} << 40},
    {"training.eval_interval", 1, int64_t{1} << 40},
    {"training.eval_iters", 1, int64_t{1} << 40},
    {"min_workers", 1, kMaxParallel},
    {"max_workers", 1, kMaxParallel},
    {"max_restarts", 0, int64_t{1} << 20},
};

constexpr const char* kRequired[] = {"model.hidden_size", "model.num_attention_heads",
                                     "training.train_iters"};

// Looks up a singular scalar field by dotted path; false when a message on the way or the field
// itself is unset.
bool GetIntField(const Message& root, absl::string_view path, int64_t* out) {
  const Message* m = &root;
  std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(std::string(parts[i]));
    assert(f != nullptr && !f->is_repeated());
    const Reflection* r = m->GetReflection();
    if (!r->HasField(*m, f)) return false;
    if (i + 1 < parts.size()) {
      m = &r->GetMessage(*m, f);
    } else {
      *out =
          f->cpp_type() == FieldDescriptor::CPPTYPE_INT64 ? r->GetInt64(*m, f) : r->GetInt32(*m, f);
    }
  }
  return true;
}

void CheckFinite(const Message& m, const std::string& prefix, Violations* v) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      CheckFinite(r->GetMessage(m, f), path, v);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
      if (!f->is_repeated()) {
        double d = r->GetDouble(m, f);
        if (!std::isfinite(d)) v->Add(path, " (", Num(d), ") must be finite");
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        double d = r->GetRepeatedDouble(m, f, i);
        if (!std::isfinite(d)) {
          v->Add(path, "[", i, "] (", Num(d), ") must be finite");
        }
      }
    }
  }
}

}  // namespace

ParallelSizes ParallelSizes::From(const v1::ParallelConfig& p) {
  ParallelSizes s;
  s.tp = p.has_tensor_model_parallel_size() ? p.tensor_model_parallel_size() : 1;
  s.pp = p.has_pipeline_model_parallel_size() ? p.pipeline_model_parallel_size() : 1;
  s.cp = p.has_context_parallel_size() ? p.context_parallel_size() : 1;
  s.ep = p.has_expert_model_parallel_size() ? p.expert_model_parallel_size() : 1;
  s.etp = p.has_expert_tensor_parallel_size() ? p.expert_tensor_parallel_size() : s.tp;
  s.vpp =
      p.has_virtual_pipeline_model_parallel_size() ? p.virtual_pipeline_model_parallel_size() : 1;
  s.instances =
      p.has_num_distributed_optimizer_instances() ? p.num_distributed_optimizer_instances() : 1;
  s.world = p.has_world_size() ? p.world_size() : 0;
  s.valid = s.tp > 0 && s.pp > 0 && s.cp > 0 && s.ep > 0 && s.etp > 0 && s.vpp > 0 &&
            s.instances > 0 && s.world >= 0 && s.tp <= kMaxParallel && s.pp <= kMaxParallel &&
            s.cp <= kMaxParallel && s.ep <= kMaxParallel && s.etp <= kMaxParallel;
  return s;
}

int64_t ParallelSizes::DataParallel() const {
  if (!valid || world <= 0 || world % (tp * cp * pp) != 0) return 0;
  return world / (tp * cp * pp);
}

int64_t ParallelSizes::ExpertDataParallel() const {
  if (!valid || world <= 0 || world % (etp * ep * pp) != 0) return 0;
  return world / (etp * ep * pp);
}

std::string QuoteList(std::initializer_list<absl::string_view> values) {
  return absl::StrJoin(values, ", ", [](std::string* out, absl::string_view s) {
    absl::StrAppend(out, "\"", s, "\"");
  });
}

bool IsOneOf(absl::string_view value, std::initializer_list<absl::string_view> allowed) {
  for (absl::string_view a : allowed) {
    if (value == a) return true;
  }
  return false;
}

void CheckDivisible(Violations* v, absl::string_view path_a, int64_t a, absl::string_view path_b,
                    int64_t b) {
  if (a > 0 && b > 0 && a % b != 0) {
    v->Add(path_a, " (", a, ") must be divisible by ", path_b, " (", b, ")");
  }
}

void CheckOneOf(Violations* v, absl::string_view path, const std::string& value,
                std::initializer_list<absl::string_view> allowed) {
  if (value.empty() || IsOneOf(value, allowed)) return;
  v->Add(path, " (\"", config_internal::DisplayKey(value), "\") must be one of ",
         QuoteList(allowed));
}

void CheckRequiredAndRanges(const v1::JobSpec& spec, Violations* v) {
  for (const char* path : kRequired) {
    int64_t value = 0;
    if (!GetIntField(spec, path, &value)) v->Add(path, " is required");
  }
  for (const Range& range : kRanges) {
    int64_t value = 0;
    if (!GetIntField(spec, range.path, &value)) continue;
    if (value < range.min) {
      v->Add(range.path, " (", value, ") must be ",
             range.min == 1
                 ? "positive"
                 : (range.min == 0 ? "non-negative" : absl::StrCat("at least ", range.min)));
    } else if (value > range.max) {
      v->Add(range.path, " (", value, ") must be at most ", range.max);
    }
  }
  CheckFinite(spec, "", v);
}

void CheckModel(const v1::JobSpec& spec, Violations* v) {
  const v1::ModelConfig& m = spec.model();
  const ParallelSizes p = ParallelSizes::From(spec.parallel());
  if (!m.has_kv_channels() && m.num_attention_heads() > 0 && m.hidden_size() > 0 &&
      m.hidden_size() % m.num_attention_heads() != 0) {
    v->Add("model.hidden_size (", m.hidden_size(),
           ") must be divisible by model.num_attention_heads (", m.num_attention_heads(),
           ") when model.kv_channels is unset");
  }
  if (m.has_num_query_groups()) {
    CheckDivisible(v, "model.num_attention_heads", m.num_attention_heads(),
                   "model.num_query_groups", m.num_query_groups());
  }
  if (p.valid) {
    CheckDivisible(v, "model.num_attention_heads", m.num_attention_heads(),
                   "parallel.tensor_model_parallel_size", p.tp);
    if (m.has_num_query_groups()) {
      CheckDivisible(v, "model.num_query_groups", m.num_query_groups(),
                     "parallel.tensor_model_parallel_size", p.tp);
    }
    // Column-parallel fc1 splits F (gate and up alike) over TP.
    if (m.has_ffn_hidden_size()) {
      CheckDivisible(v, "model.ffn_hidden_size", m.ffn_hidden_size(),
                     "parallel.tensor_model_parallel_size", p.tp);
    }
    // The embedding and the LM head are vocabulary-parallel (rank r holds rows [r·V/TP, ...),
    // megatron_parallel.md §1.7-1.8). Megatron pads V to a multiple of
    // make_vocab_size_divisible_by·TP; the spec has no such field (checkpoints keep [V, H]), so V
    // itself must divide.
    if (p.tp > 1 && m.vocab_size() > 0 && m.vocab_size() % p.tp != 0) {
      v->Add("model.vocab_size (", m.vocab_size(),
             ") must be divisible by parallel.tensor_model_parallel_size (", p.tp,
             "): the embedding and the LM head are split over the TP ranks by vocabulary rows");
    }
    // The shared expert is split over TP like the dense MLP (fc1 column-, fc2 row-parallel).
    if (p.tp > 1 && m.moe_shared_expert_intermediate_size() > 0 &&
        m.moe_shared_expert_intermediate_size() % p.tp != 0) {
      v->Add("model.moe_shared_expert_intermediate_size (", m.moe_shared_expert_intermediate_size(),
             ") must be divisible by parallel.tensor_model_parallel_size (", p.tp,
             "): the shared expert is split over the TP ranks like the dense MLP");
    }
    // Sequence parallelism (on whenever TP > 1) gives every TP rank S / TP positions of each
    // sequence (megatron_parallel.md §0). With CP > 1 the 2·CP·TP rule (validate_parallel.cc)
    // covers it, so one bad seq_length gets one message.
    if (p.tp > 1 && p.cp <= 1 && m.seq_length() > 0 && m.seq_length() % p.tp != 0) {
      v->Add("model.seq_length (", m.seq_length(),
             ") must be divisible by parallel.tensor_model_parallel_size (", p.tp,
             "): sequence parallelism splits every sequence over the TP ranks");
    }
  }
  CheckOneOf(v, "model.normalization", m.normalization(), {"RMSNorm", "LayerNorm"});
  if (!m.swiglu_activation().empty() && m.swiglu_activation() != "swiglu") {
    v->Add("model.swiglu_activation (\"", config_internal::DisplayKey(m.swiglu_activation()),
           "\") must be empty or \"swiglu\" (SwiGLU is the only activation)");
  }
  if (m.has_norm_epsilon() && !(m.norm_epsilon() > 0)) {
    v->Add("model.norm_epsilon (", Num(m.norm_epsilon()), ") must be positive");
  }
  if (m.has_rotary_base() && !(m.rotary_base() > 0)) {
    v->Add("model.rotary_base (", Num(m.rotary_base()), ") must be positive");
  }
  if (m.has_init_method_std() && !(m.init_method_std() > 0)) {
    v->Add("model.init_method_std (", Num(m.init_method_std()), ") must be positive");
  }
}

}  // namespace validate_internal

std::vector<std::string> AllViolations(const v1::JobSpec& spec) {
  validate_internal::Violations v;
  validate_internal::CheckBounds(spec, &v);
  if (!v.list().empty()) return std::move(v.list());
  validate_internal::CheckRequiredAndRanges(spec, &v);
  validate_internal::CheckModel(spec, &v);
  validate_internal::CheckMoe(spec, &v);
  validate_internal::CheckParallel(spec, &v);
  validate_internal::CheckTraining(spec, &v);
  validate_internal::CheckElasticAndData(spec, &v);
  validate_internal::CheckKnobs(spec, &v);
  return std::move(v.list());
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  std::vector<std::string> violations = AllViolations(spec);
  if (violations.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(violations.front());
}

}  // namespace switchyard
