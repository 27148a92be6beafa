#!/usr/bin/env bash
# tools/planner_proof.sh end to end on the CPU: a real coordinator and two CPU workers (Gloo) run
# the quickstart model at EP 1 and EP 2 for 8 steps each; the coordinator's searched plan of the
# same spec must then carry those two runs as measured (MEASURED-MS filled on exactly those two
# mappings), a per-term calibration fitted on 2 mappings / 2 jobs, calibrated times on every
# ranked mapping, and the JSON in the run directory. Bad arguments are refused before anything
# starts.
set -u
coordinator=$(realpath "$1")
worker=$(realpath "$2")
syctl=$(realpath "$3")
script=$(realpath "$4")
example=$(realpath "$5")
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
home=$(getent passwd "$(id -un)" | cut -d: -f6)
data="${SWITCHYARD_DATA_DIR:-$home/.cache/switchyard/data}"
[[ -f $data/kjv/corpus.json ]] || fail "no default corpus in $data (run tools/setup.sh)"

# A flat folder as the GPU bundle ships it.
bin="$tmp/bin"
rm -rf "$bin"
mkdir -p "$bin/data"
ln -s "$coordinator" "$bin/switchyard-coordinator"
ln -s "$worker" "$bin/switchyard-worker"
ln -s "$syctl" "$bin/syctl"
cp "$script" "$bin/planner_proof.sh"
cp "$(dirname "$script")/cluster_lib.sh" "$bin/cluster_lib.sh"
cp "$example" "$bin/quickstart.yaml"
ln -s "$data/kjv" "$bin/data/kjv"

# Bad arguments: exit 2 naming the problem, nothing started.
"$bin/planner_proof.sh" "$bin" "$bin/quickstart.yaml" 2 8 ep=x >"$tmp/bad.out" 2>&1
[[ $? -eq 2 ]] || fail "mapping ep=x accepted"
grep -q "is not KEY=N" "$tmp/bad.out" || fail "no reason for ep=x: $(cat "$tmp/bad.out")"
"$bin/planner_proof.sh" "$bin" "$bin/quickstart.yaml" 0 8 ep=1 >"$tmp/bad.out" 2>&1
[[ $? -eq 2 ]] || fail "world 0 accepted"

(cd "$bin" && env -i PATH=/usr/bin:/bin HOME=/tmp PROOF_DIR="$tmp/proof" \
  ./planner_proof.sh . quickstart.yaml 2 8 ep=1 ep=2) >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[[ $rc -eq 0 ]] || fail "planner_proof.sh exited $rc (logs in $tmp/proof)"
grep -q '^Calibration (per-term fit over 2 mappings, 2 jobs)' "$tmp/out" ||
  grep -q '^Calibration (single ratio over 2 mappings, 2 jobs)' "$tmp/out" ||
  fail "no calibration fitted on the 2 runs"
# The two mappings that ran carry a measured step time; no other row does.
measured=$(grep -E '^  [0-9]+ +TP' "$tmp/out" | awk '$19 != "-" {print}' | wc -l)
ep1=$(grep -E '^  [0-9]+ +TP1 CP1 DP2 PP1 \| ETP1 EP1 EDP2 ' "$tmp/out")
ep2=$(grep -E '^  [0-9]+ +TP1 CP1 DP2 PP1 \| ETP1 EP2 EDP1 ' "$tmp/out")
[[ -n $ep1 && -n $ep2 ]] || fail "the EP 1 / EP 2 mappings are not ranked"
[[ $(awk '{print $19}' <<<"$ep1") =~ ^[0-9.]+$ ]] || fail "EP 1 has no MEASURED-MS: $ep1"
[[ $(awk '{print $19}' <<<"$ep2") =~ ^[0-9.]+$ ]] || fail "EP 2 has no MEASURED-MS: $ep2"
[[ $measured -eq 2 ]] || fail "$measured ranked rows carry MEASURED-MS, want exactly the 2 that ran"
# Every ranked row has a calibrated time.
if grep -E '^  [0-9]+ +TP' "$tmp/out" | awk '$18 == "-" {bad = 1} END {exit !bad}'; then
  fail "a ranked mapping has no CAL-MS"
fi
grep -q '"calibration"' "$tmp/proof/plan.json" || fail "plan.json has no calibration"
[[ $(wc -l <"$tmp/proof/runs.txt") -eq 2 ]] || fail "runs.txt does not list the 2 runs"
echo PASS
