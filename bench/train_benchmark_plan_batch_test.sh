#!/usr/bin/env bash
# train_benchmark --plan_batch --dry_run (no GPU): the planner's batch for the benchmark model.
set -u
bin="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

# 80 GiB (the default --device_gib): every micro-batch of the global batch 16 with each recompute
# variant is listed, and one is chosen and carried into PLAN_JSON.
out=$("$bin" --dry_run --plan_batch) || fail "--dry_run --plan_batch exited $?"
echo "$out"
grep -q '^planner batch plan ' <<<"$out" || fail "no plan header"
for micro in 1 2 4 8 16; do
  for mods in none moe_act moe_act+layernorm; do
    grep -Eq "^ +$micro +${mods//+/\\+} +[0-9.]+ +[0-9.]+ +[0-9]+ +(yes|no)" <<<"$out" ||
      fail "no candidate row micro $micro recompute $mods"
  done
done
[[ $(grep -c '<- chosen' <<<"$out") -eq 1 ]] || fail "not exactly one chosen candidate"
grep -q "^planner's choice: micro_batch " <<<"$out" || fail "no choice line"
json=$(grep '^PLAN_JSON ' <<<"$out") || fail "no PLAN_JSON"
grep -q '"plan_batch":{' <<<"$json" || fail "PLAN_JSON without plan_batch"
grep -q '"device_gib":80' <<<"$json" || fail "PLAN_JSON: device_gib not 80"
# The choice is the micro-batch the rest of the dry run estimated.
chosen=$(sed -E "s/^planner's choice: micro_batch ([0-9]+) .*/\1/;t;d" <<<"$out")
grep -q "\"micro_batch\":$chosen," <<<"$json" || fail "PLAN_JSON micro_batch is not the choice $chosen"

# A device too small for any candidate: no choice, exit 1, the planner's reason on stderr.
"$bin" --dry_run --plan_batch --device_gib 10 >/dev/null 2>"$TEST_TMPDIR/err"
rc=$?
cat "$TEST_TMPDIR/err"
[[ $rc -eq 1 ]] || fail "--device_gib 10: exit $rc, want 1"
grep -q 'RESOURCE_EXHAUSTED: no micro-batch fits' "$TEST_TMPDIR/err" || fail "no fit reason"

# The plan chooses the micro-batch and is one-GPU only.
"$bin" --dry_run --plan_batch --micro_batch 4 >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "--plan_batch with --micro_batch accepted"
"$bin" --dry_run --plan_batch --world 2 --ep 2 >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "--plan_batch with --world 2 accepted"
# --device_gib is for dry runs: a GPU run (here, with or without a GPU) rejects it before anything.
"$bin" --plan_batch --device_gib 80 >/dev/null 2>"$TEST_TMPDIR/err"
rc=$?
[[ $rc -eq 2 ]] || fail "--device_gib without --dry_run: exit $rc, want 2"
grep -q -- '--device_gib is for --dry_run only' "$TEST_TMPDIR/err" || fail "no --device_gib reason"
echo PASS
