// File: worker/train/checkpoint_shards.h
//
// Where a rank's tensors sit in the global tensors, as ShardSlices of a sharded checkpoint
// (worker/checkpoint/sharded_checkpoint.h): the one description the trainer's Save and Load use
// for every mapping (TP, EP, ETP; DP and CP replicate a model-parallel shard, and the distributed
// optimizer cuts flat ranges out of it: Trainer::Save adds those). It restates ParamInfo's layout
// (worker/model/gpt_model.h: CopyTpShard, ShardGlobalOffset / CopyShard) as runs per dimension;
// checkpoint_shards_test checks it element by element against those copy functions.
#ifndef SWITCHYARD_WORKER_TRAIN_CHECKPOINT_SHARDS_H_
#define SWITCHYARD_WORKER_TRAIN_CHECKPOINT_SHARDS_H_

#include "worker/checkpoint/sharded_checkpoint.h"
#include "worker/model/gpt_model.h"

namespace switchyard::train {

// The model-parallel shard of `p` (a ParamInfo of the layout of `config`) that this rank holds:
//   dense, not TP-split:   the whole tensor;
//   TP-split (tp_dim):     per part j of tp_parts, global indices [j·part + tp_rank·piece, +piece)
//                          of dimension tp_dim (fc1's gate piece, then its up piece; the shared
//                          expert's fc1 columns likewise); the vocabulary slice of
//                          embedding.weight / output.weight [V, H] is rows
//                          [tp_rank·V/TP, +V/TP) (tp_dim 0, one part);
//   expert:                rows [ep_rank·L, +L) of the E experts; with ETP > 1 fc1 [E, H, 2F]
//                          keeps columns [etp_rank·F', +F') then [F + etp_rank·F', +F'), fc2
//                          [E, F, H] rows [etp_rank·F', +F') of dimension 1.
// The flat range is the whole local tensor (flat_begin 0, flat_end -1).
ShardSlice ModelParallelSlice(const model::ParamInfo& p, const model::GptConfig& config);

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_CHECKPOINT_SHARDS_H_
