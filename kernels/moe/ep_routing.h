// File: kernels/moe/ep_routing.h
//
// Routing metadata of the token-deduplicating expert-parallel dispatch
// (worker/model/alltoall_dispatcher.h): a token routed to several experts of one EP rank crosses
// the link ONCE to that rank, with its routing, and the receiving rank expands it to its local
// experts itself (as DeepEP's dispatch does), instead of once per (token, expert) slot as in
// Megatron's alltoall dispatcher. With 64 experts top-8 at EP = 2 that is ~1 row per remote rank
// instead of ~4.
//
//   RouteToRanks      on the sending rank: which EP ranks each token goes to, and the token's
//                     routing packed as one row of floats to travel with it.
//   LocalizeRouting   on the receiving rank: the received routing rows -> topk_idx over ITS
//                     local experts (other ranks' slots dropped, -1) and the probs, ready for
//                     Permute (permute.h) over the L local experts.
//
// Representation:
//   topk_idx [T, k] i32 (-1 = dropped slot), topk_probs [T, k] f32 (f64 on the CPU).
//   rank_idx [T, P] i32: rank_idx[t, j] = j when some kept slot of t is an expert of EP rank j
//            (experts [j*L, (j+1)*L), L = num_experts / P), else -1. As a Permute routing over P
//            "experts", it gathers each token once per destination rank, rank-major, tokens
//            ascending.
//   meta     [T, 2k] of topk_probs' dtype: meta[t, s] = topk_idx[t, s] (exact: ids < 2^24) and
//            meta[t, k + s] = topk_probs[t, s]. Probabilities travel unchanged (bit for bit).
//   local_idx [R, k] i32: meta id - first_expert when in [first_expert, first_expert + L), else
//            -1; local_probs [R, k] = meta[:, k:2k].
//
// Deterministic, no host synchronisation, no allocation. CPU reference and CUDA path give the same
// bits (pure integer tests and copies). On the CPU an expert id outside [-1, num_experts) is
// INVALID_ARGUMENT; on CUDA it is treated as dropped (as Permute does).
#ifndef SWITCHYARD_KERNELS_MOE_EP_ROUTING_H_
#define SWITCHYARD_KERNELS_MOE_EP_ROUTING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels {

// topk_idx [T, k], topk_probs [T, k] -> rank_idx [T, ep_size], meta [T, 2k] (see above).
// num_experts % ep_size == 0.
absl::Status RouteToRanks(const Stream& stream, const Tensor& topk_idx, const Tensor& topk_probs,
                          int64_t num_experts, int64_t ep_size, const Tensor& rank_idx,
                          const Tensor& meta);

// meta [R, 2k] -> local_idx [R, k] i32, local_probs [R, k] (meta's dtype), for the experts
// [first_expert, first_expert + num_local).
absl::Status LocalizeRouting(const Stream& stream, const Tensor& meta, int64_t first_expert,
                             int64_t num_local, const Tensor& local_idx, const Tensor& local_probs);

namespace internal {

absl::Status RouteToRanksCuda(const Stream& stream, const Tensor& topk_idx,
                              const Tensor& topk_probs, int64_t num_experts, int64_t ep_size,
                              const Tensor& rank_idx, const Tensor& meta);
absl::Status LocalizeRoutingCuda(const Stream& stream, const Tensor& meta, int64_t first_expert,
                                 int64_t num_local, const Tensor& local_idx,
                                 const Tensor& local_probs);

}  // namespace internal

}  // namespace switchyard::kernels

#endif  // SWITCHYARD_KERNELS_MOE_EP_ROUTING_H_
