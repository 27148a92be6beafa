#!/usr/bin/env bash
# The cluster quickstart: starts a switchyard-coordinator (SQLite store, bearer token, checkpoints
# in a fresh run directory) and one switchyard-worker agent per visible GPU, or two CPU workers
# when there is none, submits the example MoE job (examples/quickstart.yaml on the default corpus;
# expert parallelism over the workers when the expert count allows it), follows it with
# `syctl submit --wait` (progress on stderr, one line per step) and exits with syctl's status:
# 0 when the job SUCCEEDED. Every process is stopped on exit; logs stay in the run directory.
#
# Usage: tools/quickstart_cluster.sh BIN_DIR [SPEC]   (BIN_DIR: `bazel info bazel-bin`)
# Environment: QUICKSTART_DIR (run directory, default /tmp/switchyard-quickstart, emptied first),
#              QUICKSTART_WORKERS (worker count override), QUICKSTART_METRICS_PORT (worker i
#              serves /metrics on 127.0.0.1:PORT+i; default: no worker /metrics).
# Everything listens on 127.0.0.1 only: the coordinator's gRPC and REST ports and the workers'
# /metrics are not reachable from other machines.
set -euo pipefail
# The token, the store, its backups and the checkpoints are readable by this user only.
umask 077
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/cluster_lib.sh
. "$here/cluster_lib.sh"
spec=${2:-examples/quickstart.yaml}
run=${QUICKSTART_DIR:-/tmp/switchyard-quickstart}
cluster_init "$1" "$run"
cluster_start_coordinator
echo "quickstart: coordinator at $cluster_grpc (store $run/store.db, logs in $run)" >&2
gpus=$(cluster_gpus)
n=${QUICKSTART_WORKERS:-$((gpus > 0 ? gpus : 2))}
cluster_start_workers "$n"
echo "quickstart: $n worker(s) on $([[ $gpus -gt 0 ]] && echo "$gpus GPU(s)" || echo "the CPU")" >&2

# The job: the example spec (its relative training.save lands under the run directory's
# checkpoint root, jobs/<id>/...), on exactly n workers, with expert parallelism n when it divides
# the experts. model.vocab_size stays as the spec has it: the coordinator fills it from the
# default corpus it found at start (SWITCHYARD_DATA_DIR, which BIN_DIR/data sets for the bundle).
experts=$(sed -n 's/^  num_experts: *\([0-9]*\).*/\1/p' "$spec")
gbs=$(sed -n 's/^  global_batch_size: *\([0-9]*\).*/\1/p' "$spec")
mbs=$(sed -n 's/^  micro_batch_size: *\([0-9]*\).*/\1/p' "$spec")
if [[ -n $gbs && -n $mbs && $((gbs % (mbs * n))) -ne 0 && $((gbs % n)) -eq 0 ]]; then
  mbs=$((gbs / n))  # keep the global batch; every worker gets whole micro-batches
fi
{
  sed -e "s/^  micro_batch_size: .*/  micro_batch_size: $mbs/" "$spec"
  echo "min_workers: $n"
  echo "max_workers: $n"
  if [[ -n $experts && $((experts % n)) -eq 0 ]]; then
    printf 'parallel:\n  expert_model_parallel_size: %d\n' "$n"
  fi
} >"$run/job.yaml"
cluster_syctl submit -f "$run/job.yaml" --wait
