#!/usr/bin/env bash
# Runs the GPU bundle (built by tools/gpu_bundle.sh; this file is copied into it as
# run_gpu_tests.sh) on a GPU host: `switchyard-worker --self-check`, then every *_gpu_test binary
# of the bundle, one at a time, each with a timeout and --gtest_output=xml.
#
# Usage: ./run_gpu_tests.sh [name-substring...]   (only binaries whose name contains one of them)
# Environment: GPU_TEST_RESULTS (default ./results: one .xml and .log per binary),
#              GPU_TEST_TIMEOUT (seconds per binary, default 900).
#
# Output: each binary's own output as it runs, then one line per binary
#   PASS|FAIL <name>: N passed, N failed, N skipped, T s
# and the total
#   gpu tests: N passed, N failed, N skipped
# Exit status 0 only if the self-check and every binary succeeded (a crash or timeout counts as
# one failed test of that binary).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# cuDNN (attention's cuDNN backend, loaded at run time): the nvidia-cudnn-cu13 wheel's folder
# first when python3 has it (one consistent cuDNN 9; the host's own may be older), else whatever
# libcudnn.so.9 the search path finds.
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${cudnn_lib:+$cudnn_lib:}$here/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0  # NVLink SHARP stays off on the GPU hosts
# The default corpus travels in the bundle (tools/gpu_bundle.sh).
[[ -d $here/data ]] && export SWITCHYARD_DATA_DIR=${SWITCHYARD_DATA_DIR:-$here/data}
results=${GPU_TEST_RESULTS:-$here/results}
timeout_s=${GPU_TEST_TIMEOUT:-900}
mkdir -p "$results" || exit 1
status=0

echo "== switchyard-worker --self-check"
"$here/switchyard-worker" --self-check
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "FAIL switchyard-worker --self-check: exit $rc"
  status=1
fi

# Sum of one attribute over the <testsuite> elements of a gtest XML report.
xml_sum() {
  awk -v key="$1" '/<testsuite / {
      if (match($0, " " key "=\"[0-9]+\"")) {
        s = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", s); n += s
      }
    } END { print n + 0 }' "$2"
}

shopt -s nullglob
summary=()
total_pass=0 total_fail=0 total_skip=0 ran=0
for t in "$here"/*_gpu_test; do
  name=$(basename "$t")
  if [[ $# -gt 0 ]]; then
    selected=0
    for pat in "$@"; do [[ $name == *"$pat"* ]] && selected=1; done
    [[ $selected -eq 1 ]] || continue
  fi
  ran=$((ran + 1))
  xml="$results/$name.xml"
  out="$results/$name.log"
  rm -f "$xml"
  echo "== $name"
  start=$(date +%s.%N)
  timeout -k 10 "$timeout_s" "$t" --gtest_output="xml:$xml" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

  if [[ -s $xml ]]; then
    tests=$(xml_sum tests "$xml")
    failed=$(($(xml_sum failures "$xml") + $(xml_sum errors "$xml")))
    skipped=$(xml_sum skipped "$xml")
    disabled=$(xml_sum disabled "$xml")
    passed=$((tests - failed - skipped - disabled))
  else  # crashed before writing the report: count what its output shows
    passed=$(grep -cE '^\[       OK \] .* \([0-9]+ ms\)$' "$out")
    failed=0
    skipped=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$out")
  fi
  if [[ $rc -ne 0 && $failed -eq 0 ]]; then
    if [[ $rc -eq 124 ]]; then
      why="timed out after $timeout_s s"
    elif [[ $rc -gt 128 ]]; then
      why="killed by signal $((rc - 128))"  # 9: timeout's hard kill, or out of memory
    else
      why="exit status $rc"
    fi
    [[ -s $xml ]] || why="$why, no XML report"
    echo "CRASH $name: $why"
    failed=1
  fi
  if [[ $rc -eq 0 && ! -s $xml ]]; then
    echo "CRASH $name: exit status 0 but no XML report"
    failed=$((failed + 1))
  fi
  verdict=PASS
  if [[ $failed -gt 0 ]]; then
    verdict=FAIL
    status=1
  fi
  summary+=("$verdict $name: $passed passed, $failed failed, $skipped skipped, $secs s")
  total_pass=$((total_pass + passed))
  total_fail=$((total_fail + failed))
  total_skip=$((total_skip + skipped))
done

if [[ $ran -eq 0 ]]; then
  echo "no *_gpu_test binaries in $here${*:+ matching: $*}"
  status=1
fi
echo "== summary (reports in $results)"
for line in "${summary[@]}"; do echo "$line"; done
echo "gpu tests: $total_pass passed, $total_fail failed, $total_skip skipped"
exit $status
