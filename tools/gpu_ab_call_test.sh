#!/usr/bin/env bash
# tools/gpu_ab_call.sh on the CPU, in a bundle-shaped folder whose GPU programs are stand-ins
# (shell scripts printing what the real ones print): the summary holds the tests' verdicts, each
# train run's row and RESULT_JSON in base/new order, the PyTorch median, the breakdown phases and
# the extra commands, and is printed last; the logs come back as one archive; a failing test or
# binary gives exit 1; sections that do not fit the budget are skipped, not started.
set -euo pipefail
script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=${TEST_TMPDIR:-$(mktemp -d)}/gpu_ab_call
fail() { echo "FAIL: $*" >&2; exit 1; }

make_bundle() {  # dir test_verdict(PASS|FAIL)
  local d=$1
  rm -rf "$d" && mkdir -p "$d"
  cp "$script" "$d/gpu_ab_call.sh"
  echo deadbeef >"$d/BUILT_FROM"
  cat >"$d/run_gpu_tests.sh" <<STUB
#!/usr/bin/env bash
echo "== some test output"; echo "[  FAILED  ] not a verdict line"
for p in "\$@"; do echo "$2 \${p}_gpu_test: 3 passed, $([[ $2 == PASS ]] && echo 0 || echo 1) failed, 0 skipped, 1.0 s"; done
echo "gpu tests: 6 passed, 0 failed, 0 skipped"
[[ $2 == PASS ]]
STUB
  for b in bench_train_benchmark base_bench_train_benchmark; do
    cat >"$d/$b" <<STUB
#!/usr/bin/env bash
if [[ " \$* " == *" --breakdown "* ]]; then
  echo "    layer.fwd                                 132.60 ms   29.1 %  (x96)"
  echo "          aux_loss                              4.90 ms    1.1 %  (x96)"
  exit 0
fi
echo "step 1/7 | loss 10.7"
echo "switchyard          $([[ $b == base* ]] && echo 455.7 || echo 453.3)       143815      321.3    32.5%"
echo 'RESULT_JSON {"binary":"$b","args":"'"\$*"'"}'
STUB
  done
  printf '%s\n' 'print("step 7/7 | loss 10.6")' 'print("median step 1012.0 ms, 64760 tokens/s")' \
    >"$d/torch_train_baseline.py"
  # The first command reads stdin: it must not eat the lines after it.
  printf '%s\n' '# a comment' 'cat >/dev/null; echo extra-one' '' 'echo extra-two; exit 3' \
    >"$d/extra.txt"
  chmod +x "$d"/*.sh "$d"/*bench_train_benchmark
}

# 1. Everything fits: order of the summary, printed last, one archive.
make_bundle "$work/b1" PASS
out1="$work/out1"
BUDGET=400 OUT=$out1 TESTS="kernels_a kernels_b" TRAIN_ARGS="--steps 3" EXTRA=extra.txt \
  "$work/b1/gpu_ab_call.sh" >"$work/stdout1" 2>&1 || fail "exit $? with everything passing: $(cat "$work/stdout1")"
s=$(cat "$out1/summary.txt")
grep -q '^gpu_ab_call: built from deadbeef' <<<"$s" || fail "no BUILT_FROM line: $s"
grep -q '^PASS kernels_a_gpu_test: 3 passed' <<<"$s" || fail "no test verdict: $s"
grep -q '^gpu tests: 6 passed' <<<"$s" || fail "no test total: $s"
grep -q 'not a verdict' <<<"$s" && fail "test output leaked into the summary: $s"
order=$(grep -oE '^(base|new)[0-9]' <<<"$s" | tr '\n' ' ')
[[ $order == "base1 new1 base2 new2 " ]] || fail "train order '$order': $s"
grep -q '^new2 (exit 0): switchyard          453.3' <<<"$s" || fail "no new2 row: $s"
grep -q 'RESULT_JSON {"binary":"base_bench_train_benchmark","args":"--steps 3"}' <<<"$s" ||
  fail "TRAIN_ARGS not passed or RESULT_JSON missing: $s"
grep -q '^torch (exit 0): median step 1012.0 ms' <<<"$s" || fail "no torch line: $s"
grep -q 'aux_loss  *4.90 ms' <<<"$s" || fail "no breakdown phase: $s"
grep -q '^extra 1 (exit 0): cat >/dev/null; echo extra-one' <<<"$s" || fail "extra 1: $s"
grep -q '^extra 2 (exit 3): echo extra-two; exit 3' <<<"$s" || fail "extra 2: $s"
grep -q '^extra-two' <<<"$s" || fail "extra output missing: $s"
grep -q 'trainer test' <<<"$s" && fail "trainer test without TRAINER=1: $s"
[[ $(tail -n 1 "$work/stdout1") == "gpu_ab_call: done,"*"exit 0" ]] ||
  fail "summary not printed last: $(tail -n 3 "$work/stdout1")"
[[ -f $out1/logs.tar.xz && ! -e $out1/logs ]] || fail "logs not archived: $(ls "$out1")"
tar -tJf "$out1/logs.tar.xz" | grep -q 'logs/breakdown.log' || fail "breakdown log not in the archive"
[[ $(ls "$out1" | wc -l) -eq 2 ]] || fail "more than two files in OUT: $(ls "$out1")"

# 2. A failing test: exit 1, its FAIL line kept, the rest still runs.
make_bundle "$work/b2" FAIL
if BUDGET=400 OUT="$work/out2" TESTS="kernels_a" NO_TORCH=1 NO_BREAKDOWN=1 "$work/b2/gpu_ab_call.sh" \
  >"$work/stdout2" 2>&1; then
  fail "exit 0 with a failing test"
fi
grep -q '^FAIL kernels_a_gpu_test: 3 passed, 1 failed' "$work/out2/summary.txt" || fail "no FAIL line"
grep -q '^new1 (exit 0)' "$work/out2/summary.txt" || fail "train did not run after a failing test"
grep -q '^torch' "$work/out2/summary.txt" && fail "torch ran with NO_TORCH=1"
grep -q 'layer.fwd\|aux_loss' "$work/out2/summary.txt" && fail "breakdown ran with NO_BREAKDOWN=1"

# 3. A small budget: the sections that do not fit are skipped, the trainer test says why.
make_bundle "$work/b3" PASS
BUDGET=50 OUT="$work/out3" TESTS="kernels_a" TRAINER=1 "$work/b3/gpu_ab_call.sh" >"$work/stdout3" 2>&1 ||
  fail "exit $? with a small budget"
s=$(cat "$work/out3/summary.txt")
grep -q '^PASS kernels_a_gpu_test' <<<"$s" || fail "tests skipped at 50 s: $s"
grep -qE '^(base|new)[0-9]|^torch|layer.fwd' <<<"$s" && fail "a section ran past the budget: $s"
grep -q '^trainer test: skipped (.* s left, needs 290)' <<<"$s" || fail "no trainer skip line: $s"
echo "gpu_ab_call_test: PASS"
