// File: common/config/worker_range.h
//
// The elastic worker range of a job spec, shared by the coordinator's scheduler
// (coordinator/jobs/placement.h) and the manifests syctl renders for a job's workers
// (cli/k8s_workers.h: completions = the minimum), so the number of pods started and the number
// the scheduler waits for cannot drift apart. Here, in common/config, because the CLI may not
// depend on the coordinator (root BUILD package groups).
//
// Thread safety: pure functions.
#ifndef SWITCHYARD_COMMON_CONFIG_WORKER_RANGE_H_
#define SWITCHYARD_COMMON_CONFIG_WORKER_RANGE_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "switchyard/v1/config.pb.h"

namespace switchyard {

// [min, max] workers of a stored (defaulted) spec: unset min_workers is parallel.world_size if
// set, else 1; unset max_workers is parallel.world_size if set, else INT32_MAX (unbounded). The
// minimum is at least 1 (a non-positive min_workers means one worker).
inline std::pair<int32_t, int32_t> WorkerRange(const v1::JobSpec& spec) {
  const bool has_world = spec.parallel().has_world_size();
  const int32_t world = spec.parallel().world_size();
  const int32_t min = spec.has_min_workers() ? spec.min_workers() : (has_world ? world : 1);
  const int32_t max = spec.has_max_workers()
                          ? spec.max_workers()
                          : (has_world ? world : std::numeric_limits<int32_t>::max());
  return {std::max(min, 1), max};
}

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_WORKER_RANGE_H_
