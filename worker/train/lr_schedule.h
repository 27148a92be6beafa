// File: worker/train/lr_schedule.h
//
// The learning-rate schedule of Megatron-LM's OptimizerParamScheduler (get_lr), for the decay
// styles Switchyard exposes: constant, linear and cosine, with linear warmup and a floor min_lr.
// Pure arithmetic on the host; no state besides the validated configuration.
#ifndef SWITCHYARD_WORKER_TRAIN_LR_SCHEDULE_H_
#define SWITCHYARD_WORKER_TRAIN_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace switchyard::train {

enum class LrDecayStyle { kConstant, kLinear, kCosine };

// Parses "constant" | "linear" | "cosine"; "" means the config default, cosine.
absl::StatusOr<LrDecayStyle> ParseLrDecayStyle(absl::string_view name);

struct LrScheduleConfig {
  double lr = 1e-4;             // max_lr
  double min_lr = 0.0;          // floor reached at lr_decay_iters
  int64_t lr_warmup_iters = 0;  // linear warmup from 0 over this many steps
  int64_t lr_decay_iters = 0;   // last step of the decay (counted from step 0, warmup included)
  LrDecayStyle lr_decay_style = LrDecayStyle::kCosine;
};

// The learning rate at a given step, with Megatron's semantics. `step` is Megatron's
// `num_steps`: the number of optimizer steps already taken, so the first iteration uses
// LrAt(0) (which is 0 under warmup, as in Megatron, whose init_lr / lr_warmup_init is 0):
//   step <= warmup (warmup > 0):  lr * step / warmup
//   constant style:               lr
//   step > decay_iters:           min_lr
//   otherwise, with r = (step - warmup) / (decay_iters - warmup):
//     linear:  min_lr + (lr - min_lr) * (1 - r)
//     cosine:  min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * r))
// Differences from Megatron: steps are iterations only (no sample-based schedule), no
// inverse-square-root/WSD styles, no lr_warmup_init, no per-group lr_mult.
class LrSchedule {
 public:
  // Validates: 0 <= min_lr <= lr, lr_warmup_iters >= 0, and for a decaying style
  // lr_decay_iters > lr_warmup_iters (Megatron asserts lr_decay_steps > lr_warmup_steps).
  static absl::StatusOr<LrSchedule> Create(const LrScheduleConfig& config);

  double LrAt(int64_t step) const;
  const LrScheduleConfig& config() const { return config_; }

 private:
  explicit LrSchedule(const LrScheduleConfig& config) : config_(config) {}
  LrScheduleConfig config_;
};

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_LR_SCHEDULE_H_
