// The communicators of one rank: world + one sub-group per role, shared where members coincide.
#include "worker/train/process_groups.h"

#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::train {
namespace {

struct Role {
  ParallelGroup group;
  const char* name;
  comm::Communicator* ProcessGroups::*slot;
};

constexpr Role kRoles[] = {
    {ParallelGroup::kTensor, "tp", &ProcessGroups::tp},
    {ParallelGroup::kDataContext, "dp_cp", &ProcessGroups::data},
    {ParallelGroup::kContext, "cp", &ProcessGroups::cp},
    {ParallelGroup::kTensorDataContext, "tp_dp_cp", &ProcessGroups::tdc},
    {ParallelGroup::kExpert, "ep", &ProcessGroups::expert},
    {ParallelGroup::kExpertTensor, "etp", &ProcessGroups::etp},
    {ParallelGroup::kExpertTensorExpert, "etp_ep", &ProcessGroups::etp_ep},
    {ParallelGroup::kExpertData, "edp", &ProcessGroups::expert_data},
    {ParallelGroup::kExpertTensorExpertPipeline, "etp_ep_pp", &ProcessGroups::expert_model},
    // Last, so that the earlier roles keep their order of ncclCommSplit calls (and, with PP = 1,
    // the pipeline group is the rank alone, shared with another one-rank role).
    {ParallelGroup::kPipeline, "pp", &ProcessGroups::pp},
};

absl::StatusOr<ParallelLayout> CheckedLayout(const ParallelDims& dims, int rank) {
  SY_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::Create(dims));
  // Every dimension of the grid, PP included, gets its groups here: what the engine runs is
  // decided where a job is accepted (common/model/engine_support.h, called by the trainer, the
  // worker agent and the coordinator), so the pipeline plumbing can be built and tested over
  // real groups before the schedule runs.
  if (rank < 0 || rank >= layout.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, world_size ", layout.world_size(), ")"));
  }
  return layout;
}

// Fills every role: reuses the world or an earlier role with the same members, else splits a new
// sub-group off `world` (a GlooCommunicator or an NcclCommunicator).
template <typename Comm>
absl::Status FillRoles(ProcessGroups& g, Comm* world) {
  std::vector<std::pair<std::vector<int>, comm::Communicator*>> made;
  std::vector<int> everyone(g.layout.world_size());
  for (int r = 0; r < g.layout.world_size(); ++r) everyone[r] = r;
  made.push_back({everyone, g.world});
  for (const Role& role : kRoles) {
    const std::vector<int> members = g.layout.Group(role.group, g.rank);
    comm::Communicator* found = nullptr;
    for (const auto& [m, c] : made) {
      if (m == members) found = c;
    }
    if (found == nullptr) {
      SY_ASSIGN_OR_RETURN(std::unique_ptr<Comm> c, world->CreateSubgroup(members, role.name));
      found = c.get();
      g.owned.push_back(std::move(c));
      made.push_back({members, found});
    }
    g.*(role.slot) = found;
  }
  return absl::OkStatus();
}

// The dedicated gradient-reduction groups (used by another thread than the roles), split off
// `world`.
template <typename Comm>
absl::Status AddGradGroups(ProcessGroups& g, Comm* world) {
  for (auto [group, name, slot] :
       {std::make_tuple(ParallelGroup::kDataContext, "grad_dp_cp", &ProcessGroups::grad_data),
        std::make_tuple(ParallelGroup::kExpertData, "grad_edp",
                        &ProcessGroups::grad_expert_data)}) {
    SY_ASSIGN_OR_RETURN(std::unique_ptr<Comm> c,
                        world->CreateSubgroup(g.layout.Group(group, g.rank), name));
    g.*slot = c.get();
    g.owned.push_back(std::move(c));
  }
  return absl::OkStatus();
}

}  // namespace

ProcessGroups::~ProcessGroups() {
  owned.clear();  // the communicators first: they run on grad_stream
}

void ProcessGroups::AbortAll() {
  for (auto& c : owned) c->Abort();
}

absl::Status ProcessGroups::Synchronize() const {
  for (const auto& c : owned) {
    if (c.get() == grad_data || c.get() == grad_expert_data) continue;
    SY_RETURN_IF_ERROR(c->Synchronize());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ProcessGroups>> CreateGlooProcessGroups(
    std::shared_ptr<comm::KvStore> store, int rank, const ParallelDims& dims,
    const comm::GlooOptions& options) {
  SY_ASSIGN_OR_RETURN(ParallelLayout layout, CheckedLayout(dims, rank));
  auto g = std::make_unique<ProcessGroups>(std::move(layout), rank);
  SY_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> world,
                      comm::GlooCommunicator::Create(std::move(store), rank, g->layout.world_size(),
                                                     options, "world"));
  comm::GlooCommunicator* w = world.get();
  g->world = w;
  g->owned.push_back(std::move(world));
  SY_RETURN_IF_ERROR(FillRoles(*g, w));
  SY_RETURN_IF_ERROR(AddGradGroups(*g, w));
  return g;
}

absl::StatusOr<std::unique_ptr<ProcessGroups>> CreateNcclProcessGroups(
    std::shared_ptr<comm::KvStore> store, int rank, const ParallelDims& dims, int device,
    cudaStream_t stream, const comm::NcclOptions& options) {
  SY_ASSIGN_OR_RETURN(ParallelLayout layout, CheckedLayout(dims, rank));
  auto g = std::make_unique<ProcessGroups>(std::move(layout), rank);
  SY_ASSIGN_OR_RETURN(std::unique_ptr<comm::NcclCommunicator> world,
                      comm::NcclCommunicator::Create(store, rank, g->layout.world_size(), device,
                                                     stream, options, "world"));
  comm::NcclCommunicator* w = world.get();
  g->world = w;
  g->owned.push_back(std::move(world));
  // ncclCommSplit is collective over the world: every rank splits for every role in the same
  // order (FillRoles visits the roles in a fixed order and a role is skipped on every rank or on
  // none, since "same members as an earlier group" holds for all ranks of a layout alike).
  SY_RETURN_IF_ERROR(FillRoles(*g, w));
  // Dedicated gradient-reduction groups on a stream of their own: a second world communicator
  // (its own unique id) and its splits, in the same order on every rank.
  SY_ASSIGN_OR_RETURN(g->grad_stream, kernels::OwnedStream::Create(Device::Cuda(device)));
  SY_ASSIGN_OR_RETURN(
      std::unique_ptr<comm::NcclCommunicator> gw,
      comm::NcclCommunicator::Create(store, rank, g->layout.world_size(), device,
                                     g->grad_stream.view().cuda_stream, options, "grad_world"));
  comm::NcclCommunicator* gwp = gw.get();
  g->owned.push_back(std::move(gw));
  SY_RETURN_IF_ERROR(AddGradGroups(*g, gwp));
  return g;
}

}  // namespace switchyard::train
