// File: worker/train/testing/gloo_groups.cc
#include "worker/train/testing/gloo_groups.h"

#include "absl/strings/str_cat.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/testing/forked_ranks.h"

namespace switchyard::train::test_groups {

ParallelDims LayoutDims(int64_t world, int64_t tp, int64_t ep, int64_t cp, int64_t etp,
                        int64_t pp) {
  ParallelDims dims;
  dims.world_size = world;
  dims.tensor_model_parallel_size = tp;
  dims.expert_model_parallel_size = ep;
  dims.context_parallel_size = cp;
  dims.expert_tensor_parallel_size = etp;
  dims.pipeline_model_parallel_size = pp;
  return dims;
}

absl::StatusOr<std::unique_ptr<ProcessGroups>> JoinGlooGroups(const std::string& store_dir,
                                                              int rank, const ParallelDims& dims,
                                                              absl::Duration timeout) {
  // OpenFileStore has already printed the store's own error on stderr.
  std::shared_ptr<comm::KvStore> store = comm::testing::OpenFileStore(store_dir);
  if (store == nullptr) {
    return absl::InternalError(absl::StrCat("cannot open the FileKvStore at ", store_dir));
  }
  comm::GlooOptions options;
  options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<ProcessGroups>> groups =
      CreateGlooProcessGroups(std::move(store), rank, dims, options);
  if (!groups.ok() || (*groups)->world == nullptr) return groups;
  // Every rank has formed every group before any returns: a test whose ranks then fail at once
  // (a refused spec) must not close the pairs of a group another rank is still connecting, which
  // made that rank fail to join instead of reaching the refusal (seen once in CI:
  // DistributedTrainerCpTest.SequenceNotAMultipleOfTwiceCpIsRejected, "Connection closed by peer").
  if (absl::Status st = (*groups)->world->Barrier(); !st.ok()) return st;
  return groups;
}

}  // namespace switchyard::train::test_groups
