# File: tools/cluster_lib.sh
#
# Sourced (not run) by the cluster scripts (tools/quickstart_cluster.sh,
# tools/preempt_demo.sh): starts a switchyard-coordinator and switchyard-worker agents on
# 127.0.0.1 in a run directory and stops them on exit. One copy of the start-up so the
# quickstart and the demos cannot drift apart.
#
#   cluster_init BIN_DIR RUN_DIR      binaries from BIN_DIR (bazel-bin, or the flat GPU bundle),
#                                     RUN_DIR emptied; sets cluster_syctl; installs the EXIT trap
#   cluster_start_coordinator [FLAG...]   extra coordinator flags; sets cluster_grpc
#   cluster_start_workers N           one agent per GPU (cuda:i mod GPUs), or CPU agents without
#                                     GPUs; QUICKSTART_METRICS_PORT: worker i serves /metrics on
#                                     127.0.0.1:PORT+i; CLUSTER_WORKER_FLAGS: extra worker flags
#                                     (all workers), CLUSTER_WORKER<i>_FLAGS: worker i's own
#   cluster_worker_pid I              the pid of worker I (0-based)
#   cluster_syctl ARGS...             syctl against this coordinator with the API token
#   cluster_job_yaml SPEC ITERS SAVE  SPEC's training section for a demo job: ITERS steps, a log
#                                     line every 10, warm-up ITERS / 10, a checkpoint every SAVE
#                                     steps, micro-batches of 4 (printed; the caller appends)

# Binary NAME under BIN_DIR/SUB (bazel-bin) or BIN_DIR (a flat folder).
cluster_exe() {
  if [[ -x $cluster_bin/$1/$2 ]]; then echo "$cluster_bin/$1/$2"; else echo "$cluster_bin/$2"; fi
}

cluster_init() {
  cluster_bin=$1
  cluster_run=$2
  cluster_pids=()
  cluster_worker_pids=()
  cluster_coordinator_bin=$(cluster_exe coordinator switchyard-coordinator)
  cluster_worker_bin=$(cluster_exe worker switchyard-worker)
  cluster_syctl_bin=$(cluster_exe cli syctl)
  # The GPU bundle carries the default corpus in BIN_DIR/data: use it unless told otherwise, so
  # the bundle's scripts need no environment.
  if [[ -z ${SWITCHYARD_DATA_DIR:-} && -f $cluster_bin/data/kjv/corpus.json ]]; then
    export SWITCHYARD_DATA_DIR="$(cd "$cluster_bin/data" && pwd)"
  fi
  rm -rf "$cluster_run"
  mkdir -p "$cluster_run" "$cluster_run/checkpoints" "$cluster_run/data"
  trap cluster_cleanup EXIT
}

cluster_cleanup() {
  local p
  for p in "${cluster_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${cluster_pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

cluster_start_coordinator() {
  # Two tokens: the API's (syctl) and the workers' own (coordinator/api/auth.h).
  od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$cluster_run/token"
  od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$cluster_run/worker-token"
  "$cluster_coordinator_bin" --store "$cluster_run/store.db" --create-store --host 127.0.0.1 \
    --grpc-port 0 --http-port 0 --token-file "$cluster_run/token" \
    --worker-token-file "$cluster_run/worker-token" \
    --checkpoint-root "$cluster_run/checkpoints" --data-root "$cluster_run/data" "$@" \
    >"$cluster_run/coordinator.log" 2>&1 &
  cluster_pids+=($!)
  cluster_grpc=""
  local pid=$! _
  for _ in $(seq 300); do
    cluster_grpc=$(sed -n 's/.*listening grpc=\([^ ]*\) http=.*/\1/p' "$cluster_run/coordinator.log" | head -1)
    [[ -n $cluster_grpc ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $cluster_grpc ]]; then
    echo "cluster: the coordinator did not start:" >&2
    cat "$cluster_run/coordinator.log" >&2
    exit 1
  fi
}

cluster_gpus() { (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true; }

cluster_start_workers() {
  local n=$1 gpus i device metrics
  gpus=$(cluster_gpus)
  for ((i = 0; i < n; i++)); do
    device=cpu
    [[ $gpus -gt 0 ]] && device="cuda:$((i % gpus))"
    metrics=()
    if [[ -n ${QUICKSTART_METRICS_PORT:-} ]]; then
      metrics=(--metrics-port $((QUICKSTART_METRICS_PORT + i)) --metrics-bind-address 127.0.0.1)
    fi
    local own="CLUSTER_WORKER${i}_FLAGS"
    "$cluster_worker_bin" --coordinator "$cluster_grpc" --token-file "$cluster_run/worker-token" \
      --checkpoint-root "$cluster_run/checkpoints" --data-root "$cluster_run/data" \
      --device "$device" "${metrics[@]}" ${CLUSTER_WORKER_FLAGS:-} ${!own:-} \
      >"$cluster_run/worker$i.log" 2>&1 &
    cluster_pids+=($!)
    cluster_worker_pids+=($!)
  done
}

cluster_worker_pid() { echo "${cluster_worker_pids[$1]}"; }

cluster_syctl() { "$cluster_syctl_bin" --coordinator "$cluster_grpc" --token-file "$cluster_run/token" "$@"; }

cluster_job_yaml() {
  local spec=$1 iters=$2 save=$3
  sed -e "s/^  train_iters: .*/  train_iters: $iters/" \
    -e "s/^  log_interval: .*/  log_interval: 10/" \
    -e "s/^  lr_warmup_iters: .*/  lr_warmup_iters: $((iters / 10))/" \
    -e "s/^  save_interval: .*/  save_interval: $save/" \
    -e "s/^  micro_batch_size: .*/  micro_batch_size: 4/" "$spec"
}
