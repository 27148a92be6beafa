// File: worker/agent/worker_metrics.h
//
// The worker's own Prometheus endpoint (GET /metrics; prometheus-cpp gauges in a registry, the
// text exposition served by common/http_server.h, as the coordinator serves its /metrics, so slow
// or hostile clients cannot starve it: connection caps per client and in total, a whole-request
// deadline; prometheus-cpp's CivetWeb exposer failed to bind inside our test binaries, which
// link gRPC, with "null context when constructing CivetServer"): the last
// step's numbers, one gauge each, mapping one-to-one onto the step log line and StepMetrics
// (proto/switchyard/v1/metrics.proto):
//
//   switchyard_worker_step                      completed optimizer steps of the generation
//   switchyard_worker_step_seconds              wall time of the last step
//   switchyard_worker_tokens_per_second         tokens of the global batch / step time
//   switchyard_worker_tflops                    model TFLOP/s per GPU
//   switchyard_worker_mfu                       fraction of the peak; 0 when the step reports
//                                               none (a CPU worker: no peak FLOP/s to divide by)
//   switchyard_worker_loss                      mean cross-entropy (nats/token)
//   switchyard_worker_aux_loss, _grad_norm, _lr
//   switchyard_worker_expert_tokens_min{layer}  tokens per expert of MoE layer `layer`,
//   switchyard_worker_expert_tokens_max{layer}  summarised: never one series per expert, so
//   switchyard_worker_expert_tokens_mean{layer} the series count does not grow with E
//   switchyard_worker_expert_load_imbalance{layer}   max / mean
//   switchyard_worker_generation                the generation running (0 idle)
//   switchyard_job_validation_loss              held-out loss of the last evaluation (every
//   switchyard_job_validation_perplexity        training.eval_interval steps), and exp of it;
//                                               named as deploy/prometheus/alerts.yml expects
//
// Every metric above exists on every backend from the start (the per-layer ones once a step
// reported the layer, the validation ones from the first evaluation: a 0 before it would read
// as a perfect loss), so dashboards and alerts see the same series on CPU and GPU workers.
// An idle worker reports no job's numbers: SetGeneration(0) (the generation ended: finished,
// failed, stopped) sets every step gauge back to 0 and removes the per-layer series, and a
// Record while idle (a late step of a generation already reported ended) is dropped.
//
// Thread-safe (prometheus-cpp gauges are atomic; the per-layer children are created under a
// mutex).
#ifndef SWITCHYARD_WORKER_AGENT_WORKER_METRICS_H_
#define SWITCHYARD_WORKER_AGENT_WORKER_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/http_server.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "switchyard/v1/metrics.pb.h"

namespace switchyard::agent {

class WorkerMetrics {
 public:
  // Serves /metrics on `bind_address`:`port` (port 0: an ephemeral port, see port()); port < 0:
  // records without serving (no exporter). UNAVAILABLE naming the address when it cannot bind;
  // INVALID_ARGUMENT for a port > 65535. `limits` bounds the exporter's connections and times
  // (HttpServerOptions' defaults; a scrape is one small GET).
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(const std::string& bind_address,
                                                               int port,
                                                               HttpServerOptions limits = {});
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;
  ~WorkerMetrics();

  // Sets every gauge from one step's metrics; ignored while the generation is 0 (idle).
  void Record(const v1::StepMetrics& m);
  // The generation this worker runs; 0 (idle) also resets the step gauges (see above).
  void SetGeneration(int64_t generation);
  // The port /metrics is served on; -1 without an exporter.
  int port() const { return port_; }
  // The text exposition, as a scrape would return it.
  std::string Serialize() const;

 private:
  WorkerMetrics();
  struct Layer {
    prometheus::Gauge* min = nullptr;
    prometheus::Gauge* max = nullptr;
    prometheus::Gauge* mean = nullptr;
    prometheus::Gauge* imbalance = nullptr;
  };

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<HttpServer> server_;  // stopped first in the destructor: it reads the gauges
  int port_ = -1;
  prometheus::Gauge& step_;
  prometheus::Gauge& step_seconds_;
  prometheus::Gauge& tokens_per_second_;
  prometheus::Gauge& tflops_;
  prometheus::Gauge& mfu_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& aux_loss_;
  prometheus::Gauge& grad_norm_;
  prometheus::Gauge& lr_;
  prometheus::Gauge& generation_;
  prometheus::Family<prometheus::Gauge>& expert_min_;
  prometheus::Family<prometheus::Gauge>& expert_max_;
  prometheus::Family<prometheus::Gauge>& expert_mean_;
  prometheus::Family<prometheus::Gauge>& expert_imbalance_;
  prometheus::Family<prometheus::Gauge>& validation_loss_;
  prometheus::Family<prometheus::Gauge>& validation_perplexity_;
  absl::Mutex mu_;  // orders Record against SetGeneration's reset
  int64_t generation_value_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, Layer> layers_ ABSL_GUARDED_BY(mu_);
  prometheus::Gauge* validation_loss_value_ ABSL_GUARDED_BY(mu_) = nullptr;  // null: none yet
  prometheus::Gauge* validation_perplexity_value_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace switchyard::agent

#endif  // SWITCHYARD_WORKER_AGENT_WORKER_METRICS_H_
