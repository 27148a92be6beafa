#!/usr/bin/env bash
# File: tools/preempt_demo.sh
#
# Preemption at a checkpoint, end to end on two workers (issue 18's "2-GPU run"): a coordinator
# with --preemption=on and two switchyard-worker agents (one per GPU, or CPU workers without
# GPUs), then
#   1. job "low" (priority 0, both workers, expert parallelism 2) starts and trains;
#   2. once it has reported step LOW_AT, job "high" (priority 10, both workers) is submitted: it
#      cannot be admitted, so the coordinator asks "low" for an on-demand checkpoint, stops it
#      at that save (PENDING, PREEMPTED "preempted at step N") and starts "high";
#   3. "high" SUCCEEDS, "low" resumes from its checkpoint (next generation, first step N + 1) and
#      SUCCEEDS.
# Prints both jobs' event timelines (`syctl watch`, events only) and checks the rules: "low" was
# preempted at a step N, its next generation's first step is N + 1, both SUCCEEDED.
#
# Usage: tools/preempt_demo.sh BIN_DIR [SPEC]  (BIN_DIR: bazel-bin, or `.` in the GPU bundle)
# Environment: PREEMPT_DIR (run directory, default /tmp/switchyard-preempt), LOW_ITERS (default
# 3000 on GPUs, 400 on the CPU), LOW_AT (default LOW_ITERS / 10), HIGH_ITERS (default 200),
# PREEMPT_WORKERS (default 2; 1: both jobs on one worker, e.g. a host with one GPU).
# Exit status 0 only when every rule held.
set -euo pipefail
umask 077
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/cluster_lib.sh
. "$here/cluster_lib.sh"
spec=${2:-examples/quickstart.yaml}
run=${PREEMPT_DIR:-/tmp/switchyard-preempt}
cluster_init "$1" "$run"
gpus=$(cluster_gpus)
low_iters=${LOW_ITERS:-$((gpus > 0 ? 3000 : 400))}
low_at=${LOW_AT:-$((low_iters / 10))}
high_iters=${HIGH_ITERS:-200}
cluster_start_coordinator --preemption=on --preempt-save-timeout=120s
workers=${PREEMPT_WORKERS:-2}
cluster_start_workers "$workers"
echo "preempt_demo: coordinator at $cluster_grpc, $workers worker(s) on $([[ $gpus -gt 0 ]] && echo "$gpus GPU(s)" || echo "the CPU"), logs in $run" >&2

# A job file: SPEC on every worker (expert parallelism = the worker count), ITERS steps, a name
# and a priority;
# log every 10 steps, warm-up ITERS / 10, a checkpoint every ITERS / 2 steps (so the preemption's save is on demand).
job_file() {
  local name=$1 iters=$2 priority=$3
  cluster_job_yaml "$spec" "$iters" $((iters / 2))
  printf 'display_name: %s\npriority: %d\nmin_workers: %d\nmax_workers: %d\n' "$name" \
    "$priority" "$workers" "$workers"
  printf 'parallel:\n  expert_model_parallel_size: %d\n' "$workers"
}
job_file low "$low_iters" 0 >"$run/low.yaml"
job_file high "$high_iters" 10 >"$run/high.yaml"

t0=$SECONDS
stamp() { printf '[+%4ds] %s\n' $((SECONDS - t0)) "$*"; }
low=$(cluster_syctl submit -f "$run/low.yaml" | sed -n 's/.*\(jobs\/[0-9]*\).*/\1/p' | head -1)
[[ -n $low ]] || { echo "preempt_demo: submitting low failed" >&2; exit 1; }
stamp "submitted $low (low, priority 0, $low_iters steps)"
cluster_syctl watch "$low" >"$run/low.watch" 2>&1 &
low_watch=$!
# Wait for step LOW_AT in low's step lines ("step N ..." as watch prints them).
last_step() { sed -n 's/.*step \([0-9][0-9]*\).*loss.*/\1/p' "$1" | tail -1; }
for _ in $(seq 1200); do
  s=$(last_step "$run/low.watch")
  [[ -n $s && $s -ge $low_at ]] && break
  sleep 0.5
done
stamp "$low reported step ${s:-none}"
high=$(cluster_syctl submit -f "$run/high.yaml" | sed -n 's/.*\(jobs\/[0-9]*\).*/\1/p' | head -1)
[[ -n $high ]] || { echo "preempt_demo: submitting high failed" >&2; exit 1; }
stamp "submitted $high (high, priority 10, $high_iters steps)"
high_rc=0
cluster_syctl watch "$high" >"$run/high.watch" 2>&1 || high_rc=$?
stamp "$high ended (watch exit $high_rc)"
low_rc=0
wait "$low_watch" || low_rc=$?
stamp "$low ended (watch exit $low_rc)"

echo "== $low events"
grep -v ' loss ' "$run/low.watch" || true
echo "== $high events"
grep -v ' loss ' "$run/high.watch" || true
echo "== $low steps around the preemption (generation: first/last step)"
fail=0
n=$(sed -n 's/.*preempted at step \([0-9][0-9]*\).*/\1/p' "$run/low.watch" | head -1)
if [[ -z $n ]]; then
  echo "FAIL: $low was never preempted"
  fail=1
else
  # The first step line after the preemption event.
  resumed=$(awk '/preempted at step/ { seen = 1; next } seen && / loss / { print; exit }' "$run/low.watch" |
    sed -n 's/.*step \([0-9][0-9]*\).*/\1/p')
  echo "$low preempted at step $n; first step reported after it: ${resumed:-none}"
  # Steps are logged every 10 (log_interval), so the first logged step after N is the first
  # multiple of 10 above N, or N + 1 itself.
  expect=$(((n / 10 + 1) * 10))
  if [[ -z $resumed || ($resumed -ne $((n + 1)) && $resumed -ne $expect) ]]; then
    echo "FAIL: $low resumed at step ${resumed:-none}, expected $((n + 1)) (or logged step $expect)"
    fail=1
  fi
fi
[[ $high_rc -eq 0 ]] || { echo "FAIL: $high did not succeed"; fail=1; }
[[ $low_rc -eq 0 ]] || { echo "FAIL: $low did not succeed"; fail=1; }
cluster_syctl list
[[ $fail -eq 0 ]] && echo "preempt_demo: OK ($low preempted at step $n by $high, resumed, both SUCCEEDED)"
exit $fail
