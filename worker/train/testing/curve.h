// File: worker/train/testing/curve.h
//
// The training curve the distributed CPU tests compare with one process's (distributed_trainer,
// distributed_trainer_etp, tensor_parallel_trainer tests): per step the loss, the grad norm and
// every MoE layer's tokens per expert as text (routing is compared exactly). Rank 0 of a forked
// run appends CurveLine(step) to a file (TrainRank: the end of those tests' rank bodies); the
// parent reads it back with ReadCurve. CpuF32: the trainer options of these tests (also used by
// evaluate_test and bench/memory_estimate_test).
#ifndef SWITCHYARD_WORKER_TRAIN_TESTING_CURVE_H_
#define SWITCHYARD_WORKER_TRAIN_TESTING_CURVE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "worker/train/trainer.h"

namespace switchyard::train::curves {

struct Curve {
  std::vector<double> loss, norm;
  std::vector<std::string> counts;  // per step: every MoE layer's tokens per expert, as text
};

// The trainer options of the CPU curve tests: f32 forced, so that every layout and the
// one-process reference compute in the same precision.
TrainerOptions CpuF32();

// "c0,c1,...;c0,c1,...;" : tokens per expert of every MoE layer.
std::string CountsText(const StepResult& r);
// Steps `trainer` (in this process) until its step count reaches `last`, one curve entry per
// step; a failed step is a test failure and ends the curve there.
Curve StepUntil(Trainer* trainer, int64_t last);
// "<loss> <grad_norm> <counts>\n", 17 significant digits (what a rank writes).
std::string CurveLine(const StepResult& r);
// The end of a forked rank's body: loads `load_root` if given, steps `trainer` until its step
// count reaches `last` (rank 0 appends CurveLine of every step to `out`) and saves to
// `save_root` if given. Returns the rank's exit code for RunProcesses: 0, or 1 after printing the
// failed call and the rank on stderr (SY_CHILD_OK).
int TrainRank(Trainer* trainer, int rank, const std::string& out, int64_t last,
              const std::string& load_root, const std::string& save_root);
// The lines of `path` (missing file: an empty curve).
Curve ReadCurve(const std::string& path);
// A fresh path for a curve file (under the test's temporary directory).
std::string OutFile(const std::string& name);

// Compares `got` (steps [first, first + got.size()) of the run) with the same steps of `ref`:
// tokens per expert identical (one failure per differing step), loss and grad norm within
// `tolerance` relative; a curve that covers the whole reference must also train (last loss
// below the first). Prints the evidence line.
void ExpectSameCurve(const Curve& ref, const Curve& got, size_t first, const std::string& what,
                     double tolerance = 1e-5);

}  // namespace switchyard::train::curves

#endif  // SWITCHYARD_WORKER_TRAIN_TESTING_CURVE_H_
