#include "worker/agent/worker_metrics.h"

#include <exception>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace switchyard::agent {
namespace {

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& r, const char* name,
                                                   const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

}  // namespace

WorkerMetrics::WorkerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      step_(GaugeFamily(*registry_, "switchyard_worker_step",
                        "Completed optimizer steps of the running generation")
                .Add({})),
      step_seconds_(GaugeFamily(*registry_, "switchyard_worker_step_seconds",
                                "Wall time of the last optimizer step")
                        .Add({})),
      tokens_per_second_(GaugeFamily(*registry_, "switchyard_worker_tokens_per_second",
                                     "Tokens of the global batch per second of the last step")
                             .Add({})),
      tflops_(GaugeFamily(*registry_, "switchyard_worker_tflops",
                          "Model TFLOP/s per GPU of the last step")
                  .Add({})),
      mfu_(GaugeFamily(*registry_, "switchyard_worker_mfu",
                       "Model FLOPs utilisation of the last step (fraction of peak; 0 when "
                       "unknown: CPU)")
               .Add({})),
      loss_(GaugeFamily(*registry_, "switchyard_worker_loss",
                        "Mean cross-entropy of the last step (nats/token)")
                .Add({})),
      aux_loss_(GaugeFamily(*registry_, "switchyard_worker_aux_loss",
                            "Load-balancing loss of the last step (coefficients included)")
                    .Add({})),
      grad_norm_(GaugeFamily(*registry_, "switchyard_worker_grad_norm",
                             "Global gradient norm of the last step, before clipping")
                     .Add({})),
      lr_(GaugeFamily(*registry_, "switchyard_worker_lr", "Learning rate of the last step")
              .Add({})),
      generation_(GaugeFamily(*registry_, "switchyard_worker_generation",
                              "Generation of the job this worker runs (0: idle)")
                      .Add({})),
      expert_min_(GaugeFamily(*registry_, "switchyard_worker_expert_tokens_min",
                              "Fewest tokens routed to one expert of the MoE layer, last step")),
      expert_max_(GaugeFamily(*registry_, "switchyard_worker_expert_tokens_max",
                              "Most tokens routed to one expert of the MoE layer, last step")),
      expert_mean_(GaugeFamily(*registry_, "switchyard_worker_expert_tokens_mean",
                               "Mean tokens per expert of the MoE layer, last step")),
      expert_imbalance_(GaugeFamily(*registry_, "switchyard_worker_expert_load_imbalance",
                                    "Max / mean tokens per expert of the MoE layer, last step")),
      validation_loss_(GaugeFamily(*registry_, "switchyard_job_validation_loss",
                                   "Held-out (valid split) loss of the last evaluation "
                                   "(training.eval_interval), nats/token")),
      validation_perplexity_(GaugeFamily(*registry_, "switchyard_job_validation_perplexity",
                                         "exp(validation loss) of the last evaluation")) {}

WorkerMetrics::~WorkerMetrics() {
  if (server_ != nullptr) server_->Stop();
}

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    const std::string& bind_address, int port, HttpServerOptions limits) {
  if (port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port (", port, ") must be <= 65535 (0: any free port)"));
  }
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics());
  if (port < 0) return m;
  WorkerMetrics* self = m.get();
  HttpRouter router;
  router.Handle("GET", "/metrics", [self](const HttpRequest&, HttpResponse* res) {
    res->content_type = "text/plain; version=0.0.4; charset=utf-8";
    res->body = self->Serialize();
  });
  auto server = HttpServer::Create(bind_address, port, std::move(limits), std::move(router));
  if (!server.ok()) {
    if (server.status().code() != absl::StatusCode::kUnavailable) return server.status();
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", bind_address, ":", port,
                                               " (", server.status().message(), ")"));
  }
  m->server_ = std::move(*server);
  m->port_ = m->server_->port();
  return m;
}

void WorkerMetrics::Record(const v1::StepMetrics& m) {
  absl::MutexLock lock(&mu_);
  if (generation_value_ == 0) return;  // idle: the generation already ended
  step_.Set(static_cast<double>(m.step()));
  step_seconds_.Set(m.step_ms() / 1000.0);
  tokens_per_second_.Set(m.tokens_per_second());
  tflops_.Set(m.tflops());
  loss_.Set(m.loss());
  aux_loss_.Set(m.aux_loss());
  grad_norm_.Set(m.grad_norm());
  lr_.Set(m.lr());
  mfu_.Set(m.mfu() >= 0 ? m.mfu() : 0.0);
  for (const v1::ExpertLoad& load : m.expert_load()) {
    auto it = layers_.find(load.layer());
    if (it == layers_.end()) {
      const std::map<std::string, std::string> labels = {{"layer", std::to_string(load.layer())}};
      Layer l;
      l.min = &expert_min_.Add(labels);
      l.max = &expert_max_.Add(labels);
      l.mean = &expert_mean_.Add(labels);
      l.imbalance = &expert_imbalance_.Add(labels);
      it = layers_.emplace(load.layer(), l).first;
    }
    it->second.min->Set(load.min_tokens());
    it->second.max->Set(load.max_tokens());
    it->second.mean->Set(load.mean_tokens());
    it->second.imbalance->Set(load.imbalance());
  }
  if (m.has_validation_loss()) {
    // Created at the first evaluation, not before: a 0 would read as a perfect loss (and as
    // the 6-hour minimum of alerts.yml's SwitchyardValidationLossRising).
    if (validation_loss_value_ == nullptr) {
      validation_loss_value_ = &validation_loss_.Add({});
      validation_perplexity_value_ = &validation_perplexity_.Add({});
    }
    validation_loss_value_->Set(m.validation_loss());
    validation_perplexity_value_->Set(m.validation_perplexity());
  }
}

void WorkerMetrics::SetGeneration(int64_t generation) {
  absl::MutexLock lock(&mu_);
  generation_value_ = generation;
  generation_.Set(static_cast<double>(generation));
  if (generation != 0) return;
  for (prometheus::Gauge* g : {&step_, &step_seconds_, &tokens_per_second_, &tflops_, &mfu_, &loss_,
                               &aux_loss_, &grad_norm_, &lr_}) {
    g->Set(0);
  }
  for (const auto& [layer, l] : layers_) {
    expert_min_.Remove(l.min);
    expert_max_.Remove(l.max);
    expert_mean_.Remove(l.mean);
    expert_imbalance_.Remove(l.imbalance);
  }
  layers_.clear();
  if (validation_loss_value_ != nullptr) {
    validation_loss_.Remove(validation_loss_value_);
    validation_perplexity_.Remove(validation_perplexity_value_);
    validation_loss_value_ = nullptr;
    validation_perplexity_value_ = nullptr;
  }
}

std::string WorkerMetrics::Serialize() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace switchyard::agent
