#!/usr/bin/env bash
# The syctl commands of cli/README.md's example block, run AS WRITTEN against a real coordinator
# (temp store, token file, the default corpus) with two real CPU workers. The block is extracted
# from the README at test time (continuation lines joined), so a README edit is tested too; the
# only substitutions are the placeholders a user replaces: the coordinator address and token file
# of the `export` line, `job.yaml` (a tiny job that finishes in seconds) and the job id 7 (the
# jobs this run created). Then examples/quickstart.yaml, submitted as-is, must run to SUCCEEDED
# (the coordinator fills its vocab_size from the default corpus).
set -u
syctl="$1"
coordinator="$2"
worker="$3"
readme="$4"
example="$5"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/coordinator.err "$tmp"/worker*.err; do
    [[ -f $f ]] && { echo "--- $f (tail):" >&2; tail -20 "$f" >&2; }
  done
  exit 1
}
home=$(getent passwd "$(id -un)" | cut -d: -f6)
export SWITCHYARD_DATA_DIR="${SWITCHYARD_DATA_DIR:-$home/.cache/switchyard/data}"
[[ -f $SWITCHYARD_DATA_DIR/kjv/corpus.json ]] ||
  fail "no default corpus in $SWITCHYARD_DATA_DIR (run tools/setup.sh)"

printf 'readme-token\n' >"$tmp/token"
printf 'readme-worker-token\n' >"$tmp/worker_token"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done' EXIT
rm -f "$tmp/readme.db"
"$coordinator" --store "$tmp/readme.db" --create-store --token-file "$tmp/token" \
  --worker-token-file "$tmp/worker_token" --host 127.0.0.1 \
  --grpc-port 0 --http-port 0 --checkpoint-root "$tmp/checkpoints" \
  >"$tmp/coordinator.out" 2>"$tmp/coordinator.err" &
pids+=($!)
for _ in $(seq 200); do
  grep -q listening "$tmp/coordinator.out" 2>/dev/null && break
  sleep 0.1
done
address=$(sed -n 's/.* grpc=\([^ ]*\) .*/\1/p' "$tmp/coordinator.out")
[[ -n $address ]] || fail "the coordinator did not print its ports"
grep -q 'default corpus "kjv"' "$tmp/coordinator.err" || fail "the coordinator found no corpus"
for i in 0 1; do
  "$worker" --coordinator "$address" --token-file "$tmp/worker_token" --device cpu \
    --heartbeat-ms 200 --checkpoint-root "$tmp/checkpoints" \
    >"$tmp/worker$i.out" 2>"$tmp/worker$i.err" &
  pids+=($!)
done

cat >"$tmp/job.yaml" <<'YAML'
display_name: readme-tiny
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 16, vocab_size: 64,
        ffn_hidden_size: 64, num_experts: 4, moe_router_topk: 2}
training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 10}
data: {mock_data: true}
YAML

# The first ``` block of the README, continuation lines joined.
mapfile -t commands < <(awk '/^```/{n++; next} n==1' "$readme" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta')
echo "extracted ${#commands[@]} lines from $readme"
(( ${#commands[@]} >= 8 )) || fail "expected at least 8 command lines in the README block"
ran=0
# Job 1: the job.yaml submit (--wait: it SUCCEEDS); job 2: the Megatron-flags job (too big for
# two workers: it waits). `watch jobs/7` watches job 1, `get 7`, `cancel 7` and `delete jobs/7`
# job 2.
for line in "${commands[@]}"; do
  line="${line%%#*}"  # a trailing comment
  [[ -z ${line// /} ]] && continue
  case "$line" in
    export\ *)
      export SYCTL_COORDINATOR="$address" SYCTL_TOKEN_FILE="$tmp/token"
      echo "ok: $line (values replaced)"
      continue
      ;;
  esac
  run="${line//job.yaml/$tmp/job.yaml}"
  run="${run//watch jobs\/7/watch jobs/1}"
  run="${run//get 7/get 2}"
  run="${run//cancel 7/cancel 2}"
  run="${run//delete jobs\/7/delete jobs/2}"
  out=$(cd "$(dirname "$example")/.." && eval "\"$syctl\" ${run#syctl }" 2>"$tmp/err")
  rc=$?
  [[ $rc -eq 0 ]] || fail "'$line' exited $rc: $(cat "$tmp/err")"
  echo "ok: $line"
  echo "$out" | head -5 | sed 's/^/    /'
  ran=$((ran + 1))
  case "$line" in
    *"plan -f examples/quickstart.yaml --search"*)
      grep -q '^Search: every mapping of 4 ranks; varied TP, CP, PP, ETP, EP' <<<"$out" ||
        fail "plan --search: no search line: $out"
      grep -Eq '^  1 +TP[0-9]+ CP[0-9]+ DP[0-9]+ PP[0-9]+ ' <<<"$out" &&
        grep -Eq '^  2 +TP[0-9]+ CP[0-9]+ DP[0-9]+ PP[0-9]+ ' <<<"$out" ||
        fail "plan --search: fewer than two ranked mappings: $out" ;;
    *"plan -f examples/quickstart.yaml"*)
      grep -q '^Best mapping: TP1 CP1 DP' <<<"$out" || fail "plan: no mapping the workers run: $out" ;;
    *"get 7 -o yaml"*)
      grep -q 'state: PENDING' <<<"$out" || fail "get: the Megatron job is not PENDING: $out"
      grep -Eq 'reason: (WAITING_FOR_WORKERS|NO_FEASIBLE_PLAN)' <<<"$out" ||
        fail "get: the PENDING job does not say what it waits for: $out" ;;
    *"submit -f job.yaml"*)
      grep -q 'SUCCEEDED' "$tmp/err" || fail "submit --wait did not end SUCCEEDED" ;;
  esac
done
(( ran >= 7 )) || fail "only $ran syctl commands ran"

# The issue's end-to-end checks beyond the README: a job with save_interval and no save runs to
# SUCCEEDED in its own directory; a job needing a third worker says why in get and watch.
tiny_model='model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 16,
        vocab_size: 64, ffn_hidden_size: 64, num_experts: 4, moe_router_topk: 2}'
printf '%s\n%s\n%s\n' "display_name: save-interval-no-save" "$tiny_model" \
  'training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 10, save_interval: 5}
data: {mock_data: true}' >"$tmp/save_interval.yaml"
out=$("$syctl" submit -f "$tmp/save_interval.yaml" --wait -o name 2>"$tmp/err") ||
  fail "save_interval without save: $(cat "$tmp/err")"
grep -q 'SUCCEEDED' "$tmp/err" || fail "save_interval without save did not SUCCEED: $(cat "$tmp/err")"
ls -d "$tmp/checkpoints/jobs/${out#jobs/}"/step_* >/dev/null 2>&1 ||
  fail "save_interval without save: no step_* under $tmp/checkpoints/jobs/${out#jobs/}"
echo "ok: $out (save_interval 5, no save) SUCCEEDED; checkpoints in <root>/jobs/${out#jobs/}"
printf '%s\n%s\n%s\n' "display_name: needs-three" "$tiny_model" \
  'min_workers: 3
training: {micro_batch_size: 1, global_batch_size: 3, train_iters: 10}
data: {mock_data: true}' >"$tmp/three.yaml"
three=$("$syctl" submit -f "$tmp/three.yaml" -o name 2>"$tmp/err") ||
  fail "needs-three: $(cat "$tmp/err")"
want='WAITING_FOR_WORKERS: needs 3 worker(s), 2 attached'
for _ in $(seq 100); do
  out=$("$syctl" get "$three" 2>&1)
  grep -qF "$want" <<<"$out" && break
  sleep 0.2
done
grep -qF "$want" <<<"$out" || fail "get $three does not say what it waits for: $out"
grep -E '^(State|Waiting):' <<<"$out" | sed 's/^/    /'
out=$(timeout 3 "$syctl" watch "$three" 2>&1)
grep -qF "$want" <<<"$out" || fail "watch $three does not show what it waits for: $out"
echo "ok: get and watch of $three show '$want'"
"$syctl" cancel "$three" >/dev/null || fail "cancel $three"

# examples/quickstart.yaml as written: accepted (vocab_size from the corpus, save relative to the
# job's directory), it trains its 100 steps and SUCCEEDS, checkpointing under the job directory.
out=$(cd "$(dirname "$example")/.." && "$syctl" submit -f examples/quickstart.yaml -o name 2>"$tmp/err") ||
  fail "submit examples/quickstart.yaml: $(cat "$tmp/err")"
job=$out
echo "ok: syctl submit -f examples/quickstart.yaml -> $job"
start=$SECONDS
state=""
while (( SECONDS - start < 780 )); do
  out=$("$syctl" get "$job" 2>&1)
  state=$(sed -n 's/^State: *\([A-Z]*\).*/\1/p' <<<"$out")
  [[ $state == SUCCEEDED ]] && break
  [[ $state == FAILED || $state == CANCELLED ]] && fail "quickstart job ended $state: $out"
  sleep 1
done
[[ $state == SUCCEEDED ]] || fail "quickstart job did not succeed in 780 s: $out"
echo "$out" | sed 's/^/    /'
id=${job#jobs/}
ls -d "$tmp/checkpoints/jobs/$id/quickstart-checkpoints"/* >/dev/null 2>&1 ||
  fail "no checkpoint under $tmp/checkpoints/jobs/$id/quickstart-checkpoints"
echo "ok: $job SUCCEEDED in $((SECONDS - start)) s; checkpoints in <root>/jobs/$id/quickstart-checkpoints"
echo "PASS: $ran README commands and the quickstart example"
