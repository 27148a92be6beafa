// File: common/config/validate_test_util.cc
#include "common/config/validate_test_util.h"

#include <cstdio>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace testing {

v1::JobSpec RawBaseline() {
  v1::JobSpec spec;
  spec.set_display_name("baseline");
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(8);
  m->set_hidden_size(1024);
  m->set_num_attention_heads(16);
  m->set_num_query_groups(4);
  m->set_ffn_hidden_size(4096);
  m->set_seq_length(2048);
  m->set_vocab_size(32000);
  m->set_num_experts(16);
  m->set_moe_ffn_hidden_size(512);
  m->set_moe_router_topk(2);
  m->add_moe_router_load_balancing_type("aux_loss");
  m->add_moe_aux_loss_coeff(0.01);
  m->set_moe_token_dispatcher_type("alltoall");
  v1::ParallelConfig* p = spec.mutable_parallel();
  p->set_tensor_model_parallel_size(2);
  p->set_sequence_parallel(true);
  p->set_pipeline_model_parallel_size(2);
  p->set_expert_model_parallel_size(4);
  p->set_expert_tensor_parallel_size(1);
  p->set_use_distributed_optimizer(true);
  p->set_world_size(32);
  v1::TrainingConfig* t = spec.mutable_training();
  t->set_micro_batch_size(2);
  t->set_train_iters(1000);
  t->set_lr(3e-4);
  t->set_min_lr(3e-5);
  t->set_lr_warmup_iters(100);
  t->set_save_interval(100);
  t->set_save("/checkpoints/baseline");
  v1::DataConfig* d = spec.mutable_data();
  for (const char* s : {"0.5", "/data/a_text_document", "0.5", "/data/b_text_document"}) {
    d->add_data_path(s);
  }
  d->set_split("98,2,0");
  return spec;
}

void ExpectViolation(v1::JobSpec spec, const std::vector<std::string>& needles, bool only) {
  ApplyDefaults(&spec);
  absl::Status status = ValidateJobSpec(spec);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  std::printf("  violation: %s\n", std::string(status.message()).c_str());
  for (const std::string& needle : needles) {
    EXPECT_NE(status.message().find(needle), absl::string_view::npos)
        << "message: " << status.message() << "\nexpected to contain: " << needle;
  }
  if (only) {
    std::vector<std::string> all = AllViolations(spec);
    EXPECT_EQ(all.size(), 1u) << "expected exactly one violation, got:\n"
                              << absl::StrJoin(all, "\n");
  }
}

void ExpectValid(v1::JobSpec spec) {
  ApplyDefaults(&spec);
  std::vector<std::string> all = AllViolations(spec);
  EXPECT_TRUE(all.empty()) << absl::StrJoin(all, "\n");
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

void SetIntField(v1::JobSpec* spec, absl::string_view path, int64_t value) {
  google::protobuf::Message* m = spec;
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const google::protobuf::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    ASSERT_NE(f, nullptr) << path;
    if (i + 1 < parts.size()) {
      m = m->GetReflection()->MutableMessage(m, f);
    } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT64) {
      m->GetReflection()->SetInt64(m, f, value);
    } else {
      m->GetReflection()->SetInt32(m, f, static_cast<int32_t>(value));
    }
  }
}

}  // namespace testing
}  // namespace switchyard
