// Megatron's OptimizerParamScheduler.get_lr for constant/linear/cosine decay.
#include "worker/train/lr_schedule.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace switchyard::train {

absl::StatusOr<LrDecayStyle> ParseLrDecayStyle(absl::string_view name) {
  if (name.empty() || name == "cosine") return LrDecayStyle::kCosine;
  if (name == "linear") return LrDecayStyle::kLinear;
  if (name == "constant") return LrDecayStyle::kConstant;
  return absl::InvalidArgumentError(absl::StrCat("training.lr_decay_style (\"", name,
                                                 "\") must be one of constant, linear, cosine"));
}

absl::StatusOr<LrSchedule> LrSchedule::Create(const LrScheduleConfig& c) {
  if (!(c.lr >= 0.0) || !std::isfinite(c.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("training.lr (", c.lr, ") must be >= 0"));
  }
  if (!(c.min_lr >= 0.0) || c.min_lr > c.lr) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.min_lr (", c.min_lr, ") must be in [0, training.lr (", c.lr, ")]"));
  }
  if (c.lr_warmup_iters < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.lr_warmup_iters (", c.lr_warmup_iters, ") must be >= 0"));
  }
  if (c.lr_decay_style != LrDecayStyle::kConstant && c.lr_decay_iters <= c.lr_warmup_iters) {
    return absl::InvalidArgumentError(absl::StrCat("training.lr_decay_iters (", c.lr_decay_iters,
                                                   ") must be > training.lr_warmup_iters (",
                                                   c.lr_warmup_iters, ")"));
  }
  return LrSchedule(c);
}

double LrSchedule::LrAt(int64_t step) const {
  const LrScheduleConfig& c = config_;
  if (c.lr_warmup_iters > 0 && step <= c.lr_warmup_iters) {
    return c.lr * static_cast<double>(step) / static_cast<double>(c.lr_warmup_iters);
  }
  if (c.lr_decay_style == LrDecayStyle::kConstant) return c.lr;
  if (step > c.lr_decay_iters) return c.min_lr;
  const double ratio = static_cast<double>(step - c.lr_warmup_iters) /
                       static_cast<double>(c.lr_decay_iters - c.lr_warmup_iters);
  const double coeff = c.lr_decay_style == LrDecayStyle::kLinear
                           ? 1.0 - ratio
                           : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return c.min_lr + coeff * (c.lr - c.min_lr);
}

}  // namespace switchyard::train
