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
bin=$1
spec=${2:-examples/quickstart.yaml}
# BIN_DIR is bazel-bin (coordinator/, worker/, cli/ subfolders) or a flat folder (the GPU bundle).
exe() {
  if [[ -x $bin/$1/$2 ]]; then echo "$bin/$1/$2"; else echo "$bin/$2"; fi
}
coordinator_bin=$(exe coordinator switchyard-coordinator)
worker_bin=$(exe worker switchyard-worker)
syctl_bin=$(exe cli syctl)
# The GPU bundle carries the default corpus in BIN_DIR/data: use it unless told otherwise, so the
# bundle's quickstart needs no environment.
if [[ -z ${SWITCHYARD_DATA_DIR:-} && -f $bin/data/kjv/corpus.json ]]; then
  export SWITCHYARD_DATA_DIR="$(cd "$bin/data" && pwd)"
fi
run=${QUICKSTART_DIR:-/tmp/switchyard-quickstart}
rm -rf "$run"
mkdir -p "$run" "$run/checkpoints" "$run/data"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Two tokens: the API's (syctl) and the workers' own (coordinator/api/auth.h).
od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$run/token"
od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$run/worker-token"
"$coordinator_bin" --store "$run/store.db" --create-store --host 127.0.0.1 \
  --grpc-port 0 --http-port 0 --token-file "$run/token" --worker-token-file "$run/worker-token" \
  --checkpoint-root "$run/checkpoints" --data-root "$run/data" \
  >"$run/coordinator.log" 2>&1 &
pids+=($!)
grpc=""
for _ in $(seq 300); do
  grpc=$(sed -n 's/.*listening grpc=\([^ ]*\) http=.*/\1/p' "$run/coordinator.log" | head -1)
  [[ -n $grpc ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $grpc ]]; then
  echo "quickstart: the coordinator did not start:" >&2
  cat "$run/coordinator.log" >&2
  exit 1
fi
echo "quickstart: coordinator at $grpc (store $run/store.db, logs in $run)" >&2

gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
n=${QUICKSTART_WORKERS:-$((gpus > 0 ? gpus : 2))}
for ((i = 0; i < n; i++)); do
  device=cpu
  [[ $gpus -gt 0 ]] && device="cuda:$((i % gpus))"
  metrics=()
  if [[ -n ${QUICKSTART_METRICS_PORT:-} ]]; then
    metrics=(--metrics-port $((QUICKSTART_METRICS_PORT + i)) --metrics-bind-address 127.0.0.1)
  fi
  "$worker_bin" --coordinator "$grpc" --token-file "$run/worker-token" \
    --checkpoint-root "$run/checkpoints" --data-root "$run/data" \
    --device "$device" "${metrics[@]}" >"$run/worker$i.log" 2>&1 &
  pids+=($!)
done
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
"$syctl_bin" --coordinator "$grpc" --token-file "$run/token" submit -f "$run/job.yaml" --wait
