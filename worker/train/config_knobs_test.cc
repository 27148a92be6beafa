// Every job-spec knob is honoured or rejected, none is accepted and ignored (DESIGN.md, "Plan";
// issue 12, item 3). The table below names, for every field of ModelConfig, ParallelConfig,
// TrainingConfig, DataConfig and JobSpec's own scalars, where it is consumed and/or which rule
// rejects the values that are not implemented. The test
//   1. enumerates the fields by proto reflection and fails when the table misses one or lists one
//      that does not exist (so a new proto field cannot land without an entry);
//   2. fails for an entry with neither a consumer nor a rejection;
//   3. for every rejection, builds the tiny MoE job with that value and asserts INVALID_ARGUMENT
//      (or UNIMPLEMENTED / NOT_FOUND where stated) naming the field, from ValidateJobSpec (what
//      the coordinator runs at submit and plan time) or else from Trainer::Create on the CPU (what
//      the worker runs).
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "data/bpe_tokenizer.h"
#include "data/indexed_dataset.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "switchyard/v1/config.pb.h"
#include "worker/train/testing/tiny_moe_spec.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

using Mutate = std::function<void(v1::JobSpec*)>;

struct Knob {
  const char* field;     // "model.num_layers"
  const char* consumer;  // where the value is used; nullptr when the field is only rejected
  // A value that is not implemented, and a text the rejection must contain (the field path).
  Mutate reject = nullptr;
  const char* needle = nullptr;
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
};

v1::ModelConfig* M(v1::JobSpec* s) { return s->mutable_model(); }
v1::ParallelConfig* P(v1::JobSpec* s) { return s->mutable_parallel(); }
v1::TrainingConfig* T(v1::JobSpec* s) { return s->mutable_training(); }
v1::DataConfig* D(v1::JobSpec* s) { return s->mutable_data(); }

const std::vector<Knob>& Table() {
  static const auto* table = new std::vector<Knob>{
      // --- ModelConfig -------------------------------------------------------------------------
      {"model.num_layers", "GptConfig::FromProto (worker/model/gpt_model.cc); planner cost model"},
      {"model.hidden_size", "GptConfig / MoELayerConfig::FromProto; planner"},
      {"model.num_attention_heads", "GptConfig::FromProto (attention heads); planner"},
      {"model.num_query_groups", "GptConfig::FromProto (GQA KV heads)"},
      {"model.ffn_hidden_size", "GptConfig::FromProto (dense SwiGLU layers)"},
      {"model.kv_channels", "GptConfig::FromProto (head_dim)"},
      {"model.seq_length", "Trainer (sample windows), router seq_aux_loss, planner"},
      {"model.max_position_embeddings", "hf_convert (HF config.json export)",
       [](v1::JobSpec* s) { M(s)->set_max_position_embeddings(8); },
       "model.max_position_embeddings (8) must be at least model.seq_length (16)"},
      {"model.vocab_size", "GptConfig::FromProto (embedding, LM head)"},
      {"model.normalization", "GptConfig::FromProto (RMSNorm)",
       [](v1::JobSpec* s) { M(s)->set_normalization("LayerNorm"); }, "model.normalization"},
      {"model.norm_epsilon", "GptConfig::FromProto (RMSNorm eps)"},
      {"model.rotary_base", "GptConfig::FromProto (RoPE base)"},
      {"model.qk_layernorm", "GptConfig::FromProto (q/k RMSNorm)"},
      {"model.untie_embeddings_and_output_weights", "GptConfig::FromProto (separate LM head)"},
      {"model.init_method_std", "GptModel parameter init"},
      {"model.add_bias_linear", nullptr, [](v1::JobSpec* s) { M(s)->set_add_bias_linear(true); },
       "model.add_bias_linear"},
      {"model.swiglu_activation", nullptr,
       [](v1::JobSpec* s) { M(s)->set_swiglu_activation("gelu"); }, "model.swiglu_activation"},
      {"model.num_experts", "MoELayerConfig::FromProto (router, experts); planner"},
      {"model.moe_ffn_hidden_size", "MoELayerConfig::FromProto (expert FFN)"},
      {"model.moe_router_topk", "MoELayerConfig::FromProto (RouterConfig.topk)"},
      {"model.moe_router_score_function", "MoELayerConfig::FromProto (softmax | sigmoid)"},
      {"model.moe_router_pre_softmax", "MoELayerConfig::FromProto (RouterConfig.pre_softmax)"},
      {"model.moe_router_num_groups", "MoELayerConfig::FromProto (group-limited routing)"},
      {"model.moe_router_group_topk", "MoELayerConfig::FromProto (group-limited routing)"},
      {"model.moe_router_enable_expert_bias", "MoELayerConfig::FromProto; Trainer bias update"},
      {"model.moe_router_bias_update_rate", "GptModel expert-bias update"},
      {"model.moe_router_topk_scaling_factor", "MoELayerConfig::FromProto"},
      {"model.moe_router_load_balancing_type", "MoELayerConfig::FromProto (aux-loss terms)"},
      {"model.moe_aux_loss_coeff", "MoELayerConfig::FromProto (aux-loss coefficients)"},
      {"model.moe_z_loss_coeff", "MoELayerConfig::FromProto (RouterConfig.z_loss_coeff)"},
      {"model.moe_input_jitter_eps", "MoELayerConfig::FromProto (router input jitter)"},
      {"model.moe_expert_capacity_factor", "MoELayerConfig::FromProto (token dropping)"},
      {"model.moe_pad_expert_input_to_capacity", "MoELayerConfig (LocalDispatcher padding)",
       [](v1::JobSpec* s) { M(s)->set_moe_pad_expert_input_to_capacity(true); },
       "model.moe_pad_expert_input_to_capacity requires"},
      {"model.moe_token_drop_policy", "MoELayerConfig::FromProto (probs | position)"},
      {"model.moe_token_dispatcher_type",
       "MoELayerConfig::FromProto: allgather (default) / alltoall dispatcher at EP > 1",
       [](v1::JobSpec* s) { M(s)->set_moe_token_dispatcher_type("flex"); },
       "model.moe_token_dispatcher_type (\"flex\") must be one of \"allgather\", \"alltoall\""},
      {"model.moe_shared_expert_intermediate_size", "MoELayerConfig (shared expert)"},
      {"model.moe_shared_expert_gate", "MoELayerConfig (shared expert gate)"},
      {"model.moe_shared_expert_overlap", "MoELayer (CUDA side stream for the shared expert)",
       [](v1::JobSpec* s) {
         M(s)->set_moe_shared_expert_overlap(true);
         M(s)->set_moe_token_dispatcher_type("allgather");
       },
       "model.moe_shared_expert_overlap requires model.moe_token_dispatcher_type \"alltoall\""},
      {"model.delay_wgrad_compute", "MoELayer (CUDA side stream for the experts' fc1 wgrad)",
       [](v1::JobSpec* s) {
         M(s)->set_delay_wgrad_compute(true);
         M(s)->set_moe_token_dispatcher_type("allgather");
       },
       "model.delay_wgrad_compute requires model.moe_token_dispatcher_type \"alltoall\""},
      {"model.moe_permute_fusion",
       "MoELayer (the experts read x and dy through the permutation's row index)"},
      {"model.moe_layer_freq", "GptConfig::FromProto (MoE layer placement)"},
      {"model.moe_layer_pattern", "GptConfig::FromProto (MoE layer placement)"},
      {"model.moe_router_dtype", "MoELayerConfig::FromProto (fp32 router)",
       [](v1::JobSpec* s) { M(s)->set_moe_router_dtype("fp64"); },
       "model.moe_router_dtype (\"fp64\") is not supported"},
      {"model.moe_grouped_gemm", "always a grouped GEMM (kernels/gemm/grouped_gemm.h)",
       [](v1::JobSpec* s) { M(s)->set_moe_grouped_gemm(false); },
       "model.moe_grouped_gemm (false) is not supported"},
      // Selective activation recompute (config.proto "activation recompute"): ModelShape's
      // flags -> GptConfig (layernorm, mlp) and MoELayerConfig (moe_act); the memory estimate.
      {"model.recompute_granularity",
       "ModelShape::FromProto -> GptConfig / MoELayerConfig recompute; EstimateEngineMemory",
       [](v1::JobSpec* s) { M(s)->set_recompute_granularity("full"); },
       "model.recompute_granularity (\"full\") is not supported"},
      {"model.recompute_modules",
       "GptModel (layernorm, mlp), MoELayer (moe_act); core_attn a documented no-op",
       [](v1::JobSpec* s) {
         M(s)->set_recompute_granularity("selective");
         M(s)->add_recompute_modules("moe");
       },
       "model.recompute_modules[0] (\"moe\") is not supported"},
      {"model.attention_backend", "Trainer::Init -> kernels::SetAttentionSettings (CUDA)",
       [](v1::JobSpec* s) { M(s)->set_attention_backend("flash"); },
       "model.attention_backend (\"flash\") must be one of \"auto\", \"cudnn\", \"native\""},
      // --- ParallelConfig ----------------------------------------------------------------------
      {"parallel.tensor_model_parallel_size",
       "planner; ParallelLayout, GptConfig.tp_size (TP with SP)",
       [](v1::JobSpec* s) { P(s)->set_tensor_model_parallel_size(2); },
       "parallel.tensor_model_parallel_size"},
      {"parallel.pipeline_model_parallel_size",
       "planner; ParallelLayout, GptConfig.pp_size (the launched layout's)",
       [](v1::JobSpec* s) { P(s)->set_pipeline_model_parallel_size(3); },
       "parallel.pipeline_model_parallel_size"},
      {"parallel.context_parallel_size",
       "planner; ParallelLayout; GptConfig.cp_size (context-parallel attention)",
       [](v1::JobSpec* s) { P(s)->set_context_parallel_size(2); },
       "parallel.context_parallel_size"},
      {"parallel.expert_model_parallel_size", "ParallelLayout, MoELayerConfig.ep_size; planner"},
      // ETP runs (MoELayerConfig.etp_size); 2 on this one-process job is still rejected (it must
      // be the launched layout's, 1 for a standalone worker).
      {"parallel.expert_tensor_parallel_size",
       "planner; ParallelLayout, MoELayerConfig.etp_size (the launched layout's)",
       [](v1::JobSpec* s) { P(s)->set_expert_tensor_parallel_size(2); },
       "parallel.expert_tensor_parallel_size"},
      {"parallel.sequence_parallel", "planner (on exactly when TP > 1)",
       [](v1::JobSpec* s) { P(s)->set_sequence_parallel(true); },
       "parallel.sequence_parallel requires parallel.tensor_model_parallel_size > 1"},
      // VPP runs (the interleaved schedule: StageLayers per chunk -> GptConfig.chunk_begin/
      // chunk_end); on this one-process job only the PP > 1 rule can be seen.
      {"parallel.virtual_pipeline_model_parallel_size",
       "trainer: StageLayers per chunk -> GptConfig.chunk_begin/chunk_end, "
       "InterleavedMicroBatches",
       [](v1::JobSpec* s) { P(s)->set_virtual_pipeline_model_parallel_size(2); },
       "parallel.virtual_pipeline_model_parallel_size (2) requires "
       "parallel.pipeline_model_parallel_size > 1"},
      // Uneven pipeline layouts: GptConfig.layer_begin/layer_end of each stage
      // (common/model/pipeline_layout.h StageLayers); on this one-process job only the PP > 1 rule
      // can be seen.
      {"parallel.decoder_first_pipeline_num_layers",
       "trainer: StageLayers -> GptConfig.layer_begin/layer_end",
       [](v1::JobSpec* s) { P(s)->set_decoder_first_pipeline_num_layers(1); },
       "parallel.decoder_first_pipeline_num_layers (1) requires "
       "parallel.pipeline_model_parallel_size > 1"},
      {"parallel.decoder_last_pipeline_num_layers",
       "trainer: StageLayers -> GptConfig.layer_begin/layer_end",
       [](v1::JobSpec* s) { P(s)->set_decoder_last_pipeline_num_layers(1); },
       "parallel.decoder_last_pipeline_num_layers (1) requires "
       "parallel.pipeline_model_parallel_size > 1"},
      {"parallel.use_distributed_optimizer", "planner (explicit value kept); placement",
       [](v1::JobSpec* s) {
         P(s)->set_use_distributed_optimizer(false);
         P(s)->set_world_size(2);
       },
       "parallel.use_distributed_optimizer (false) with parallel.world_size (2) > 1 is not "
       "supported"},
      {"parallel.num_distributed_optimizer_instances", nullptr,
       [](v1::JobSpec* s) {
         P(s)->set_use_distributed_optimizer(true);
         P(s)->set_num_distributed_optimizer_instances(2);
       },
       "parallel.num_distributed_optimizer_instances"},
      {"parallel.world_size", "Trainer (must match the launched ranks); planner; placement"},
      // --- TrainingConfig ----------------------------------------------------------------------
      {"training.micro_batch_size", "Trainer (micro-batches); planner"},
      {"training.global_batch_size", "Trainer (gradient accumulation); planner"},
      {"training.train_iters", "Trainer / RunStandalone (steps); agent"},
      {"training.lr", "LrSchedule"},
      {"training.min_lr", "LrSchedule"},
      {"training.lr_warmup_iters", "LrSchedule"},
      {"training.lr_decay_iters", "LrSchedule"},
      {"training.lr_decay_style", "LrSchedule"},
      {"training.weight_decay", "AdamW / DistributedAdamW"},
      {"training.adam_beta1", "AdamW / DistributedAdamW"},
      {"training.adam_beta2", "AdamW / DistributedAdamW"},
      {"training.adam_eps", "AdamW / DistributedAdamW"},
      {"training.clip_grad", "Trainer (global-norm clipping)"},
      {"training.seed", "Trainer (samples, init, jitter)"},
      {"training.bf16", "Trainer (CUDA dtype: bf16 unless false)",
       [](v1::JobSpec* s) { T(s)->set_bf16(true); }, "training.bf16 (true) needs a CUDA device"},
      {"training.save_interval", "RunStandalone / agent (checkpoint cadence)",
       [](v1::JobSpec* s) { T(s)->set_save_interval(5); },
       "training.save_interval requires training.save"},
      {"training.save", "Trainer::Save (checkpoint directory)"},
      {"training.load", "Trainer::Load (resume)"},
      {"training.log_interval", "RunStandalone (log lines)"},
      {"training.deterministic_mode", "Trainer::Init -> kernels::SetAttentionSettings (CUDA)"},
      {"training.eval_interval",
       "RunTrainingLoop -> Trainer::Evaluate (evaluate.cc: validation loss every N steps)",
       [](v1::JobSpec* s) { T(s)->set_eval_interval(0); },
       "training.eval_interval (0) must be positive"},
      {"training.eval_iters", "Trainer::Evaluate / RunEvaluation (global batches per evaluation)",
       [](v1::JobSpec* s) { T(s)->set_eval_iters(0); }, "training.eval_iters (0) must be positive"},
      // --- DataConfig --------------------------------------------------------------------------
      {"data.data_path", "Trainer (IndexedDataset prefix)",
       [](v1::JobSpec* s) {
         for (const char* p : {"0.5", "/data/a", "0.5", "/data/b"}) D(s)->add_data_path(p);
         D(s)->set_mock_data(false);
       },
       "data.data_path: blending several datasets is not supported",
       absl::StatusCode::kUnimplemented},
      {"data.tokenizer_type", "Trainer (with tokenizer_model)",
       [](v1::JobSpec* s) {
         D(s)->set_tokenizer_type("SentencePieceTokenizer");
         D(s)->set_tokenizer_model("/t/tokenizer.model");
       },
       "data.tokenizer_type (\"SentencePieceTokenizer\") must be one of"},
      {"data.tokenizer_model", "Trainer (BpeTokenizer::Load: default and bound of vocab_size)",
       [](v1::JobSpec* s) { D(s)->set_tokenizer_model("/nonexistent/tokenizer.json"); },
       "data.tokenizer_model (\"/nonexistent/tokenizer.json\")", absl::StatusCode::kNotFound},
      {"data.split",
       "Trainer (SplitDocuments: training reads the first share, Evaluate the second)",
       [](v1::JobSpec* s) { D(s)->set_split("969,30,1"); },
       "data.split (\"969,30,1\") needs a dataset"},
      {"data.mock_data", "Trainer (random tokens)"},
      // --- JobSpec -----------------------------------------------------------------------------
      {"display_name", "coordinator job registry; syctl"},
      {"min_workers", "planner (smallest world); scheduler (elastic range)"},
      {"max_workers", "planner (largest world); scheduler (elastic range)"},
      {"max_restarts", "coordinator job state machine"},
      {"queue", "coordinator scheduler (queue quota, position; unknown queue refused at submit)"},
      {"priority", "coordinator scheduler (admission order; range refused at submit)"},
  };
  return *table;
}

// Every scalar or repeated field of the four config messages ("model.x") and of JobSpec itself.
std::set<std::string> ProtoFields() {
  std::set<std::string> out;
  const google::protobuf::Descriptor* job = v1::JobSpec::descriptor();
  for (int i = 0; i < job->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = job->field(i);
    if (f->message_type() == nullptr) {
      out.insert(f->name());
      continue;
    }
    for (int j = 0; j < f->message_type()->field_count(); ++j) {
      out.insert(absl::StrCat(f->name(), ".", f->message_type()->field(j)->name()));
    }
  }
  return out;
}

TEST(ConfigKnobsTest, TableCoversExactlyTheProtoFields) {
  std::set<std::string> table;
  for (const Knob& k : Table()) {
    EXPECT_TRUE(table.insert(k.field).second) << "listed twice: " << k.field;
    EXPECT_TRUE(k.consumer != nullptr || k.reject != nullptr)
        << k.field << " has no consumer and no rejection rule";
    EXPECT_EQ(k.reject == nullptr, k.needle == nullptr) << k.field;
  }
  const std::set<std::string> proto = ProtoFields();
  for (const std::string& f : proto) {
    EXPECT_TRUE(table.count(f)) << f << ": a config field with no entry (consumer or rejection)";
  }
  for (const std::string& f : table) {
    EXPECT_TRUE(proto.count(f)) << f << ": listed but not a field of the proto";
  }
  int rejected = 0;
  for (const Knob& k : Table()) rejected += k.reject != nullptr;
  std::printf("%zu proto fields, %zu table entries, %d with a rejection rule\n", proto.size(),
              table.size(), rejected);
}

v1::JobSpec Base() {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml(switchyard::test_specs::TinyMoeSpecYaml(20, /*jitter=*/false));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// What the coordinator (ValidateJobSpec) and then the worker (Trainer::Create, CPU) say.
absl::Status Verdict(const v1::JobSpec& spec, std::string* where) {
  v1::JobSpec defaulted = spec;
  ApplyDefaults(&defaulted);
  absl::Status st = ValidateJobSpec(defaulted);
  *where = "ValidateJobSpec";
  if (!st.ok()) return st;
  TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF32;
  *where = "Trainer::Create";
  return Trainer::Create(spec, opt).status();
}

TEST(ConfigKnobsTest, TheBaseSpecTrains) {
  std::string where;
  const absl::Status st = Verdict(Base(), &where);
  EXPECT_TRUE(st.ok()) << where << ": " << st;
}

TEST(ConfigKnobsTest, EveryRejectionRuleRejects) {
  for (const Knob& k : Table()) {
    if (k.reject == nullptr) continue;
    v1::JobSpec spec = Base();
    k.reject(&spec);
    std::string where;
    const absl::Status st = Verdict(spec, &where);
    std::printf("%-46s %-16s %s\n", k.field, where.c_str(), std::string(st.message()).c_str());
    EXPECT_EQ(st.code(), k.code) << k.field << ": " << st;
    EXPECT_TRUE(absl::StrContains(st.message(), k.needle))
        << k.field << ": \"" << st.message() << "\" lacks \"" << k.needle << "\"";
  }
}

// model.moe_permute_fusion end to end on the CPU: the trainer says the permutation is fused, and
// three steps give bit for bit the unfused run's losses, aux losses and gradient norms (the CPU's
// gathered GEMMs gather into copies, then run the same reference).
TEST(ConfigKnobsTest, MoePermuteFusionTrainsTheSameStepsOnTheCpu) {
  std::vector<std::vector<double>> runs;
  for (const bool fused : {false, true}) {
    v1::JobSpec spec = Base();
    M(&spec)->set_moe_permute_fusion(fused);
    TrainerOptions opt;
    opt.force_dtype = true;
    opt.dtype = DType::kF32;
    auto t = Trainer::Create(spec, opt);
    ASSERT_TRUE(t.ok()) << t.status();
    const std::string described = (*t)->Describe();
    std::printf("%s\n", described.c_str());
    EXPECT_TRUE(absl::StrContains(
        described, fused ? "MoE permutation: fused into the experts" : "MoE permutation: unfused"))
        << described;
    std::vector<double> values;
    for (int step = 0; step < 3; ++step) {
      absl::StatusOr<StepResult> r = (*t)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      values.insert(values.end(), {r->loss, r->aux_loss, r->z_loss, r->grad_norm});
    }
    runs.push_back(values);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// Megatron's _get_split_indices on a few document counts (values computed with its Python).
TEST(ConfigKnobsTest, TrainDocumentsIsMegatronsFirstSplitShare) {
  struct Case {
    const char* split;
    int64_t docs, train;
  } cases[] = {{"969,30,1", 1000, 969}, {"98,2,0", 10, 10}, {"1,1", 3, 1},
               {"90/10", 7, 6},         {"100", 5, 5},      {"0.7,0.2,0.1", 9, 6}};
  for (const Case& c : cases) {
    absl::StatusOr<int64_t> got = TrainDocuments(c.split, c.docs);
    ASSERT_TRUE(got.ok()) << c.split << ": " << got.status();
    std::printf("split \"%s\" of %lld documents: %lld train\n", c.split,
                static_cast<long long>(c.docs), static_cast<long long>(*got));
    EXPECT_EQ(*got, c.train) << c.split;
  }
  for (const char* bad : {"0,1,0", "a,b", "1,2,3,4", "-1,2"}) {
    absl::StatusOr<int64_t> got = TrainDocuments(bad, 10);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(got.status().message(), "data.split")) << got.status();
  }
}

// data.split on a real indexed dataset: training reads the first share of the documents.
TEST(ConfigKnobsTest, SplitKeepsTheTrainingShareOfADataset) {
  IndexedDatasetWriter writer(IndexedDType::kUInt16);
  for (int d = 0; d < 10; ++d) {
    std::vector<int64_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back((d * 7 + i) % 64);
    ASSERT_TRUE(writer.Add(tokens).ok());
    writer.EndDocument();
  }
  const std::string prefix = TempDir() + "/split_docs";
  ASSERT_TRUE(writer.Finalize(prefix).ok());
  for (const char* split : {"60,40,0", "100,0,0"}) {
    v1::JobSpec spec = Base();
    D(&spec)->set_mock_data(false);
    D(&spec)->add_data_path(prefix);
    D(&spec)->set_split(split);
    TrainerOptions opt;
    opt.force_dtype = true;
    opt.dtype = DType::kF32;
    auto t = Trainer::Create(spec, opt);
    ASSERT_TRUE(t.ok()) << t.status();
    const std::string described = (*t)->Describe();
    std::printf("split %s: %s\n", split, described.c_str());
    const int expect = std::string(split) == "60,40,0" ? 6 : 10;
    EXPECT_TRUE(absl::StrContains(described, absl::StrCat(expect, " training documents")))
        << described;
    ASSERT_TRUE((*t)->Step().ok());
  }
}

// data.tokenizer_model: its vocabulary is the default model.vocab_size and a lower bound.
TEST(ConfigKnobsTest, TokenizerModelDecidesAndBoundsTheVocabulary) {
  absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Train(
      {"the quick brown fox jumps over the lazy dog", "the lazy dog sleeps; the fox jumps"}, 270);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string path = TempDir() + "/knobs_tokenizer.json";
  ASSERT_TRUE(tok->Save(path).ok());
  TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF32;

  v1::JobSpec spec = Base();
  M(&spec)->clear_vocab_size();
  D(&spec)->set_tokenizer_type("HuggingFaceTokenizer");
  D(&spec)->set_tokenizer_model(path);
  auto t = Trainer::Create(spec, opt);
  ASSERT_TRUE(t.ok()) << t.status();
  std::printf("tokenizer %lld tokens -> model.vocab_size %d\n",
              static_cast<long long>(tok->vocab_size()), (*t)->spec().model().vocab_size());
  EXPECT_EQ((*t)->tokenizer_vocab(), tok->vocab_size());
  EXPECT_EQ((*t)->spec().model().vocab_size(), tok->vocab_size());

  M(&spec)->set_vocab_size(static_cast<int32_t>(tok->vocab_size() - 1));
  auto small = Trainer::Create(spec, opt);
  std::printf("vocab_size %lld: %s\n", static_cast<long long>(tok->vocab_size() - 1),
              small.status().ToString().c_str());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(small.status().message(), "model.vocab_size"));

  M(&spec)->set_vocab_size(512);  // padded above the tokenizer, as Megatron pads: fine
  EXPECT_TRUE(Trainer::Create(spec, opt).ok());
}

}  // namespace
}  // namespace switchyard::train
