// File: worker/train/testing/gloo_groups.h
//
// One call for what every forked rank of a distributed CPU test does before it builds its
// Trainer: open the run's FileKvStore (worker/comm/testing/forked_ranks.h) and join the Gloo
// process groups of a layout over loopback. The tests used to spell these ten lines out per rank
// body (distributed_trainer, distributed_trainer_etp, evaluate, tensor_parallel_trainer,
// sharded_checkpoint_trainer, process_groups, create_memory, memory_estimate);
// they differ only in the sizes and the timeout, which are the arguments here. killed_peer and
// stop_in_collective open the store themselves: they use it again after the groups are made.
#ifndef SWITCHYARD_WORKER_TRAIN_TESTING_GLOO_GROUPS_H_
#define SWITCHYARD_WORKER_TRAIN_TESTING_GLOO_GROUPS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/parallel_state.h"
#include "worker/train/process_groups.h"

namespace switchyard::train::test_groups {

// What most of the tests give Gloo: long enough for a loaded 2-core CI machine to fork, build
// the model and connect every group, short enough that a lost peer fails the test in a minute.
inline constexpr absl::Duration kGlooTestTimeout = absl::Seconds(60);

// The ParallelDims of a test layout. `etp` 0 keeps ParallelDims' default (ETP = TP, Megatron's);
// the other sizes are taken as given (ParallelDims validates them when the groups are made).
ParallelDims LayoutDims(int64_t world, int64_t tp, int64_t ep, int64_t cp = 1, int64_t etp = 0,
                        int64_t pp = 1);

// Opens the FileKvStore at `store_dir` and makes rank `rank`'s Gloo process groups for `dims`
// with `timeout` on every operation. Collective: every rank of the run calls it with the same
// `store_dir` and `dims`. INTERNAL naming the directory when the store does not open; otherwise
// CreateGlooProcessGroups' errors (INVALID_ARGUMENT for a bad layout, DEADLINE_EXCEEDED when a
// peer does not show up within `timeout`).
absl::StatusOr<std::unique_ptr<ProcessGroups>> JoinGlooGroups(
    const std::string& store_dir, int rank, const ParallelDims& dims,
    absl::Duration timeout = kGlooTestTimeout);

}  // namespace switchyard::train::test_groups

#endif  // SWITCHYARD_WORKER_TRAIN_TESTING_GLOO_GROUPS_H_
