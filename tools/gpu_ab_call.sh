#!/usr/bin/env bash
# One device call's worth of GPU work, inside the GPU bundle (tools/gpu_bundle.sh copies this file
# there as gpu_ab_call.sh), within a time budget, with results that survive the device tool's
# limits: every log goes into ONE archive ($OUT/logs.tar.xz) and the key lines into ONE file
# ($OUT/summary.txt), which is also printed LAST, so the reply's tail (its last 12,000 characters)
# and its at-most-8 returned files both hold it.
#
#   BUDGET=500 TESTS="kernels_moe kernels_norm" ./gpu_ab_call.sh
#
# Sections, in this order, each only while enough of BUDGET (seconds, default 540) is left:
#   tests   ./run_gpu_tests.sh $TESTS (substrings of *_gpu_test names; empty TESTS: skipped),
#           each binary with GPU_TEST_TIMEOUT (default 150) s; its PASS/FAIL lines are kept.
#   train   ./bench_train_benchmark, and when ./base_bench_train_benchmark exists (a baseline
#           binary: tools/gpu_base_binary.sh REV adds one) that one first, alternately, TRAIN_RUNS times
#           (default 2), each with TRAIN_ARGS; the result row and RESULT_JSON of each run are kept.
#   torch   torch_train_baseline.py --json (the PyTorch reference of the same step), unless NO_TORCH=1.
#   breakdown  ./bench_train_benchmark --breakdown: the phase table is kept (NO_BREAKDOWN=1: skipped).
#   extra   every line of $EXTRA (a file in the bundle, one shell command a line), in order.
#   trainer ./run_gpu_tests.sh worker_train_trainer_gpu_test (300 steps GPU vs CPU, ~280 s), only
#           with TRAINER=1 and more than 290 s left.
# Exit status: 1 when a test failed or a Switchyard binary exited non-zero, else 0.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here" || exit 1
start=$(date +%s)
budget=${BUDGET:-540}
out=${OUT:-/tmp/gpu_ab_call}
mkdir -p "$out/logs" || exit 1
summary="$out/summary.txt"
: >"$summary"
status=0
left() { echo $((budget - ($(date +%s) - start))); }
note() { echo "$*" | tee -a "$summary"; }
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${cudnn_lib:+$cudnn_lib:}$here/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
[[ -d $here/data ]] && export SWITCHYARD_DATA_DIR=${SWITCHYARD_DATA_DIR:-$here/data}

built=$(head -n 1 BUILT_FROM 2>/dev/null || sed -n 's/^commit: //p' MANIFEST 2>/dev/null | head -n 1)
note "gpu_ab_call: built from ${built:-unknown}, $(date -u +%FT%TZ), budget $budget s"
note "device: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"

if [[ -n ${TESTS:-} && $(left) -gt 30 ]]; then
  read -r -a patterns <<<"$TESTS"
  # The runner's own limit per binary; the section as a whole stops 20 s before the budget.
  GPU_TEST_RESULTS="$out/logs/tests" GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} \
    timeout $(($(left) - 20)) ./run_gpu_tests.sh "${patterns[@]}" >"$out/logs/tests.log" 2>&1
  rc=$?
  grep -E '^(PASS|FAIL|CRASH) |^gpu tests:' "$out/logs/tests.log" >>"$summary"
  if [[ $rc -ne 0 ]]; then
    status=1
    grep -q '^gpu tests:' "$out/logs/tests.log" || note "tests: stopped at the budget (exit $rc) before the summary"
  fi
fi

train_run() {  # name binary [args...]: at most 150 s, and never past the budget less 20 s
  local name=$1 rc limit=$(($(left) - 20))
  shift
  ((limit > 150)) && limit=150
  if ((limit < 10)); then
    note "$name: skipped (budget)"
    return
  fi
  timeout "$limit" "$@" ${TRAIN_ARGS:-} >"$out/logs/$name.log" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] || status=1
  note "$name (exit $rc): $(grep -E '^switchyard ' "$out/logs/$name.log" | tail -n 1)"
  grep '^RESULT_JSON' "$out/logs/$name.log" | cut -c1-400 >>"$summary"
}
for ((i = 1; i <= ${TRAIN_RUNS:-2}; ++i)); do
  [[ -x ./bench_train_benchmark && $(left) -gt 60 ]] || break
  [[ -x ./base_bench_train_benchmark ]] && train_run "base$i" ./base_bench_train_benchmark
  [[ $(left) -gt 40 ]] && train_run "new$i" ./bench_train_benchmark
done

if [[ ${NO_TORCH:-0} != 1 && -f torch_train_baseline.py && $(left) -gt 100 ]]; then
  timeout $(($(left) - 40)) python3 torch_train_baseline.py --json "$out/logs/torch_train.json" \
    >"$out/logs/torch.log" 2>&1
  note "torch (exit $?): $(grep -E '^median step' "$out/logs/torch.log" | tail -n 1)"
fi

if [[ ${NO_BREAKDOWN:-0} != 1 && -x ./bench_train_benchmark && $(left) -gt 60 ]]; then
  timeout $(($(left) - 20)) ./bench_train_benchmark --breakdown ${TRAIN_ARGS:-} \
    >"$out/logs/breakdown.log" 2>&1 || status=1
  grep -E '^ {2,}[a-z_.]+ +[0-9.]+ ms' "$out/logs/breakdown.log" >>"$summary"
fi

if [[ -n ${EXTRA:-} && -f $EXTRA ]]; then
  n=0
  while IFS= read -r cmd; do
    [[ -z $cmd || $cmd == \#* ]] && continue
    n=$((n + 1))
    if [[ $(left) -le 20 ]]; then
      note "extra $n: skipped (budget)"
      continue
    fi
    timeout $(($(left) - 10)) bash -c "$cmd" >"$out/logs/extra$n.log" 2>&1 </dev/null
    note "extra $n (exit $?): $cmd"
    tail -n 25 "$out/logs/extra$n.log" >>"$summary"
  done <"$EXTRA"
fi

if [[ ${TRAINER:-0} == 1 ]]; then
  if [[ $(left) -gt 290 ]]; then
    GPU_TEST_RESULTS="$out/logs/trainer" GPU_TEST_TIMEOUT=$(($(left) - 20)) \
      timeout $(($(left) - 10)) ./run_gpu_tests.sh worker_train_trainer_gpu_test \
      >"$out/logs/trainer.log" 2>&1 || status=1
    grep -E '^(PASS|FAIL|CRASH) |^gpu tests:|window' "$out/logs/trainer.log" >>"$summary"
  else
    note "trainer test: skipped ($(left) s left, needs 290)"
  fi
fi

note "gpu_ab_call: done, $(left) s of $budget left, exit $status"
tar -C "$out" -cJf "$out/logs.tar.xz" logs && rm -rf "$out/logs"
echo "===== summary ($summary) ====="
cat "$summary"
exit $status
