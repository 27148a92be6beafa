#include "worker/agent/generation.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config/config_defaults.h"
#include "common/config/job_paths.h"
#include "common/config/validate.h"
#include "common/model/engine_support.h"
#include "common/status.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/cuda_status.h"
#include "kernels/runtime/stream.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/train/resume.h"

namespace switchyard::agent {
namespace {

absl::Status Field(absl::string_view field, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("assignment.", field, " ", rule));
}

// A parallel size the assignment's mapping may set (`mapped` > 0): then the spec must not say
// otherwise (`spec_has`, `spec_value`, field spec.parallel.<name>) and the mapping's wins; else
// the spec's, 1 when it has none.
absl::StatusOr<int> MappedSize(const char* name, bool spec_has, int spec_value, int mapped) {
  if (mapped <= 0) return spec_has ? spec_value : 1;
  if (spec_has && spec_value != mapped) {
    return Field(
        absl::StrCat("spec.parallel.", name),
        absl::StrCat("(", spec_value, ") must equal assignment.mapping.", name, " (", mapped, ")"));
  }
  return mapped;
}

// CheckAssignedSpecPaths with the field named as part of the assignment.
absl::Status CheckPaths(const v1::JobSpec& spec, const JobRoots& roots) {
  absl::Status s = CheckAssignedSpecPaths(spec, roots);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("assignment.spec.", s.message()));
}

// Whether `mine` holds on any rank of the world (one f32 max all-reduce). On NCCL through
// `device_flag` (one f32 on the GPU, allocated once), copied on `stream`, the communicators'
// stream, so the copies are ordered with the collective.
absl::StatusOr<bool> AnyRank(train::ProcessGroups* groups, bool mine, const Device& device,
                             cudaStream_t stream, kernels::Buffer* device_flag) {
  float flag = mine ? 1.0f : 0.0f;
  Tensor host(DType::kF32, {1}, Device::Cpu(), &flag);
  if (!device.is_cuda()) {
    SY_RETURN_IF_ERROR(groups->world->AllReduce(host, host, comm::ReduceOp::kMax));
    return flag > 0;
  }
  if (device_flag->data() == nullptr) {
    SY_ASSIGN_OR_RETURN(*device_flag, kernels::Buffer::ForTensor(DType::kF32, {1}, device));
  }
  const Tensor dev = device_flag->View();
  // A copy from pageable memory may wait for the stream: nothing unbounded may be pending on it
  // (between steps nothing is; this only makes sure).
  SY_RETURN_IF_ERROR(groups->Synchronize());
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dev.data, &flag, sizeof(float), cudaMemcpyHostToDevice, stream));
  SY_RETURN_IF_ERROR(groups->world->AllReduce(dev, dev, comm::ReduceOp::kMax));
  // The all-reduce returns before completing (communicator.h, "Completion"); the copy below to
  // pageable memory blocks the host until the stream reaches it: wait for the collective first,
  // bounded by the group's timeout (it follows everything enqueued on the stream before it).
  SY_RETURN_IF_ERROR(groups->world->Synchronize());
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&flag, dev.data, sizeof(float), cudaMemcpyDeviceToHost, stream));
  SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return flag > 0;
}

// Owns what a generation creates, destroyed in reverse order after withdrawing it from the
// control (so a late Stop never aborts a destroyed communicator).
struct Resources {
  GenerationControl* control = nullptr;
  std::shared_ptr<RendezvousKvStore> store;
  std::unique_ptr<train::ProcessGroups> groups;
  kernels::OwnedStream stream;  // CUDA: the compute stream, destroyed after the groups
  ~Resources() {
    control->SetGroups(nullptr);
    control->SetStore(nullptr);
    groups.reset();
  }
};

}  // namespace

absl::StatusOr<PreparedGeneration> PrepareGeneration(const v1::Assignment& a, const Device& device,
                                                     const JobRoots& roots) {
  if (a.job().empty()) return Field("job", "must not be empty");
  if (a.generation() < 1) {
    return Field("generation", absl::StrCat("(", a.generation(), ") must be >= 1"));
  }
  if (a.world_size() < 1) {
    return Field("world_size", absl::StrCat("(", a.world_size(), ") must be >= 1"));
  }
  if (a.rank() < 0 || a.rank() >= a.world_size()) {
    return Field(
        "rank", absl::StrCat("(", a.rank(), ") must be in [0, world_size = ", a.world_size(), ")"));
  }
  if (!a.has_spec()) return Field("spec", "is required");
  PreparedGeneration p;
  p.assignment = a;
  p.roots = roots;
  p.device = device;
  p.spec = a.spec();
  v1::ParallelConfig* par = p.spec.mutable_parallel();
  if (par->has_world_size() && par->world_size() != a.world_size()) {
    return Field("spec.parallel.world_size",
                 absl::StrCat("(", par->world_size(), ") must equal assignment.world_size (",
                              a.world_size(), ")"));
  }
  par->set_world_size(a.world_size());
  const v1::Mapping& m = a.mapping();
  if (std::string why = UnsupportedByEngine(
          "assignment.mapping.", m.tensor_model_parallel_size(), m.context_parallel_size(),
          m.pipeline_model_parallel_size(), m.expert_tensor_parallel_size(), /*vpp=*/1);
      !why.empty()) {
    return absl::UnimplementedError(why);
  }
  SY_ASSIGN_OR_RETURN(
      const int ep, MappedSize("expert_model_parallel_size", par->has_expert_model_parallel_size(),
                               par->expert_model_parallel_size(), m.expert_model_parallel_size()));
  if (a.world_size() > 1 || ep > 1) par->set_expert_model_parallel_size(ep);
  // Context parallelism: the mapping's (the planner's), which must agree with a spec that sets it.
  SY_ASSIGN_OR_RETURN(const int cp,
                      MappedSize("context_parallel_size", par->has_context_parallel_size(),
                                 par->context_parallel_size(), m.context_parallel_size()));
  if (cp > 1) par->set_context_parallel_size(cp);
  // Expert tensor parallelism: the mapping's (1 when it has none), which the spec must not
  // contradict.
  const int etp = std::max(1, m.expert_tensor_parallel_size());
  if (par->has_expert_tensor_parallel_size() && par->expert_tensor_parallel_size() != etp) {
    return Field(
        "spec.parallel.expert_tensor_parallel_size",
        absl::StrCat("(", par->expert_tensor_parallel_size(),
                     ") must equal assignment.mapping.expert_tensor_parallel_size (", etp, ")"));
  }
  if (a.world_size() > 1 || etp > 1) par->set_expert_tensor_parallel_size(etp);
  // Tensor parallelism (with sequence parallelism): the mapping's, else the spec's.
  SY_ASSIGN_OR_RETURN(
      const int tp, MappedSize("tensor_model_parallel_size", par->has_tensor_model_parallel_size(),
                               par->tensor_model_parallel_size(), m.tensor_model_parallel_size()));
  if (tp > 1) {
    par->set_tensor_model_parallel_size(tp);
    par->set_sequence_parallel(true);
    if (!par->has_expert_tensor_parallel_size()) par->set_expert_tensor_parallel_size(1);
  }
  // Pipeline parallelism (1F1B): the mapping's, which must agree with a spec that sets it.
  SY_ASSIGN_OR_RETURN(
      const int pp,
      MappedSize("pipeline_model_parallel_size", par->has_pipeline_model_parallel_size(),
                 par->pipeline_model_parallel_size(), m.pipeline_model_parallel_size()));
  if (pp > 1) par->set_pipeline_model_parallel_size(pp);
  // What the engine does not run (nothing the layout rules accept today), named under the
  // assignment's spec.
  if (std::string why = UnsupportedJobSpec("assignment.spec.", p.spec); !why.empty()) {
    return absl::UnimplementedError(why);
  }
  v1::JobSpec checked = p.spec;
  ApplyDefaults(&checked);
  absl::Status valid = ValidateJobSpec(checked);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("assignment.spec: ", valid.message()));
  }
  SY_RETURN_IF_ERROR(CheckPaths(p.spec, roots));
  p.dims.world_size = a.world_size();
  p.dims.expert_model_parallel_size = ep;
  p.dims.tensor_model_parallel_size = tp;
  p.dims.context_parallel_size = cp;
  p.dims.pipeline_model_parallel_size = pp;
  p.dims.expert_tensor_parallel_size = etp;
  return p;
}

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDataLoss:
      return 1;
    default:
      return 128 + static_cast<int>(status.code());
  }
}

v1::StepMetrics ToStepMetrics(const train::StepResult& r, const std::vector<bool>& moe_layers) {
  v1::StepMetrics m;
  m.set_step(r.step);
  m.set_loss(r.loss);
  m.set_aux_loss(r.aux_loss);
  m.set_z_loss(r.z_loss);
  m.set_lr(r.lr);
  m.set_grad_norm(r.grad_norm);
  m.set_step_ms(r.step_ms);
  m.set_tokens_per_second(r.tokens_per_s);
  m.set_tflops(r.tflops);
  m.set_mfu(r.mfu);
  // Only on the steps that evaluated (training.eval_interval, the last step): absent otherwise,
  // so the coordinator can tell "not evaluated" from a loss of 0.
  if (r.validation_loss.has_value()) {
    m.set_validation_loss(*r.validation_loss);
    m.set_validation_perplexity(std::exp(*r.validation_loss));
  }
  std::vector<int> layer_of;
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    if (moe_layers[l]) layer_of.push_back(static_cast<int>(l));
  }
  for (size_t i = 0; i < r.expert_tokens.size(); ++i) {
    const std::vector<int64_t>& tokens = r.expert_tokens[i];
    if (tokens.empty()) continue;
    v1::ExpertLoad* load = m.add_expert_load();
    load->set_layer(i < layer_of.size() ? layer_of[i] : static_cast<int>(i));
    int64_t lo = tokens[0], hi = tokens[0], sum = 0;
    for (int64_t t : tokens) {
      lo = std::min(lo, t);
      hi = std::max(hi, t);
      sum += t;
      load->add_tokens_per_expert(t);
    }
    const double mean = static_cast<double>(sum) / static_cast<double>(tokens.size());
    load->set_min_tokens(static_cast<double>(lo));
    load->set_max_tokens(static_cast<double>(hi));
    load->set_mean_tokens(mean);
    load->set_imbalance(mean > 0 ? static_cast<double>(hi) / mean : 0.0);
  }
  return m;
}

std::string GenerationControl::stop_reason() {
  absl::MutexLock lock(&mu_);
  return reason_;
}

void GenerationControl::RequestStop(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!stop_.load()) reason_ = reason;
  stop_.store(true);
  if (store_ != nullptr) store_->Cancel();
  if (groups_ != nullptr) groups_->AbortAll();
}

void GenerationControl::SetStore(RendezvousKvStore* store) {
  absl::MutexLock lock(&mu_);
  store_ = store;
  if (store_ != nullptr && stop_.load()) store_->Cancel();
}

void GenerationControl::SetGroups(train::ProcessGroups* groups) {
  absl::MutexLock lock(&mu_);
  groups_ = groups;
  if (groups_ != nullptr && stop_.load()) groups_->AbortAll();
}

absl::Status RunGeneration(const PreparedGeneration& p, const GenerationEnv& env,
                           GenerationControl* control) {
  const v1::Assignment& a = p.assignment;
  const int rank = a.rank();
  auto log = [&](const std::string& line) {
    if (env.log) env.log(line);
  };
  Resources res;
  res.control = control;
  if (p.device.is_cuda()) {
    // The current device is per thread: this is the training thread.
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(p.device.index));
    SY_ASSIGN_OR_RETURN(res.stream, kernels::OwnedStream::Create(p.device));
  }
  // StepMetrics.device_memory_bytes: the memory in use at each step less this reading, taken
  // once the CUDA context exists and before the communicators and the trainer are created.
  int64_t memory_before = 0;
  if (p.device.is_cuda()) {
    SY_ASSIGN_OR_RETURN(memory_before, kernels::DeviceMemoryInUse(p.device.index));
  }
  if (a.world_size() > 1) {
    RendezvousKvStore::Options store_options;
    store_options.worker_id = env.worker_id;
    SY_ASSIGN_OR_RETURN(res.store, RendezvousKvStore::Create(env.rendezvous_channel, env.token,
                                                             env.rendezvous_address, a.job(),
                                                             a.generation(), store_options));
    control->SetStore(res.store.get());
    absl::StatusOr<std::unique_ptr<train::ProcessGroups>> groups;
    if (p.device.is_cuda()) {
      comm::NcclOptions nopt;
      nopt.timeout = env.comm_timeout;
      groups = train::CreateNcclProcessGroups(res.store, rank, p.dims, p.device.index,
                                              res.stream.view().cuda_stream, nopt);
    } else {
      comm::GlooOptions gopt;
      gopt.hostname = env.gloo_host;
      gopt.timeout = env.comm_timeout;
      groups = train::CreateGlooProcessGroups(res.store, rank, p.dims, gopt);
    }
    if (!groups.ok()) return Annotate(groups.status(), "rendezvous");
    res.groups = std::move(*groups);
    control->SetGroups(res.groups.get());
    if (control->stop_requested()) return absl::OkStatus();
  }
  // Defense in depth: the roots are re-checked at open (a symlink may have appeared since the
  // Assignment).
  SY_RETURN_IF_ERROR(CheckPaths(p.spec, p.roots));
  train::TrainerOptions options;
  options.device = p.device;
  options.peak_tflops = env.peak_tflops;
  options.groups = res.groups.get();
  options.cuda_stream = res.stream.view().cuda_stream;
  absl::StatusOr<std::unique_ptr<train::Trainer>> created = train::Trainer::Create(p.spec, options);
  if (!created.ok()) return Annotate(created.status(), "creating the trainer");
  std::unique_ptr<train::Trainer> trainer = std::move(*created);
  const v1::TrainingConfig& tr = trainer->spec().training();
  train::ResumeOptions resume;
  resume.own_must_be_empty = a.generation() == 1;
  SY_ASSIGN_OR_RETURN(std::string resumed, train::ResumeTraining(trainer.get(), tr, resume));
  if (!resumed.empty()) log(resumed);
  const std::vector<bool> moe_layers = trainer->model_config().moe_layers;
  kernels::Buffer device_flag;  // CheckpointNow agreement on NCCL
  train::TrainingLoopHooks hooks;
  hooks.stop_requested = [&] { return control->stop_requested(); };
  hooks.on_step = [&](const train::StepResult& r) {
    if (!env.on_step) return;
    v1::StepMetrics m = ToStepMetrics(r, moe_layers);
    if (p.device.is_cuda()) {
      // A failed reading only leaves the field 0 ("not reported"): it never fails the step.
      absl::StatusOr<int64_t> used = kernels::DeviceMemoryInUse(p.device.index);
      if (used.ok()) m.set_device_memory_bytes(static_cast<double>(*used - memory_before));
    }
    env.on_step(m);
  };
  hooks.checkpoint_requested = [&](const train::StepResult&) -> absl::StatusOr<bool> {
    bool requested = control->TakeCheckpointRequest();
    if (res.groups == nullptr) return requested;
    absl::StatusOr<bool> any =
        AnyRank(res.groups.get(), requested, p.device, res.stream.view().cuda_stream, &device_flag);
    if (!any.ok()) return Annotate(any.status(), "agreeing on CheckpointNow");
    return *any;
  };
  hooks.on_saved = [&](const std::string& dir, bool requested) {
    log(absl::StrCat("saved checkpoint ", dir, requested ? " (CheckpointNow)" : ""));
    if (env.on_saved) env.on_saved(trainer->step(), dir, requested);
  };
  hooks.on_request_ignored = [&] {
    log("CheckpointNow ignored: the spec has no training.save directory");
  };
  SY_ASSIGN_OR_RETURN(train::TrainingLoopResult loop, train::RunTrainingLoop(trainer.get(), hooks));
  if (loop.stopped) return absl::OkStatus();
  log(absl::StrCat("finished at step ", trainer->step()));
  return absl::OkStatus();
}

}  // namespace switchyard::agent
