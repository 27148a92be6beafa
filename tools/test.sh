#!/usr/bin/env bash
# The test suite: sets the machine up if needed, checks formatting, builds everything (GPU tests
# and benchmarks included, so CI proves they compile) and runs every test, then runs README.md's
# first quick-start command as written (tools/quickstart.sh: setup and build are no-ops by then,
# the cluster quickstart trains the example job, a few minutes on 2 cores). GPU tests skip visibly
# on a machine without a GPU; the last line counts passed, failed and skipped test cases.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh

echo "== clang-format check"
files=$(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
if ! clang-format --dry-run --Werror $files; then
  echo "clang-format: the files above are not formatted (run: clang-format -i <file>)" >&2
  exit 1
fi

BAZEL_FLAGS=(--color=no --curses=no)
echo "== bazel build //..."
bazel build "${BAZEL_FLAGS[@]}" //...
echo "== layering check (tools/layering_check.sh)"
tools/layering_check.sh "${BAZEL_FLAGS[@]}"
echo "== bazel test //..."
set +e
bazel test "${BAZEL_FLAGS[@]}" //...
rc=$?
set -e

echo "== tools/quickstart.sh (README.md's quick start, as written)"
if tools/quickstart.sh; then
  echo "tools/quickstart.sh: the example job SUCCEEDED"
else
  echo "tools/quickstart.sh: FAILED (logs in /tmp/switchyard-quickstart)" >&2
  rc=1
fi

# Count only the reports of today's test targets (the output base keeps those of removed ones).
targets=$(mktemp)
bazel query "${BAZEL_FLAGS[@]}" 'tests(//...)' >"$targets" 2>/dev/null || : >"$targets"
if [[ -s $targets ]]; then
  python3 tools/test_summary.py "$(bazel info "${BAZEL_FLAGS[@]}" bazel-testlogs 2>/dev/null)" "$targets"
else
  python3 tools/test_summary.py "$(bazel info "${BAZEL_FLAGS[@]}" bazel-testlogs 2>/dev/null)"
fi
rm -f "$targets"
exit $rc
