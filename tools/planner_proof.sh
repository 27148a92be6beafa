#!/usr/bin/env bash
# The planner proven on real runs (issue 14 item 3), as one command on a host with WORLD GPUs (or
# CPU workers): starts a coordinator and WORLD workers (cluster_lib.sh), runs one job of SPEC per
# MAPPING in turn (ITERS steps each, the mapping's sizes pinned in the job's parallel section),
# then asks the coordinator for `syctl plan -f SPEC --search --world WORLD`: every mapping ranked
# with its estimate, the step-time calibration fitted on those runs (CAL-MS) and what each ran
# (MEASURED-MS / MEASURED-GIB). Prints the table and writes its JSON to RUN_DIR/plan.json, each
# run's rank-0 log line to RUN_DIR/runs.txt.
#
# Usage: tools/planner_proof.sh BIN_DIR SPEC WORLD ITERS MAPPING...
#   BIN_DIR  bazel-bin, or the flat GPU bundle
#   SPEC     a job spec whose parallel sizes are unset (the search varies what the spec leaves unset)
#   MAPPING  parallel sizes to pin, e.g. ep=2 or tp=2,ep=2 (keys tp cp pp ep etp); "-" pins none
# Environment: PROOF_DIR (run directory, default /tmp/switchyard-planner-proof).
# Example (4 GPUs): tools/planner_proof.sh . bench_model.yaml 4 20 ep=1 ep=2 ep=4 tp=2,ep=2
set -euo pipefail
umask 077
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/cluster_lib.sh"
if [[ $# -lt 5 ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
bin=$1 spec=$2 world=$3 iters=$4
shift 4
[[ $world =~ ^[1-9][0-9]*$ ]] || { echo "planner_proof: WORLD must be a positive integer, got '$world'" >&2; exit 2; }
[[ $iters =~ ^[1-9][0-9]*$ ]] || { echo "planner_proof: ITERS must be a positive integer, got '$iters'" >&2; exit 2; }
if grep -q '^parallel:' "$spec"; then
  echo "planner_proof: $spec has a parallel section; leave the sizes unset (the search varies them)" >&2
  exit 2
fi
declare -A key=([tp]=tensor_model_parallel_size [cp]=context_parallel_size
  [pp]=pipeline_model_parallel_size [ep]=expert_model_parallel_size
  [etp]=expert_tensor_parallel_size)
parallel_section() {  # MAPPING -> the job's parallel section
  local m=$1 kv k v
  echo "parallel:"
  echo "  world_size: $world"
  [[ $m == - ]] && return 0
  IFS=, read -ra kvs <<<"$m"
  for kv in "${kvs[@]}"; do
    k=${kv%%=*} v=${kv#*=}
    if [[ -z ${key[$k]:-} || ! $v =~ ^[1-9][0-9]*$ ]]; then
      echo "planner_proof: mapping '$m': '$kv' is not KEY=N with KEY one of tp cp pp ep etp" >&2
      return 2
    fi
    echo "  ${key[$k]}: $v"
  done
}
for m in "$@"; do parallel_section "$m" >/dev/null; done  # reject a bad mapping before starting

run=${PROOF_DIR:-/tmp/switchyard-planner-proof}
cluster_init "$bin" "$run"
cluster_start_coordinator
cluster_start_workers "$world"
echo "planner_proof: coordinator at $cluster_grpc, $world worker(s), logs in $run" >&2
: >"$run/runs.txt"
i=0
for m in "$@"; do
  i=$((i + 1))
  {
    sed -e "s/^  train_iters: .*/  train_iters: $iters/" -e "s/^  save_interval: .*/  save_interval: $iters/" \
      -e "s/^  log_interval: .*/  log_interval: 1/" \
      -e "s/^  lr_warmup_iters: .*/  lr_warmup_iters: $((iters / 10))/" "$spec"
    echo "min_workers: $world"
    echo "max_workers: $world"
    parallel_section "$m"
  } >"$run/job$i.yaml"
  echo "planner_proof: run $i/$#: $m ($iters steps)" >&2
  if ! cluster_syctl submit -f "$run/job$i.yaml" --wait >"$run/submit$i.log" 2>&1; then
    cat "$run/submit$i.log" >&2
    echo "planner_proof: the run of mapping '$m' failed (logs in $run)" >&2
    exit 1
  fi
  echo "$m: $(tail -1 "$run/submit$i.log")" >>"$run/runs.txt"
done
cluster_syctl plan -f "$spec" --search --world "$world" -o json >"$run/plan.json"
cluster_syctl plan -f "$spec" --search --world "$world"
