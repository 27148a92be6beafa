#!/usr/bin/env bash
# File: tools/hung_worker_demo.sh
#
# A rank that stalls inside the expert-parallel dispatch, end to end on two workers (issue 15,
# "never hang": "a stalled rank (SIGSTOP) in dispatch on GPUs: the others fail within the
# timeout, naming it; the coordinator restarts the job from its checkpoint"). A coordinator and two
# switchyard-worker agents (one per GPU, or CPU workers without GPUs) with --comm-timeout
# COMM_TIMEOUT (default 8 s), then
#   1. a job on both workers with expert parallelism 2 and the alltoall dispatcher (every MoE
#      layer dispatches over the two ranks) and a checkpoint every SAVE_INTERVAL steps trains;
#   2. after step STALL_AT, worker 1's process is SIGSTOPped: it stops inside a collective (the
#      dispatch all-to-alls are most of the communication); worker 0's collective times out after
#      COMM_TIMEOUT and its error names the MoE layer, phase and group; the coordinator marks
#      worker 1 LOST after its heartbeat timeout and the job goes RESTARTING;
#   3. RESUME_AFTER seconds after the stop, SIGCONT: worker 1 re-attaches, the job restarts on
#      both workers (next generation) from its last checkpoint and SUCCEEDS.
# Prints the job's event timeline (`syctl watch`, events only), worker 0's failure line and checks
# the rules: a restart, the survivor's error within COMM_TIMEOUT + 10 s of the stop naming a MoE
# layer's dispatch or combine (or the lost peer), the next generation's first step right after a
# checkpoint, SUCCEEDED.
#
# Usage: tools/hung_worker_demo.sh BIN_DIR [SPEC]  (BIN_DIR: bazel-bin, or `.` in the GPU bundle)
# Environment: HUNG_DIR (run directory, default /tmp/switchyard-hung), ITERS (default 1500 on
# GPUs, 200 on the CPU), STALL_AT (default ITERS / 3), SAVE_INTERVAL (default ITERS / 10),
# COMM_TIMEOUT (default 8), RESUME_AFTER (default 15).
# Exit status 0 only when every rule held.
set -euo pipefail
umask 077
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/cluster_lib.sh
. "$here/cluster_lib.sh"
spec=${2:-examples/quickstart.yaml}
run=${HUNG_DIR:-/tmp/switchyard-hung}
cluster_init "$1" "$run"
gpus=$(cluster_gpus)
iters=${ITERS:-$((gpus > 0 ? 1500 : 200))}
stall_at=${STALL_AT:-$((iters / 3))}
save_interval=${SAVE_INTERVAL:-$((iters / 10))}
comm_timeout=${COMM_TIMEOUT:-8}
resume_after=${RESUME_AFTER:-15}
cluster_start_coordinator
CLUSTER_WORKER_FLAGS="--comm-timeout $comm_timeout" cluster_start_workers 2
echo "hung_worker_demo: coordinator at $cluster_grpc, 2 workers on $([[ $gpus -gt 0 ]] && echo "$gpus GPU(s)" || echo "the CPU"), comm timeout ${comm_timeout}s, logs in $run" >&2

cluster_job_yaml "$spec" "$iters" "$save_interval" |
  sed -e "s/^model:$/model:\n  moe_token_dispatcher_type: alltoall/" >"$run/job.yaml"
printf 'display_name: hung-worker\nmin_workers: 2\nmax_workers: 2\nmax_restarts: 3\n' >>"$run/job.yaml"
printf 'parallel:\n  expert_model_parallel_size: 2\n' >>"$run/job.yaml"

t0=$SECONDS
stamp() { printf '[+%4ds] %s\n' $((SECONDS - t0)) "$*"; }
job=$(cluster_syctl submit -f "$run/job.yaml" | sed -n 's/.*\(jobs\/[0-9]*\).*/\1/p' | head -1)
[[ -n $job ]] || { echo "hung_worker_demo: submitting the job failed" >&2; exit 1; }
stamp "submitted $job ($iters steps, EP 2 on 2 workers, a checkpoint every $save_interval steps)"
cluster_syctl watch "$job" >"$run/job.watch" 2>&1 &
watch_pid=$!
last_step() { sed -n 's/.*step \([0-9][0-9]*\).*loss.*/\1/p' "$1" | tail -1; }
s=""
for _ in $(seq 1200); do
  s=$(last_step "$run/job.watch")
  [[ -n $s && $s -ge $stall_at ]] && break
  sleep 0.5
done
victim=$(cluster_worker_pid 1)
kill -STOP "$victim"
stopped_at=$SECONDS
stamp "$job reported step ${s:-none}; SIGSTOP worker 1 (pid $victim)"
# Worker 0's training error: the first failure line after the stop.
survivor_line=""
for _ in $(seq $(((comm_timeout + 20) * 2))); do
  survivor_line=$(grep -m1 -E 'dispatch \(|combine \(|did not take part|peer' "$run/worker0.log" || true)
  [[ -n $survivor_line ]] && break
  sleep 0.5
done
survivor_at=$((SECONDS - stopped_at))
stamp "worker 0: ${survivor_line:-no failure line yet}"
sleep "$(((resume_after - (SECONDS - stopped_at)) > 0 ? resume_after - (SECONDS - stopped_at) : 0))"
kill -CONT "$victim"
stamp "SIGCONT worker 1"
rc=0
wait "$watch_pid" || rc=$?
stamp "$job ended (watch exit $rc)"

echo "== $job events"
grep -v ' loss ' "$run/job.watch" || true
fail=0
if ! grep -q 'RESTARTING' "$run/job.watch"; then echo "FAIL: $job never restarted"; fail=1; fi
if [[ -z $survivor_line ]]; then
  echo "FAIL: worker 0 logged no collective failure after the stop"
  fail=1
elif [[ $survivor_at -gt $((comm_timeout + 10)) ]]; then
  echo "FAIL: worker 0's failure came ${survivor_at}s after the stop (timeout ${comm_timeout}s)"
  fail=1
fi
# The first logged step of the last generation follows a checkpoint (a multiple of save_interval).
resumed=$(awk '/RESTARTING/ { seen = 1; next } seen && / loss / { print; exit }' "$run/job.watch" |
  sed -n 's/.*step \([0-9][0-9]*\).*/\1/p')
echo "first step reported after the restart: ${resumed:-none} (checkpoints every $save_interval)"
[[ -n $resumed ]] || { echo "FAIL: no step after the restart"; fail=1; }
[[ $rc -eq 0 ]] || { echo "FAIL: $job did not succeed"; fail=1; }
cluster_syctl list
[[ $fail -eq 0 ]] && echo "hung_worker_demo: OK (worker 1 stopped at step $s; worker 0 failed after ${survivor_at}s naming it; restarted from a checkpoint; SUCCEEDED)"
exit $fail
