#!/usr/bin/env bash
# The layering check (../shared/DESIGN.md "Layout"; the package groups in the root BUILD): for each
# fixture package, `allowed` must pass analysis and `forbidden` must fail it because a dependency
# is not visible. Run by tools/test.sh after the build; exits non-zero naming the first fixture
# that does not behave. Usage: tools/layering_check.sh [bazel flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
fixtures=(
  "coordinator/testdata/layering:coordinator -> worker"
  "kernels/testdata/layering:kernels -> proto"
  "coordinator/jobs/testdata/layering:coordinator/jobs -> coordinator/api"
)
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for entry in "${fixtures[@]}"; do
  pkg=${entry%%:*}
  edge=${entry#*:}
  if ! bazel build "$@" --nobuild "//$pkg:allowed" >"$log" 2>&1; then
    echo "layering: //$pkg:allowed should pass analysis and does not:"
    tail -20 "$log"
    failed=1
    continue
  fi
  if bazel build "$@" --nobuild "//$pkg:forbidden" >"$log" 2>&1; then
    echo "layering: FORBIDDEN edge $edge (//$pkg:forbidden) passed analysis"
    failed=1
  elif grep -q "is not visible from target" "$log"; then
    echo "layering: $edge refused: $(grep -m1 -o "target '[^']*' is not visible from target '[^']*'" "$log")"
  else
    echo "layering: //$pkg:forbidden failed for another reason than visibility:"
    tail -20 "$log"
    failed=1
  fi
done
exit "$failed"
