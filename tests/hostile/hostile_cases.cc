// File: tests/hostile/hostile_cases.cc
#include "tests/hostile/hostile_cases.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "nlohmann/json.hpp"

namespace switchyard::hostile {
namespace {

using Json = nlohmann::json;
using e2e::kToken;

constexpr int kExitFailure = 1;     // syctl: server error or unreadable spec
constexpr int kExitConnection = 3;  // syctl: no token or refused token

// A valid spec the no-corpus coordinator accepts (mock data, vocab given).
Json BaseSpec() {
  return Json::parse(R"json({
    "display_name": "hostile-base",
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
              "seq_length": 32, "vocab_size": 256, "num_experts": 4, "moe_router_topk": 2},
    "parallel": {"expert_model_parallel_size": 2},
    "training": {"micro_batch_size": 1, "global_batch_size": 4, "train_iters": 10, "lr": 0.001,
                 "lr_warmup_iters": 2, "lr_decay_iters": 10},
    "data": {"mock_data": true}
  })json");
}

// --- calls --------------------------------------------------------------------------------

httplib::Client RestClient(Env& env) {
  httplib::Client client("127.0.0.1", env.coordinator().http_port());
  client.set_read_timeout(30, 0);
  client.set_write_timeout(30, 0);
  return client;
}

Outcome FromHttp(const httplib::Result& r) {
  Outcome out;
  if (!r) {
    out.message = absl::StrCat("no HTTP response: ", httplib::to_string(r.error()));
    return out;
  }
  out.code = r->status;
  const Json body = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("error") && body["error"].contains("message")) {
    out.message = body["error"]["message"].get<std::string>();
    if (body["error"].contains("status")) {
      out.message += absl::StrCat(" [", body["error"]["status"].get<std::string>(), "]");
    }
  } else {
    out.message = r->body;
  }
  return out;
}

Outcome Rest(Env& env, const std::string& method, const std::string& path,
             const std::string& body = "", bool token = true,
             const std::string& token_value = kToken) {
  httplib::Client client = RestClient(env);
  httplib::Headers headers;
  if (token) headers.emplace("Authorization", absl::StrCat("Bearer ", token_value));
  if (method == "GET") return FromHttp(client.Get(path.c_str(), headers));
  return FromHttp(client.Post(path.c_str(), headers, body, "application/json"));
}

Outcome FromGrpc(const grpc::Status& s) {
  Outcome out;
  out.code = s.error_code();
  out.message = s.error_message();
  return out;
}

std::unique_ptr<grpc::ClientContext> GrpcContext(bool token = true,
                                                 const std::string& token_value = kToken) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (token) context->AddMetadata("authorization", absl::StrCat("Bearer ", token_value));
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return context;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// syctl with the coordinator and token prepended (unless `auth` is false; then `extra_global`
// gives the token flags), stdout and stderr captured.
Outcome Syctl(Env& env, const std::vector<std::string>& args, bool auth = true) {
  const std::string out_path = env.NewPath(".out");
  const std::string err_path = env.NewPath(".err");
  std::string command =
      absl::StrCat("'", env.syctl(), "' --coordinator ", env.coordinator().grpc_address());
  if (auth) absl::StrAppend(&command, " --token-file '", env.token_file(), "'");
  for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
  absl::StrAppend(&command, " >'", out_path, "' 2>'", err_path, "' </dev/null");
  const int status = std::system(command.c_str());
  Outcome out;
  out.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  out.message = ReadAll(err_path);
  out.printed = ReadAll(out_path) + out.message;
  return out;
}

Outcome SyctlSubmitText(Env& env, const std::string& text, const std::string& suffix) {
  const std::string path = env.NewPath(suffix);
  std::ofstream(path, std::ios::binary) << text;
  return Syctl(env, {"submit", "-f", path});
}

// --- the tables -----------------------------------------------------------------------------

struct SpecCase {
  const char* name;
  std::function<void(Json&)> patch;
  std::vector<std::string> needles;  // field path and rule
};

std::string Repeat(size_t n, char c) { return std::string(n, c); }

// Bad job specs, each expressible as a JobSpec message (so all three doors can send it).
std::vector<SpecCase> SpecCases() {
  return {
      // Bounds.
      {"display_name_257_bytes",
       [](Json& s) { s["display_name"] = Repeat(257, 'n'); },
       {"display_name (257 bytes) must be at most 256 bytes"}},
      {"display_name_3_5_MiB",
       [](Json& s) { s["display_name"] = Repeat(3670016, 'n'); },
       {"spec (", "bytes serialized) must be at most 65536 bytes"}},
      {"display_name_bell",
       [](Json& s) { s["display_name"] = "ding\a"; },
       {"display_name must not contain control characters (byte 0x07 at offset 4)"}},
      {"display_name_newline",
       [](Json& s) { s["display_name"] = "two\nlines"; },
       {"display_name must not contain control characters (byte 0x0A"}},
      {"display_name_terminal_escape",
       [](Json& s) { s["display_name"] = "\x1b[2J\x1b[31mred"; },
       {"display_name must not contain control characters (byte 0x1B at offset 0)"}},
      {"display_name_del",
       [](Json& s) { s["display_name"] = "del\x7f"; },
       {"display_name must not contain control characters (byte 0x7F"}},
      {"display_name_c1_csi",
       [](Json& s) { s["display_name"] = "c1\xc2\x9b"; },
       {"display_name must not contain control characters (byte 0xC2"}},
      {"display_name_nul",
       [](Json& s) { s["display_name"] = std::string("nul\0x", 5); },
       {"display_name must not contain control characters (byte 0x00"}},
      {"save_4097_bytes",
       [](Json& s) { s["training"]["save"] = "/" + Repeat(4096, 's'); },
       {"training.save (4097 bytes) must be at most 4096 bytes"}},
      {"save_newline",
       [](Json& s) { s["training"]["save"] = "/ckpt\n/evil"; },
       {"training.save must not contain control characters"}},
      {"load_tab",
       [](Json& s) { s["training"]["load"] = "/ckpt\t1"; },
       {"training.load must not contain control characters (byte 0x09"}},
      {"data_path_control",
       [](Json& s) {
         s["data"] = {{"data_path", {"/data/x\x01"}}};
       },
       {"data.data_path[0] must not contain control characters"}},
      {"data_path_1025_entries",
       [](Json& s) {
         s["data"] = {{"data_path", Json::array()}};
         for (int i = 0; i < 1025; ++i) s["data"]["data_path"].push_back("/d");
       },
       {"data.data_path (1025 entries) must have at most 1024 entries"}},
      {"tokenizer_model_4097_bytes",
       [](Json& s) { s["data"]["tokenizer_model"] = "/" + Repeat(4096, 't'); },
       {"data.tokenizer_model (4097 bytes) must be at most 4096 bytes"}},
      {"score_function_65_bytes",
       [](Json& s) { s["model"]["moe_router_score_function"] = Repeat(65, 'f'); },
       {"model.moe_router_score_function (65 bytes) must be at most 64 bytes"}},
      {"aux_loss_coeff_9_entries",
       [](Json& s) {
         s["model"]["moe_aux_loss_coeff"] = Json::array();
         for (int i = 0; i < 9; ++i) s["model"]["moe_aux_loss_coeff"].push_back(0.01);
       },
       {"model.moe_aux_loss_coeff (9 entries) must have at most 8 entries"}},
      // Required fields and ranges.
      {"hidden_size_zero",
       [](Json& s) { s["model"]["hidden_size"] = 0; },
       {"model.hidden_size (0) must be positive"}},
      {"hidden_size_negative",
       [](Json& s) { s["model"]["hidden_size"] = -64; },
       {"model.hidden_size (-64) must be positive"}},
      {"num_layers_huge",
       [](Json& s) { s["model"]["num_layers"] = 100000; },
       {"model.num_layers (100000) must be at most 16384"}},
      {"seq_length_zero",
       [](Json& s) { s["model"]["seq_length"] = 0; },
       {"model.seq_length (0) must be positive"}},
      {"train_iters_missing",
       [](Json& s) { s["training"].erase("train_iters"); },
       {"training.train_iters is required"}},
      {"micro_batch_zero",
       [](Json& s) { s["training"]["micro_batch_size"] = 0; },
       {"training.micro_batch_size (0) must be positive"}},
      {"max_restarts_negative",
       [](Json& s) { s["max_restarts"] = -1; },
       {"max_restarts (-1) must be non-negative"}},
      {"world_size_zero",
       [](Json& s) { s["parallel"]["world_size"] = 0; },
       {"parallel.world_size (0) must be positive"}},
      {"lr_nan",
       [](Json& s) { s["training"]["lr"] = "NaN"; },
       {"training.lr (nan) must be finite"}},
      {"lr_infinity",
       [](Json& s) { s["training"]["lr"] = "Infinity"; },
       {"training.lr (inf) must be finite"}},
      // Model, MoE, parallel, training rules.
      {"heads_do_not_divide_hidden",
       [](Json& s) {
         s["model"]["num_attention_heads"] = 3;
         s["model"].erase("num_query_groups");
       },
       {"model.hidden_size (64) must be divisible by model.num_attention_heads (3)"}},
      {"heads_not_divisible_by_query_groups",
       [](Json& s) { s["model"]["num_query_groups"] = 3; },
       {"model.num_attention_heads (4) must be divisible by model.num_query_groups (3)"}},
      {"experts_not_divisible_by_ep",
       [](Json& s) { s["model"]["num_experts"] = 3; },
       {"model.num_experts (3) must be divisible by parallel.expert_model_parallel_size (2)"}},
      {"topk_above_experts",
       [](Json& s) { s["model"]["moe_router_topk"] = 5; },
       {"model.moe_router_topk (5)", "model.num_experts (4)"}},
      {"score_function_unknown",
       [](Json& s) { s["model"]["moe_router_score_function"] = "softmx"; },
       {"model.moe_router_score_function (\"softmx\") must be one of"}},
      {"normalization_unknown",
       [](Json& s) { s["model"]["normalization"] = "BatchNorm"; },
       {"model.normalization (\"BatchNorm\") must be one of"}},
      {"dispatcher_unknown",
       [](Json& s) { s["model"]["moe_token_dispatcher_type"] = "mpi"; },
       {"model.moe_token_dispatcher_type (\"mpi\") must be one of"}},
      {"decay_style_unknown",
       [](Json& s) { s["training"]["lr_decay_style"] = "exp"; },
       {"training.lr_decay_style (\"exp\") must be one of"}},
      {"warmup_not_below_decay",
       [](Json& s) { s["training"]["lr_warmup_iters"] = 10; },
       {"training.lr_warmup_iters (10)", "training.lr_decay_iters (10)"}},
      {"min_workers_above_max",
       [](Json& s) {
         s["min_workers"] = 4;
         s["max_workers"] = 2;
       },
       {"min_workers (4)", "max_workers (2)"}},
      // Submit-only rules (jobs/resolve_spec.h).
      {"vocab_size_missing_no_corpus",
       [](Json& s) {
         s["model"].erase("vocab_size");
         s.erase("data");
       },
       {"model.vocab_size is required: the job reads the default corpus"}},
      {"vocab_size_missing_mock_data",
       [](Json& s) { s["model"].erase("vocab_size"); },
       {"model.vocab_size is required with data.mock_data"}},
      // PP runs in the workers (1F1B and, with virtual stages, interleaved 1F1B); layers that
      // do not divide into PP·VPP chunks are refused at submit.
      {"virtual_pipeline_2_layers_2",
       [](Json& s) {
         s["model"]["num_layers"] = 2;
         s["model"]["untie_embeddings_and_output_weights"] = true;
         s["parallel"]["pipeline_model_parallel_size"] = 2;
         s["parallel"]["virtual_pipeline_model_parallel_size"] = 2;
       },
       {"model.num_layers (2) must be divisible by parallel.pipeline_model_parallel_size * "
        "parallel.virtual_pipeline_model_parallel_size (2 * 2 = 4)"}},
      // CP runs in the workers; a size whose 2·CP chunks do not divide the sequence does not.
      {"context_parallel_3",
       [](Json& s) { s["parallel"]["context_parallel_size"] = 3; },
       {"model.seq_length (32) must be divisible by 2 * parallel.context_parallel_size * "
        "parallel.tensor_model_parallel_size (2 * 3 * 1 = 6)"}},
  };
}

struct BodyCase {
  const char* name;
  std::string spec_text;  // the spec document (REST wraps it as {"spec": ...})
  std::vector<std::string> needles;
};

// Documents that are not a valid JobSpec: syntax and types.
std::vector<BodyCase> BodyCases() {
  return {
      {"truncated_json", R"({"model": {"hidden_size": 64)", {"invalid JSON"}},
      {"hidden_size_string", R"({"model": {"hidden_size": "abc"}})", {"model.hidden_size"}},
      {"hidden_size_fraction", R"({"model": {"hidden_size": 64.5}})", {"model.hidden_size"}},
      {"hidden_size_overflow", R"({"model": {"hidden_size": 99999999999}})", {"model.hidden_size"}},
      {"unknown_field", R"({"model": {"hidden_sizee": 64}})", {"hidden_sizee"}},
      {"model_is_number", R"({"model": 5})", {"model"}},
      {"display_name_number", R"({"display_name": 5})", {"display_name"}},
      {"data_path_not_list", R"({"data": {"data_path": {"a": 1}}})", {"data.data_path"}},
      {"mock_data_string", R"({"data": {"mock_data": "yes"}})", {"data.mock_data"}},
  };
}

}  // namespace

const char* ViaName(Via via) {
  switch (via) {
    case Via::kRest:
      return "rest";
    case Via::kGrpc:
      return "grpc";
    case Via::kSyctl:
      return "syctl";
  }
  return "?";
}

std::unique_ptr<Env> Env::Start(const std::string& coordinator, const std::string& syctl) {
  std::unique_ptr<Env> env(new Env());
  env->syctl_ = syctl;
  e2e::CoordinatorFlags flags;
  flags.binary = coordinator;
  flags.store = e2e::TmpPath("hostile.db");
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((flags.store + suffix).c_str());
  flags.token_file = e2e::TmpPath("hostile.token");
  e2e::WriteText(flags.token_file, absl::StrCat(kToken, "\n"));
  env->token_file_ = flags.token_file;
  flags.worker_token_file = e2e::TmpPath("hostile.worker-token");
  e2e::WriteText(flags.worker_token_file, "hostile-worker-token\n");
  flags.checkpoint_root = e2e::TmpPath("hostile_checkpoints");
  flags.log_path = e2e::TmpPath("hostile_coordinator.log");
  env->coordinator_ = e2e::CoordinatorProcess::Start(flags);
  if (env->coordinator_ == nullptr) return nullptr;
  auto channel =
      grpc::CreateChannel(env->coordinator_->grpc_address(), grpc::InsecureChannelCredentials());
  env->jobs_ = v1::JobService::NewStub(channel);
  env->plans_ = v1::PlanService::NewStub(channel);
  // The sentinel job: cases must leave it and the job count alone.
  httplib::Client client = RestClient(*env);
  Json body = {{"spec", BaseSpec()}};
  body["spec"]["display_name"] = "sentinel";
  auto r = client.Post("/v1/jobs", e2e::AuthHeaders(), body.dump(), "application/json");
  if (!r || r->status != 200) {
    std::printf("sentinel job not created: %s\n", r ? r->body.c_str() : "no response");
    return nullptr;
  }
  // No worker ever attaches: the scheduler records one WAITING_FOR_WORKERS event for it, then
  // nothing more. Wait for that event so the cases compare a stable event log.
  for (int i = 0; i < 200; ++i) {
    v1::GetJobRequest get;
    get.set_name("jobs/1");
    v1::Job sentinel;
    if (env->jobs_->GetJob(GrpcContext().get(), get, &sentinel).ok() &&
        sentinel.last_event().reason() == "WAITING_FOR_WORKERS") {
      std::printf("sentinel jobs/1 waits: %s\n", sentinel.last_event().message().c_str());
      return env;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("the sentinel job got no WAITING_FOR_WORKERS event within 10 s\n");
  return nullptr;
}

std::string Env::NewPath(const std::string& suffix) {
  return e2e::TmpPath(absl::StrCat("hostile_", ++files_, suffix));
}

Snapshot TakeSnapshot(Env& env) {
  Snapshot s;
  httplib::Client client = RestClient(env);
  auto health = client.Get("/healthz");
  v1::ListJobsRequest list;
  list.set_page_size(1000);
  v1::ListJobsResponse page;
  grpc::Status listed = env.jobs().ListJobs(GrpcContext().get(), list, &page);
  v1::GetJobRequest get;
  get.set_name("jobs/1");
  v1::Job sentinel;
  grpc::Status got = env.jobs().GetJob(GrpcContext().get(), get, &sentinel);
  s.ok = health && health->status == 200 && listed.ok() && got.ok();
  s.jobs = page.jobs_size();
  s.sentinel_events = sentinel.last_event().sequence();
  return s;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  const int kInvalid = grpc::StatusCode::INVALID_ARGUMENT;

  for (const SpecCase& sc : SpecCases()) {
    Json spec = BaseSpec();
    sc.patch(spec);
    const std::string text = spec.dump();
    cases.push_back({sc.name, Via::kRest,
                     [text](Env& env) {
                       return Rest(env, "POST", "/v1/jobs",
                                   absl::StrCat(R"({"spec": )", text, "}"));
                     },
                     400, sc.needles});
    cases.back().needles.push_back("INVALID_ARGUMENT");
    cases.push_back({sc.name, Via::kGrpc,
                     [text](Env& env) {
                       v1::CreateJobRequest request;
                       absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(text);
                       if (!spec.ok()) {
                         return Outcome{-1, absl::StrCat("test bug: ", spec.status().message())};
                       }
                       *request.mutable_spec() = *spec;
                       v1::Job job;
                       return FromGrpc(env.jobs().CreateJob(GrpcContext().get(), request, &job));
                     },
                     kInvalid, sc.needles});
    cases.push_back({sc.name, Via::kSyctl,
                     [text](Env& env) { return SyctlSubmitText(env, text, ".json"); }, kExitFailure,
                     sc.needles});
    cases.back().needles.push_back("INVALID_ARGUMENT");
  }

  for (const BodyCase& bc : BodyCases()) {
    const std::string text = bc.spec_text;
    cases.push_back({bc.name, Via::kRest,
                     [text](Env& env) {
                       return Rest(env, "POST", "/v1/jobs",
                                   absl::StrCat(R"({"spec": )", text, "}"));
                     },
                     400, bc.needles});
    cases.push_back({bc.name, Via::kSyctl,
                     [text](Env& env) { return SyctlSubmitText(env, text, ".json"); }, kExitFailure,
                     bc.needles});
  }
  // REST bodies that are not even a request.
  for (const auto& [name, body] : std::vector<std::pair<std::string, std::string>>{
           {"empty_body", ""},
           {"array_body", "[]"},
           {"string_body", "\"spec\""},
           {"binary_body", std::string("\x00\xff\xfe{", 4)},
           {"spec_is_null", R"({"spec": null})"},
       }) {
    cases.push_back({name,
                     Via::kRest,
                     [body = body](Env& env) { return Rest(env, "POST", "/v1/jobs", body); },
                     400,
                     {"INVALID_ARGUMENT"}});
  }
  cases.push_back({"yaml_unclosed_list",
                   Via::kSyctl,
                   [](Env& env) { return SyctlSubmitText(env, "model: [1, 2\n", ".yaml"); },
                   kExitFailure,
                   {"invalid YAML"}});
  cases.push_back(
      {"yaml_tab_indent",
       Via::kSyctl,
       [](Env& env) { return SyctlSubmitText(env, "model:\n\thidden_size: 64\n", ".yaml"); },
       kExitFailure,
       {"invalid YAML at line 2"}});
  cases.push_back(
      {"yaml_wrong_type",
       Via::kSyctl,
       [](Env& env) { return SyctlSubmitText(env, "model:\n  num_layers: many\n", ".yaml"); },
       kExitFailure,
       {"model.num_layers"}});

  // Request ids.
  for (const auto& [name, id] : std::vector<std::pair<std::string, std::string>>{
           {"request_id_space", "run 42"},
           {"request_id_control", "run\x1b[2J"},
           {"request_id_129_bytes", Repeat(129, 'r')},
           {"request_id_slash", "../../etc"},
       }) {
    const std::string request_id = id;
    cases.push_back({name,
                     Via::kRest,
                     [request_id](Env& env) {
                       Json body = {{"spec", BaseSpec()}, {"request_id", request_id}};
                       return Rest(env, "POST", "/v1/jobs", body.dump());
                     },
                     400,
                     {"request_id", "must be at most 128 characters of"}});
    cases.push_back({name,
                     Via::kGrpc,
                     [request_id](Env& env) {
                       v1::CreateJobRequest request;
                       *request.mutable_spec() = *ParseJobSpecJson(BaseSpec().dump());
                       request.set_request_id(request_id);
                       v1::Job job;
                       return FromGrpc(env.jobs().CreateJob(GrpcContext().get(), request, &job));
                     },
                     kInvalid,
                     {"request_id", "must be at most 128 characters of"}});
    cases.push_back({name,
                     Via::kSyctl,
                     [request_id](Env& env) {
                       const std::string path = env.NewPath(".json");
                       std::ofstream(path) << BaseSpec().dump();
                       return Syctl(env, {"submit", "-f", path, "--request-id", request_id});
                     },
                     kExitFailure,
                     {"request_id"}});
  }

  // Job names: malformed and unknown.
  for (const auto& [name, job, want_http, want_grpc, needle] :
       std::vector<std::tuple<std::string, std::string, int, int, std::string>>{
           {"name_letters", "abc", 400, kInvalid, "must be jobs/{id} with id a positive integer"},
           {"name_zero", "0", 400, kInvalid, "must be jobs/{id} with id a positive integer"},
           {"name_leading_zero", "01", 400, kInvalid, "must be jobs/{id}"},
           {"name_negative", "-1", 400, kInvalid, "must be jobs/{id}"},
           {"name_huge", "99999999999999999999999", 400, kInvalid, "must be jobs/{id}"},
           {"name_unknown", "999", 404, grpc::StatusCode::NOT_FOUND, "jobs/999 does not exist"},
       }) {
    const std::string id = job;
    const std::string n = needle;
    cases.push_back({absl::StrCat("get_", name),
                     Via::kRest,
                     [id](Env& env) { return Rest(env, "GET", "/v1/jobs/" + id); },
                     want_http,
                     {n}});
    cases.push_back({absl::StrCat("cancel_", name),
                     Via::kRest,
                     [id](Env& env) { return Rest(env, "POST", "/v1/jobs/" + id + ":cancel"); },
                     want_http,
                     {n}});
    cases.push_back({absl::StrCat("get_", name),
                     Via::kGrpc,
                     [id](Env& env) {
                       v1::GetJobRequest request;
                       request.set_name("jobs/" + id);
                       v1::Job out;
                       return FromGrpc(env.jobs().GetJob(GrpcContext().get(), request, &out));
                     },
                     want_grpc,
                     {n}});
    cases.push_back({absl::StrCat("cancel_", name),
                     Via::kGrpc,
                     [id](Env& env) {
                       v1::CancelJobRequest request;
                       request.set_name("jobs/" + id);
                       v1::Job out;
                       return FromGrpc(env.jobs().CancelJob(GrpcContext().get(), request, &out));
                     },
                     want_grpc,
                     {n}});
    // syctl reads "-1" as a flag: a usage error (exit 2) naming it, before any call.
    const bool flag_like = id[0] == '-';
    cases.push_back({absl::StrCat("get_", name),
                     Via::kSyctl,
                     [id](Env& env) {
                       return Syctl(env, {"get", id});
                     },
                     flag_like ? 2 : kExitFailure,
                     {flag_like ? std::string("unknown flag '-1'") : n}});
  }
  cases.push_back({"get_control_name",
                   Via::kGrpc,
                   [](Env& env) {
                     v1::GetJobRequest request;
                     request.set_name("jobs/1\x1b[2J");
                     v1::Job out;
                     return FromGrpc(env.jobs().GetJob(GrpcContext().get(), request, &out));
                   },
                   kInvalid,
                   {"name (\"jobs/1\\x1b[2J\") must be jobs/{id}"}});
  cases.push_back({"get_control_name",
                   Via::kSyctl,
                   [](Env& env) {
                     return Syctl(env, {"get", "1\x1b[2J"});
                   },
                   kExitFailure,
                   {"must be jobs/{id}"}});

  // List parameters.
  const std::string long_token(300, 'A');
  for (const auto& [name, query, needle] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"page_token_garbage", "page_token=%21%21%21", "page_token: malformed"},
           {"page_token_300_bytes", "page_token=" + long_token,
            "page_token (300 bytes) must be at most 256 bytes"},
           {"page_token_other_version", "page_token=cDI6MDoy", "page_token: malformed"},
           {"page_size_negative", "page_size=-1", "page_size (-1) must be non-negative"},
           {"page_size_not_integer", "page_size=ten", "page_size: \"ten\" is not a 32-bit integer"},
           {"state_unknown", "state=SLEEPING", "state: \"SLEEPING\" is not a job state"},
           {"unknown_parameter", "color=red", "color: unknown query parameter"},
       }) {
    const std::string q = query;
    cases.push_back({name,
                     Via::kRest,
                     [q](Env& env) { return Rest(env, "GET", "/v1/jobs?" + q); },
                     400,
                     {needle}});
  }
  for (const auto& [name, token, size, state, needle] :
       std::vector<std::tuple<std::string, std::string, int, int, std::string>>{
           {"page_token_garbage", "!!!", 0, 0, "page_token: malformed"},
           {"page_token_300_bytes", long_token, 0, 0,
            "page_token (300 bytes) must be at most 256 bytes"},
           {"page_token_other_state", "cDE6MDox", 0, 1, "page_token: issued for state"},
           {"page_size_negative", "", -1, 0, "page_size (-1) must be non-negative"},
           {"state_out_of_range", "", 0, 99, "state (99) is not a Job.State"},
       }) {
    const std::string t = token;
    const int sz = size;
    const int st = state;
    cases.push_back({name,
                     Via::kGrpc,
                     [t, sz, st](Env& env) {
                       v1::ListJobsRequest request;
                       request.set_page_token(t);
                       request.set_page_size(sz);
                       request.set_state(static_cast<v1::Job::State>(st));
                       v1::ListJobsResponse out;
                       return FromGrpc(env.jobs().ListJobs(GrpcContext().get(), request, &out));
                     },
                     kInvalid,
                     {needle}});
  }
  cases.push_back({"page_token_garbage",
                   Via::kSyctl,
                   [](Env& env) {
                     return Syctl(env, {"list", "--page-token", "!!!"});
                   },
                   kExitFailure,
                   {"page_token: malformed"}});
  cases.push_back({"page_token_300_bytes",
                   Via::kSyctl,
                   [long_token](Env& env) {
                     return Syctl(env, {"list", "--page-token", long_token});
                   },
                   kExitFailure,
                   {"page_token (300 bytes)"}});

  // Plans: the same resolution and rules as submit.
  cases.push_back({"plan_cluster_no_gpus",
                   Via::kRest,
                   [](Env& env) {
                     Json body = {{"spec", BaseSpec()}, {"cluster", {{"num_gpus", 0}}}};
                     return Rest(env, "POST", "/v1/plans", body.dump());
                   },
                   400,
                   {"cluster.num_gpus"}});
  cases.push_back({"plan_vocab_missing",
                   Via::kRest,
                   [](Env& env) {
                     Json spec = BaseSpec();
                     spec["model"].erase("vocab_size");
                     spec.erase("data");
                     Json body = {{"spec", spec}};
                     return Rest(env, "POST", "/v1/plans", body.dump());
                   },
                   400,
                   {"model.vocab_size is required"}});
  cases.push_back({"plan_control_display_name",
                   Via::kGrpc,
                   [](Env& env) {
                     v1::PlanRequest request;
                     *request.mutable_spec() = *ParseJobSpecJson(BaseSpec().dump());
                     request.mutable_spec()->set_display_name("x\x1b]0;pwned\a");
                     v1::Plan out;
                     return FromGrpc(env.plans().Plan(GrpcContext().get(), request, &out));
                   },
                   kInvalid,
                   {"display_name must not contain control characters"}});
  // Virtual pipeline stages run; 6 layers do not divide into PP·VPP = 4 chunks.
  cases.push_back({"plan_virtual_pipeline_2_layers_6",
                   Via::kGrpc,
                   [](Env& env) {
                     v1::PlanRequest request;
                     *request.mutable_spec() = *ParseJobSpecJson(BaseSpec().dump());
                     v1::JobSpec& spec = *request.mutable_spec();
                     spec.mutable_model()->set_num_layers(6);
                     spec.mutable_parallel()->set_pipeline_model_parallel_size(2);
                     spec.mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
                     v1::Plan out;
                     return FromGrpc(env.plans().Plan(GrpcContext().get(), request, &out));
                   },
                   kInvalid,
                   {"parallel.virtual_pipeline_model_parallel_size (2 * 2 = 4)"}});
  cases.push_back({"plan_no_spec",
                   Via::kGrpc,
                   [](Env& env) {
                     v1::PlanRequest request;
                     v1::Plan out;
                     return FromGrpc(env.plans().Plan(GrpcContext().get(), request, &out));
                   },
                   kInvalid,
                   {"spec: required"}});

  // Tokens.
  cases.push_back({"create_without_token",
                   Via::kRest,
                   [](Env& env) {
                     Json body = {{"spec", BaseSpec()}};
                     return Rest(env, "POST", "/v1/jobs", body.dump(), /*token=*/false);
                   },
                   401,
                   {}});
  cases.push_back({"create_wrong_token",
                   Via::kRest,
                   [](Env& env) {
                     Json body = {{"spec", BaseSpec()}};
                     return Rest(env, "POST", "/v1/jobs", body.dump(), true, "not-the-token");
                   },
                   401,
                   {}});
  cases.push_back({"cancel_without_token",
                   Via::kRest,
                   [](Env& env) { return Rest(env, "POST", "/v1/jobs/1:cancel", "", false); },
                   401,
                   {}});
  cases.push_back({"list_wrong_token",
                   Via::kRest,
                   [](Env& env) { return Rest(env, "GET", "/v1/jobs", "", true, "wrong"); },
                   401,
                   {}});
  cases.push_back({"create_without_token",
                   Via::kGrpc,
                   [](Env& env) {
                     v1::CreateJobRequest request;
                     *request.mutable_spec() = *ParseJobSpecJson(BaseSpec().dump());
                     v1::Job job;
                     return FromGrpc(env.jobs().CreateJob(GrpcContext(false).get(), request, &job));
                   },
                   grpc::StatusCode::UNAUTHENTICATED,
                   {}});
  cases.push_back({"cancel_wrong_token",
                   Via::kGrpc,
                   [](Env& env) {
                     v1::CancelJobRequest request;
                     request.set_name("jobs/1");
                     v1::Job job;
                     return FromGrpc(env.jobs().CancelJob(GrpcContext(true, "not-the-token").get(),
                                                          request, &job));
                   },
                   grpc::StatusCode::UNAUTHENTICATED,
                   {}});
  cases.push_back({"plan_without_token",
                   Via::kGrpc,
                   [](Env& env) {
                     v1::PlanRequest request;
                     v1::Plan out;
                     return FromGrpc(env.plans().Plan(GrpcContext(false).get(), request, &out));
                   },
                   grpc::StatusCode::UNAUTHENTICATED,
                   {}});
  cases.push_back({"submit_without_token",
                   Via::kSyctl,
                   [](Env& env) {
                     const std::string path = env.NewPath(".json");
                     std::ofstream(path) << BaseSpec().dump();
                     return Syctl(env, {"submit", "-f", path}, /*auth=*/false);
                   },
                   kExitConnection,
                   {"no API token"}});
  cases.push_back({"cancel_wrong_token",
                   Via::kSyctl,
                   [](Env& env) {
                     const std::string token = env.NewPath(".token");
                     std::ofstream(token) << "not-the-token\n";
                     return Syctl(env, {"--token-file", token, "cancel", "1"}, /*auth=*/false);
                   },
                   kExitConnection,
                   {"UNAUTHENTICATED"}});
  return cases;
}

}  // namespace switchyard::hostile
