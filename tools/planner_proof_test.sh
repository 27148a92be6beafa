#!/usr/bin/env bash
# tools/planner_proof.sh end to end on the CPU: a real coordinator and two CPU workers (Gloo) run
# the quickstart model at EP 1 (EDP 2), EP 2 and CP 2 for 8 steps each; the coordinator's searched
# plan of the same spec must then carry those three runs as measured (MEASURED-MS filled on exactly
# those three mappings), a per-term calibration fitted on 3 mappings / 3 jobs with its four factors
# printed (compute, communication, EP all-to-all, bubble; the three mappings' terms separate
# compute, non-EP and EP communication, coordinator/planner/calibration.h), calibrated times on
# every ranked mapping and the ranking by them, each measured mapping's calibrated time within the
# printed fit error of its run, and the JSON in the run directory. Bad arguments are refused before
# anything starts. (Whether the calibrated first choice is within 10 % of the fastest measured
# mapping, issue 14's rule, is printed, not checked: on two shared CPU cores the runs of one
# mapping vary by about as much as the mappings differ.)
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
# A flat folder as the GPU bundle ships it.
source "$(dirname "$script")/flat_bundle_lib.sh"
bin="$tmp/bin"
flat_bundle "$bin" "$coordinator" "$worker" "$syctl" "$script" "$example"

# Bad arguments: exit 2 naming the problem, nothing started.
"$bin/planner_proof.sh" "$bin" "$bin/quickstart.yaml" 2 8 ep=x >"$tmp/bad.out" 2>&1
[[ $? -eq 2 ]] || fail "mapping ep=x accepted"
grep -q "is not KEY=N" "$tmp/bad.out" || fail "no reason for ep=x: $(cat "$tmp/bad.out")"
"$bin/planner_proof.sh" "$bin" "$bin/quickstart.yaml" 0 8 ep=1 >"$tmp/bad.out" 2>&1
[[ $? -eq 2 ]] || fail "world 0 accepted"

(cd "$bin" && env -i PATH=/usr/bin:/bin HOME=/tmp PROOF_DIR="$tmp/proof" \
  ./planner_proof.sh . quickstart.yaml 2 8 ep=1 ep=2 cp=2) >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[[ $rc -eq 0 ]] || fail "planner_proof.sh exited $rc (logs in $tmp/proof)"
calibration=$(grep -E '^Calibration \(per-term fit over 3 mappings, 3 jobs\): compute x[0-9.]+, communication x[0-9.]+, EP all-to-all x[0-9.]+, bubble x[0-9.]+; fit error up to [0-9.]+%$' "$tmp/out") ||
  fail "no per-term calibration with the EP factor fitted on the 3 runs"
fit_error=$(sed -E 's/.*fit error up to ([0-9.]+)%$/\1/' <<<"$calibration")
rows=$(grep -E '^  [0-9]+ +TP' "$tmp/out")
# The three mappings that ran carry a measured step time; no other row does.
measured=$(awk '$19 != "-" {print}' <<<"$rows" | wc -l)
ep1=$(grep -E '^  [0-9]+ +TP1 CP1 DP2 PP1 \| ETP1 EP1 EDP2 ' <<<"$rows")
ep2=$(grep -E '^  [0-9]+ +TP1 CP1 DP2 PP1 \| ETP1 EP2 EDP1 ' <<<"$rows")
cp2=$(grep -E '^  [0-9]+ +TP1 CP2 DP1 PP1 \| ETP1 EP1 EDP2 ' <<<"$rows")
[[ -n $ep1 && -n $ep2 && -n $cp2 ]] || fail "the EP 1 / EP 2 / CP 2 mappings are not ranked"
[[ $(awk '{print $19}' <<<"$ep1") =~ ^[0-9.]+$ ]] || fail "EP 1 has no MEASURED-MS: $ep1"
[[ $(awk '{print $19}' <<<"$ep2") =~ ^[0-9.]+$ ]] || fail "EP 2 has no MEASURED-MS: $ep2"
[[ $(awk '{print $19}' <<<"$cp2") =~ ^[0-9.]+$ ]] || fail "CP 2 has no MEASURED-MS: $cp2"
[[ $measured -eq 3 ]] || fail "$measured ranked rows carry MEASURED-MS, want exactly the 3 that ran"
# Every ranked row has a calibrated time, and the rows are in its order.
awk '$18 !~ /^[0-9.]+$/ {exit 1} NR > 1 && $18 + 0 < last {exit 1} {last = $18 + 0}' <<<"$rows" ||
  fail "a ranked mapping has no CAL-MS, or the ranking does not follow CAL-MS"
# The calibrated time of each measured mapping is within the fit error of its run (the printed
# error rounds to 0.1 %).
awk -v e="$fit_error" '$19 != "-" {d = ($18 - $19) / $19 * 100; if (d < 0) d = -d;
  if (d > e + 0.051) {print; exit 1}}' <<<"$rows" ||
  fail "a measured mapping's CAL-MS is further from its run than the fit error $fit_error %"
best=$(head -1 <<<"$rows")
fastest=$(awk '$19 != "-" {print $19}' <<<"$rows" | sort -g | head -1)
echo "calibrated first choice: $(awk '{print $2, $3, $4, $5, $7, $8, $9}' <<<"$best"), measured" \
  "$(awk '{print $19}' <<<"$best") ms; fastest measured $fastest ms"
grep -Eq '"method": *"PER_TERM"' "$tmp/proof/plan.json" || fail "plan.json has no per-term calibration"
[[ $(wc -l <"$tmp/proof/runs.txt") -eq 3 ]] || fail "runs.txt does not list the 3 runs"
echo PASS
