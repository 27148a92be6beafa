#!/usr/bin/env bash
# tools/readme_check.py on the source tree (every README command block covered), then on a
# made-up tree whose README has a block nobody runs: the checker must refuse it, naming the file
# and line (a negative control: the check can fail).
set -u
checker=$(realpath tools/readme_check.py)
python3 "$checker" || { echo "FAIL: README command blocks not covered (above)"; exit 1; }

fake="${TEST_TMPDIR:-$(mktemp -d)}/fake-tree"
rm -rf "$fake"
mkdir -p "$fake/tools"
touch "$fake/WORKSPACE"
printf '# Fake\n\n```sh\nrm -rf /nowhere   # run by no test\n```\n' >"$fake/README.md"
for d in a b c d; do
  mkdir -p "$fake/$d"
  printf '# %s\n\nNo commands.\n' "$d" >"$fake/$d/README.md"
done
git -C "$fake" init -q && git -C "$fake" add -A || { echo "FAIL: git init in $fake"; exit 1; }
out=$(python3 "$checker" "$fake" 2>&1)
rc=$?
echo "negative control (an unlisted block in $fake/README.md): exit $rc"
echo "$out" | grep -E '^FAIL: README.md:3' | sed 's/^/    /'
[[ $rc -eq 1 ]] || { echo "FAIL: the checker accepted an unlisted block: $out"; exit 1; }
grep -q "^FAIL: README.md:3 (\`\`\`sh, first line 'rm -rf /nowhere" <<<"$out" ||
  { echo "FAIL: the checker did not name README.md:3: $out"; exit 1; }
echo "PASS: every README command block is covered; an unlisted one is refused"
