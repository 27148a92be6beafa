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
  return CreateGlooProcessGroups(std::move(store), rank, dims, options);
}

}  // namespace switchyard::train::test_groups
