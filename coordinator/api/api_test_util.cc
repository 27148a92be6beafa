#include "coordinator/api/api_test_util.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/config/validate_test_util.h"
#include "gtest/gtest.h"

namespace switchyard::api::testing {

std::string FreshPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
  return path;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = FreshPath(name);
  std::ofstream(path) << text;
  return path;
}

v1::JobSpec ValidSpec(const std::string& display_name) {
  v1::JobSpec spec = switchyard::testing::RawBaseline();
  spec.set_display_name(display_name);
  // The workers run data, tensor, context and expert parallelism (coordinator/jobs/resolve_spec.h):
  // a spec with PP above 1 is refused at submit; this one keeps it simple: the baseline's world 32
  // becomes DP 32.
  v1::ParallelConfig* p = spec.mutable_parallel();
  p->clear_tensor_model_parallel_size();
  p->clear_pipeline_model_parallel_size();
  p->set_sequence_parallel(false);
  // Under a coordinator every path is relative to its roots (common/config/job_paths.h); the
  // validation baseline names absolute ones.
  spec.mutable_training()->set_save("baseline");
  spec.mutable_data()->set_data_path(1, "a_text_document");
  spec.mutable_data()->set_data_path(3, "b_text_document");
  return spec;
}

v1::Cluster Cluster32() {
  v1::Cluster c;
  c.set_num_gpus(32);
  c.set_gpus_per_node(8);
  c.set_gpu_memory_bytes(80.0 * (1 << 30));
  c.set_intra_node_bandwidth_bytes_per_second(4.5e11);
  c.set_inter_node_bandwidth_bytes_per_second(5e10);
  c.set_peak_flops(9.89e14);
  return c;
}

std::vector<InvalidSpec> InvalidSpecs() {
  struct IntCase {
    const char* path;
    int64_t value;
    const char* needle;  // nullptr: the path
  };
  // Negative sizes, divisibility and range rules on integer fields (megatron_moe.md §5.2 and
  // common/config/validate.h).
  const IntCase kInts[] = {
      {"model.num_layers", -1},
      {"model.num_layers", 3, "model.num_layers"},  // not divisible by PP 2
      {"model.hidden_size", -1024},
      {"model.hidden_size", 1000, "model.hidden_size"},
      {"model.num_attention_heads", -16},
      {"model.num_attention_heads", 15},
      {"model.num_query_groups", -4},
      {"model.num_query_groups", 3},
      {"model.ffn_hidden_size", -4096},
      {"model.kv_channels", -64},
      {"model.seq_length", -2048},
      {"model.max_position_embeddings", -1},
      {"model.vocab_size", -32000},
      {"model.num_experts", -16},
      {"model.num_experts", 6},
      {"model.num_experts", 10},
      {"model.moe_ffn_hidden_size", -512},
      {"model.moe_router_topk", -2},
      {"model.moe_router_topk", 17},
      {"model.moe_shared_expert_intermediate_size", -1},
      {"model.moe_layer_freq", -1},
      {"parallel.tensor_model_parallel_size", -2},
      {"parallel.tensor_model_parallel_size", 3},
      {"parallel.pipeline_model_parallel_size", -2},
      {"parallel.pipeline_model_parallel_size", 3},
      {"parallel.context_parallel_size", -1},
      {"parallel.context_parallel_size", 3},
      {"parallel.expert_model_parallel_size", -4},
      {"parallel.expert_model_parallel_size", 3},
      {"parallel.expert_tensor_parallel_size", -1},
      {"parallel.expert_tensor_parallel_size", 3},
      {"parallel.world_size", -32},
      {"parallel.world_size", 6},
      {"parallel.world_size", 33},
      {"training.micro_batch_size", -2},
      {"training.global_batch_size", -1},
      {"training.global_batch_size", 30},
      {"training.train_iters", -1000},
      {"training.lr_warmup_iters", -1},
      {"training.lr_warmup_iters", 5000},
      {"training.save_interval", -100},
      {"training.log_interval", -1},
      {"min_workers", -1},
      {"min_workers", 64},
      {"max_workers", -1},
      {"max_restarts", -1},
  };
  std::vector<InvalidSpec> out;
  for (const IntCase& c : kInts) {
    // The Megatron baseline (TP 2, PP 2), so the parallel rules have sizes to break.
    v1::JobSpec spec = switchyard::testing::RawBaseline();
    switchyard::testing::SetIntField(&spec, c.path, c.value);
    out.push_back({absl::StrCat(c.path, " = ", c.value), spec, c.needle ? c.needle : c.path});
  }
  // String and list rules.
  auto add = [&out](const std::string& label, const std::string& needle, auto mutate) {
    v1::JobSpec spec = ValidSpec();
    mutate(&spec);
    out.push_back({label, spec, needle});
  };
  add("moe_router_score_function = softmx", "model.moe_router_score_function",
      [](v1::JobSpec* s) { s->mutable_model()->set_moe_router_score_function("softmx"); });
  add("moe_token_dispatcher_type = alltoallv", "model.moe_token_dispatcher_type",
      [](v1::JobSpec* s) { s->mutable_model()->set_moe_token_dispatcher_type("alltoallv"); });
  add("normalization = BatchNorm", "model.normalization",
      [](v1::JobSpec* s) { s->mutable_model()->set_normalization("BatchNorm"); });
  add("lr_decay_style = exp", "training.lr_decay_style",
      [](v1::JobSpec* s) { s->mutable_training()->set_lr_decay_style("exp"); });
  add("split = a,b,c", "data.split", [](v1::JobSpec* s) { s->mutable_data()->set_split("a,b,c"); });
  add("data_path odd", "data.data_path",
      [](v1::JobSpec* s) { s->mutable_data()->add_data_path("0.3"); });
  add("load_balancing_type bogus", "model.moe_router_load_balancing_type",
      [](v1::JobSpec* s) { s->mutable_model()->add_moe_router_load_balancing_type("bogus"); });
  add("aux_loss_coeff negative", "model.moe_aux_loss_coeff",
      [](v1::JobSpec* s) { s->mutable_model()->set_moe_aux_loss_coeff(0, -0.01); });
  add("lr negative", "training.lr", [](v1::JobSpec* s) { s->mutable_training()->set_lr(-1); });
  add("hidden_size missing", "model.hidden_size",
      [](v1::JobSpec* s) { s->mutable_model()->clear_hidden_size(); });
  add("train_iters missing", "training.train_iters",
      [](v1::JobSpec* s) { s->mutable_training()->clear_train_iters(); });
  return out;
}

std::unique_ptr<CoordinatorServer> StartServer(const std::string& store_name,
                                               const std::function<void(ServerOptions&)>& adjust) {
  ServerOptions options;
  options.store_path = FreshPath(store_name);
  options.create_store = true;  // a fresh store per test
  options.host = "127.0.0.1";
  options.token_file = WriteFile(store_name + ".token", absl::StrCat(kToken, "\n"));
  options.worker_token_file =
      WriteFile(store_name + ".worker-token", absl::StrCat(kWorkerToken, "\n"));
  const char* dir = std::getenv("TEST_TMPDIR");
  options.checkpoint_root = absl::StrCat(dir != nullptr ? dir : "/tmp", "/checkpoints");
  if (adjust) adjust(options);
  auto server = CoordinatorServer::Create(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  std::printf("coordinator on 127.0.0.1 grpc %d http %d store %s rendezvous %s\n",
              (*server)->grpc_port(), (*server)->http_port(), options.store_path.c_str(),
              (*server)->advertise_address().c_str());
  return std::move(*server);
}

std::shared_ptr<grpc::Channel> Channel(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

std::unique_ptr<grpc::ClientContext> Context(const char* token, int seconds) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (token != nullptr) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return context;
}

grpc::Status RawUnary(grpc::Channel* channel, const std::string& method, const std::string& bytes,
                      std::string* out, const char* token) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  if (token != nullptr) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  std::vector<grpc::Slice> slices;
  out->clear();
  if (status.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices)
      out->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

std::string HealthRequest(const std::string& service) {
  std::string bytes;
  if (!service.empty()) {
    bytes.push_back(0x0a);  // field 1, length-delimited
    bytes.push_back(static_cast<char>(service.size()));
    bytes += service;
  }
  return bytes;
}

}  // namespace switchyard::api::testing
