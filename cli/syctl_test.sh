#!/usr/bin/env bash
# Command-line contract of syctl (cli/syctl.cc, cli/client.h) against the REAL coordinator binary
# on loopback (temp SQLite store, token file, --noworkers so jobs stay PENDING until cancelled):
# every verb, -o table/json/yaml/name, stdout vs stderr, and the exit codes 0/1/2/3.
set -u
bin="$1"
coordinator="$2"
worker="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
err="$tmp/err"
fail() {
  echo "FAIL: $*" >&2
  [[ -f $tmp/coordinator.err ]] && { echo "--- coordinator stderr:" >&2; cat "$tmp/coordinator.err" >&2; }
  exit 1
}
# expect <exit code> <stdout regex> <stderr regex> -- args...   ('^$' for stderr: must be empty)
expect() {
  local want_rc=$1 want_out=$2 want_err=$3
  shift 4
  local rc
  out=$("$bin" "$@" 2>"$err"); rc=$?
  [[ $rc -eq $want_rc ]] || fail "syctl $*: exit $rc, want $want_rc; stderr: $(cat "$err")"
  grep -Eq -- "$want_out" <<<"$out" || fail "syctl $*: stdout '$out' !~ /$want_out/"
  if [[ $want_err == '^$' ]]; then
    [[ ! -s $err ]] || fail "syctl $*: unexpected stderr '$(cat "$err")'"
  else
    grep -Eq -- "$want_err" "$err" || fail "syctl $*: stderr '$(cat "$err")' !~ /$want_err/"
  fi
  echo "ok: exit $rc: syctl $*"
}
# json <filter> <want>: checks a jq filter over the last stdout.
json() {
  local got
  got=$(jq -r "$1" <<<"$out") || fail "stdout is not JSON: '$out'"
  [[ $got == "$2" ]] || fail "jq '$1' = '$got', want '$2'"
  echo "   jq $1 = $got"
}

# --- no coordinator needed -----------------------------------------------------------------------
expect 0 '^syctl 0\.1\.0$' '^$' -- version
expect 0 '^\{"version":"0\.1\.0"\}$' '^$' -- -o json version
expect 0 '^\{"version":"0\.1\.0"\}$' '^$' -- version -o json
expect 0 '^\{"version":"0\.1\.0"\}$' '^$' -- --output=json version
expect 0 '^syctl 0\.1\.0$' '^$' -- -o text version
expect 0 '^version: "0\.1\.0"$' '^$' -- -o yaml version
expect 0 'exit codes' '^$' -- help
expect 0 'submit' '^$' -- --help
expect 2 '^$' 'missing verb' --
expect 2 '^$' "unknown verb 'frobnicate'" -- frobnicate
expect 2 '^$' "unknown output format 'wide'" -- -o wide version
expect 2 '^$' "unknown flag '--bogus'" -- --bogus version
expect 2 '^$' 'version takes no arguments' -- version extra
expect 2 '^$' "get: unknown flag '--bogus'" -- get --bogus 1
expect 2 '^$' 'get takes one job' -- get
expect 2 '^$' 'submit: give the job spec with -f' -- submit
expect 2 '^$' "list: --state 'sleeping' is not one of" -- list --state sleeping
expect 2 '^$' 'list: --page-size must be an integer >= 1' -- list --page-size 0
expect 2 '^$' 'plan: --gpus must be an integer >= 1' -- plan -f x.yaml --gpus zero
# A missing token is exit 3 with the way to give one, before any connection is tried.
unset SYCTL_TOKEN_FILE SYCTL_COORDINATOR SYCTL_TLS_ROOT_CERT
expect 3 '^$' 'no API token: pass --token-file FILE or set SYCTL_TOKEN_FILE' -- list
expect 3 '^$' "cannot read the token file '$tmp/absent'" -- --token-file "$tmp/absent" list
: >"$tmp/empty_token"
expect 3 '^$' 'is empty' -- --token-file "$tmp/empty_token" get 1

# --- the real coordinator --------------------------------------------------------------------------
printf '  s3cr3t-cli-token\n' >"$tmp/token"
printf 'w0rker-cli-token\n' >"$tmp/worker_token"  # the workers' own token (--worker-token-file)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done' EXIT
# start_coordinator <name> [flags...]: starts one on loopback, sets $address to its gRPC address.
start_coordinator() {
  local name=$1
  shift
  rm -f "$tmp/$name.db"
  "$coordinator" --store "$tmp/$name.db" --create-store --token-file "$tmp/token" \
    --worker-token-file "$tmp/worker_token" --host 127.0.0.1 \
    --grpc-port 0 --http-port 0 "$@" >"$tmp/$name.out" 2>"$tmp/coordinator.err" &
  pids+=($!)
  for _ in $(seq 200); do
    grep -q listening "$tmp/$name.out" 2>/dev/null && break
    sleep 0.1
  done
  echo "coordinator $name: $(cat "$tmp/$name.out")"
  address=$(sed -n 's/.* grpc=\([^ ]*\) .*/\1/p' "$tmp/$name.out")
  [[ -n $address ]] || fail "the coordinator did not print its ports"
}
# Without workers jobs stay PENDING: cancel and watch have a stable subject.
start_coordinator api --noworkers --checkpoint-root "$tmp/ckpt"
export SYCTL_COORDINATOR=$address SYCTL_TOKEN_FILE=$tmp/token

cat >"$tmp/spec.yaml" <<'EOF'
display_name: cli-test
model:
  num_layers: 4
  hidden_size: 128
  num_attention_heads: 2
  num_query_groups: 1
  kv_channels: 64
  ffn_hidden_size: 256
  seq_length: 64
  vocab_size: 4096
  num_experts: 8
  moe_router_topk: 2
  moe_ffn_hidden_size: 128
  moe_layer_freq: 2
training:
  micro_batch_size: 4
  global_batch_size: 32
  train_iters: 100
data:
  mock_data: true
EOF

# plan: table and json; an impossible memory budget is the server's RESOURCE_EXHAUSTED, exit 1.
expect 0 '^Best mapping: TP[0-9]+ CP[0-9]+ DP[0-9]+ PP[0-9]+ \| ETP[0-9]+ EP[0-9]+' '^$' -- \
  plan -f "$tmp/spec.yaml" --gpus 8
# (The coordinator plans the resolved spec, whose unset sizes default to 1: one mapping per
# world, so no Alternatives section; coordinator/jobs/resolve_spec.h ResolvePlanRequest.)
grep -q 'Memory per rank' <<<"$out" && grep -q 'Step time' <<<"$out" && grep -q 'Rejected:' <<<"$out" ||
  fail "plan table lacks a section: $out"
expect 0 '"best"' '^$' -- plan -f "$tmp/spec.yaml" --gpus 4 -o json
json '[.best.mapping.tensor_model_parallel_size, .best.mapping.context_parallel_size, .best.mapping.data_parallel_size, .best.mapping.pipeline_model_parallel_size] | map(. // 1) | .[0]*.[1]*.[2]*.[3]' 4
json '.best.memory.total > 0' true
expect 1 '^$' 'RESOURCE_EXHAUSTED: no parallel mapping fits' -- \
  plan -f "$tmp/spec.yaml" --gpus 2 --gpu-memory-gib 0.001
# plan --search: every mapping of --world ranks, varying the sizes the spec leaves unset (all of
# them here), ranked with the estimated, calibrated and measured columns; --json is -o json.
expect 0 '^Search: every mapping of 4 ranks; varied TP, CP, PP, ETP, EP \(unset in the spec\)' '^$' -- \
  plan -f "$tmp/spec.yaml" --search --world 4
grep -Eq '^  # +MAPPING +EST-MS +CAL-MS +MEASURED-MS +EST-GIB +MEASURED-GIB$' <<<"$out" ||
  fail "plan --search: no ranked table header: $out"
grep -Eq '^  2 +TP[0-9]+ CP[0-9]+ DP[0-9]+ PP[0-9]+ \| ETP[0-9]+ EP[0-9]+ ' <<<"$out" ||
  fail "plan --search: fewer than two ranked mappings: $out"
grep -q '^Calibration: none' <<<"$out" && grep -Eq '^Rejected: [0-9]+ mapping' <<<"$out" ||
  fail "plan --search: no calibration or rejected line: $out"
expect 0 '"search"' '^$' -- plan -f "$tmp/spec.yaml" --search --world 4 --json
json '.search.world_size' 4
json '.alternatives | length > 0' true
json '[.best] + .alternatives | map(.mapping | [.tensor_model_parallel_size, .context_parallel_size, .data_parallel_size, .pipeline_model_parallel_size] | map(. // 1) | .[0]*.[1]*.[2]*.[3]) | unique | tostring' '[4]'
json '[.best] + .alternatives | map(.mapping.expert_model_parallel_size // 1) | unique | length > 1' true
# Without --search the same spec is the scheduler's one mapping (no search in the plan).
expect 0 '"best"' '^$' -- plan -f "$tmp/spec.yaml" --gpus 4 --json
json '.search == null and (.alternatives // [] | length) == 0' true
# A size the spec sets stays pinned; one that cannot divide the world is refused naming the rule.
{ cat "$tmp/spec.yaml"; echo 'parallel: {expert_model_parallel_size: 2}'; } >"$tmp/spec_ep2.yaml"
expect 0 '"search"' '^$' -- plan -f "$tmp/spec_ep2.yaml" --search --world 4 -o json
json '[.best] + .alternatives | map(.mapping.expert_model_parallel_size) | unique | tostring' '[2]'
expect 1 '^$' 'INVALID_ARGUMENT: search.world_size \(3\) must be divisible by the expert grid the spec pins' -- \
  plan -f "$tmp/spec_ep2.yaml" --search --world 3 --gpus 8
expect 1 '^$' 'INVALID_ARGUMENT: search.world_size \(16\) must be at most cluster.num_gpus \(8\)' -- \
  plan -f "$tmp/spec.yaml" --search --world 16 --gpus 8
expect 2 '^$' 'plan: --world needs --search' -- plan -f "$tmp/spec.yaml" --world 4
expect 2 '^$' 'plan: --world must be an integer >= 1' -- plan -f "$tmp/spec.yaml" --search --world 0

# submit -f: json, table, name; the request id makes it idempotent.
expect 0 '"name": "jobs/1"' '^$' -- submit -f "$tmp/spec.yaml" -o json --request-id r-1
json .state PENDING
json .spec.display_name cli-test
json .spec.model.num_experts 8
expect 0 '"name": "jobs/1"' '^$' -- submit -f "$tmp/spec.yaml" -o json --request-id r-1
expect 0 '^NAME +DISPLAY-NAME +STATE' '^$' -- submit -f "$tmp/spec.yaml" --name second
grep -Eq '^jobs/2 +second +PENDING' <<<"$out" || fail "submit table row: $out"
expect 1 '^$' 'ALREADY_EXISTS' -- submit -f "$tmp/spec.yaml" --name other --request-id r-1
expect 1 '^$' "spec-missing.yaml" -- submit -f "$tmp/spec-missing.yaml"

# submit --megatron-args, over nothing and over a file; an unknown flag is exit 2 naming it.
megatron="--num-layers 2 --hidden-size 64 --num-attention-heads 2 --num-query-groups 1
  --ffn-hidden-size 128 --seq-length 32 --max-position-embeddings 32 --vocab-size 512
  --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-aux-loss-coeff 0.01
  --moe-router-load-balancing-type aux_loss --expert-model-parallel-size 2
  --micro-batch-size 2 --global-batch-size 8 --train-iters 20 --lr 3e-4 --min-lr 3e-5
  --lr-warmup-iters 2 --lr-decay-style cosine --bf16 --seed 7 --mock-data --qk-layernorm
  --untie-embeddings-and-output-weights --moe-router-score-function sigmoid
  --moe-router-enable-expert-bias --save ckpt --save-interval 10 --swiglu"
expect 0 '"name": "jobs/3"' '^$' -- submit --megatron-args "$megatron" -o json
json .spec.model.num_experts 4
json .spec.model.moe_router_score_function sigmoid
json .spec.parallel.expert_model_parallel_size 2
json .spec.training.train_iters 20
json .spec.training.bf16 true
json .spec.training.seed 7
json '.spec.model.moe_aux_loss_coeff[0]' 0.01
expect 0 '^jobs/4$' '^$' -- submit -f "$tmp/spec.yaml" --megatron-args "--train-iters 7" -o name
expect 0 '"7"' '^$' -- get jobs/4 -o json
json .spec.training.train_iters 7
json .spec.model.hidden_size 128
expect 2 '^$' "unknown Megatron flag '--frobnicate'" -- \
  submit --megatron-args "--num-layers 2 --frobnicate 3"
expect 2 '^$' "--num-layers: expected an integer, got 'two'" -- \
  submit --megatron-args "--num-layers two"
# Paths in a spec are relative to the coordinator's roots (coordinator/README.md "Job paths").
expect 1 '^$' 'training.save \("/tmp/ckpt"\) must be a relative path' -- \
  submit -f "$tmp/spec.yaml" --megatron-args "--save /tmp/ckpt"
# The coordinator's validation names the field: exit 1, INVALID_ARGUMENT.
expect 1 '^$' 'INVALID_ARGUMENT: model.hidden_size \(64\) must be divisible by model.num_attention_heads \(3\)' -- \
  submit --megatron-args "--num-layers 2 --hidden-size 64 --num-attention-heads 3 --train-iters 5"
expect 0 '^jobs/1$' 'more jobs' -- list -o name --state pending --page-size 1
n_jobs=$("$bin" list --all -o name | wc -l)
[[ $n_jobs -eq 4 ]] || fail "the rejected submits created jobs: $n_jobs jobs, want 4"
echo "ok: 4 jobs in the store after the rejected submits"

# get: jobs/ID or ID, detail table, yaml that parses; a missing job is NOT_FOUND, exit 1.
expect 0 '^Name: +jobs/2$' '^$' -- get jobs/2
grep -Eq '^State: +PENDING$' <<<"$out" || fail "get table: $out"
expect 0 'name: jobs/2' '^$' -- get 2 -o yaml
python3 -c 'import sys, yaml; d = yaml.safe_load(sys.stdin); assert d["name"] == "jobs/2", d; assert d["state"] == "PENDING"; assert d["spec"]["model"]["num_experts"] == 8; assert d["spec"]["training"]["train_iters"] == "100"; print("   yaml parses:", d["name"], d["state"], "num_experts", d["spec"]["model"]["num_experts"])' <<<"$out" ||
  fail "get -o yaml does not parse: $out"
expect 0 'jobs:' '^$' -- list -o yaml --all
python3 -c 'import sys, yaml; d = yaml.safe_load(sys.stdin); assert [j["name"] for j in d["jobs"]] == ["jobs/1", "jobs/2", "jobs/3", "jobs/4"], d; print("   yaml list parses:", len(d["jobs"]), "jobs")' <<<"$out" ||
  fail "list -o yaml does not parse: $out"
expect 1 '^$' 'NOT_FOUND: jobs/99 does not exist' -- get 99

# cancel, list with a state filter, pagination.
expect 0 '^jobs/2 +second +CANCELLED' '^$' -- cancel 2 -o table
expect 0 '"CANCELLED"' '^$' -- list --state CANCELLED -o json
json '.jobs | length' 1
json '.jobs[0].name' jobs/2
expect 0 '^NAME' '^$' -- list --state pending
[[ $(grep -c PENDING <<<"$out") -eq 3 ]] || fail "list --state pending: $out"
expect 0 '^NAME' 'more jobs: --page-token [^ ]+, or --all' -- list --page-size 2
[[ $(wc -l <<<"$out") -eq 3 ]] || fail "list --page-size 2: $out"
expect 0 'jobs/4' '^$' -- list --page-size 1 --all -o json
json '.jobs | length' 4
expect 1 '^$' 'FAILED_PRECONDITION' -- cancel jobs/2

# watch: a cancelled job replays its events and exits 1; json is one update per line.
expect 1 'CANCELLED gen 0' 'jobs/2 ended CANCELLED' -- watch jobs/2
grep -q 'PENDING gen 0 CREATED' <<<"$out" || fail "watch lacks the CREATED event: $out"
expect 1 '"state":"CANCELLED"' 'ended CANCELLED' -- watch 2 -o json
[[ $(wc -l <<<"$out") -eq 2 ]] || fail "watch -o json: want 2 lines, got: $out"
expect 1 '^$' 'NOT_FOUND' -- watch 77
# A watch that is open when the job is cancelled ends at once with exit 1.
"$bin" watch 3 >"$tmp/watch.out" 2>"$tmp/watch.err" &
watch_pid=$!
sleep 1
expect 0 'CANCELLED' '^$' -- cancel jobs/3
wait $watch_pid
watch_rc=$?
[[ $watch_rc -eq 1 ]] || fail "watch of a job cancelled meanwhile: exit $watch_rc"
grep -q 'CANCELLED gen 0' "$tmp/watch.out" || fail "live watch: $(cat "$tmp/watch.out")"
echo "ok: a live watch ended with exit 1 when the job was cancelled"

# delete: finished jobs only; --delete-checkpoints removes <checkpoint-root>/jobs/<id>; a deleted job is
# NOT_FOUND, or exit 0 with --allow-missing.
expect 2 '^$' 'delete takes one job' -- delete
expect 2 '^$' "delete: unknown flag '--force'" -- delete --force 2
expect 1 '^$' 'FAILED_PRECONDITION: jobs/1 is PENDING: only a finished job' -- delete 1
expect 0 '^Name: +jobs/1$' '^$' -- get 1
mkdir -p "$tmp/ckpt/jobs/2/iter_0000010" "$tmp/ckpt/jobs/3/iter_0000010"
expect 0 '^deleted jobs/3$' '^$' -- delete jobs/3
[[ -d $tmp/ckpt/jobs/3/iter_0000010 ]] || fail "delete without --delete-checkpoints removed them"
expect 1 '^$' 'NOT_FOUND: jobs/3 does not exist' -- get 3
expect 1 '^$' 'NOT_FOUND' -- delete 3
expect 0 '^deleted jobs/3$' '^$' -- delete 3 --allow-missing
expect 0 '^jobs/2$' '^$' -- delete 2 --delete-checkpoints -o name
[[ ! -e $tmp/ckpt/jobs/2 ]] || fail "delete --delete-checkpoints left $tmp/ckpt/jobs/2"
[[ -d $tmp/ckpt/jobs/3 ]] || fail "deleting jobs/2's checkpoints touched jobs/3's"
expect 0 'jobs/4' '^$' -- list -o name --all
[[ $(wc -l <<<"$out") -eq 2 ]] || fail "after two deletes: $out"
echo "ok: delete refused PENDING, removed jobs/2 (with checkpoints) and jobs/3 (without)"

# k8s-workers: the manifest of a job's workers from the coordinator (cli/k8s_workers.h; the
# manifests themselves are checked by //deploy:deploy_test): jobs/1 is PENDING and needs 1 worker.
expect 2 '^$' 'k8s-workers takes one job' -- k8s-workers
expect 0 '^kind: Job$' '^$' -- k8s-workers 1
grep -q -- '- --job=jobs/1$' <<<"$out" || fail "k8s-workers 1: no --job=jobs/1 in '$out'"
grep -q -- 'subPath: jobs/1$' <<<"$out" || fail "k8s-workers 1: no subPath jobs/1 in '$out'"
grep -q -- '^  completions: 1$' <<<"$out" || fail "k8s-workers 1: completions in '$out'"
expect 2 '^$' 'INVALID_ARGUMENT: --namespace' -- k8s-workers 1 --namespace Bad_NS
expect 1 '^$' 'NOT_FOUND' -- k8s-workers 3
expect 0 'CANCELLED' '^$' -- cancel 4
expect 1 '^$' 'FAILED_PRECONDITION: jobs/4 is already CANCELLED' -- k8s-workers 4
echo "ok: k8s-workers printed jobs/1's worker Job, refused a bad namespace, a deleted and a finished job"

# Connection and token failures: exit 3.
printf 'wrong\n' >"$tmp/bad_token"
expect 3 '^$' 'UNAUTHENTICATED: .*INVALID_TOKEN' -- --token-file "$tmp/bad_token" get 1
expect 3 '^$' 'UNAUTHENTICATED: .*INVALID_TOKEN' -- --token-file="$tmp/bad_token" plan -f "$tmp/spec.yaml"
(unset SYCTL_TOKEN_FILE; expect 3 '^$' 'no API token' -- list) || exit 1
# The workers' token is not an API token.
expect 3 '^$' 'UNAUTHENTICATED: .*worker token.*WRONG_ROLE' -- --token-file "$tmp/worker_token" list

# request_id: every submit gets a fresh one, reused by its own retries. A deadline of 1 us
# usually passes before the first attempt is answered (DEADLINE_EXCEEDED); each retry doubles
# it (2^20 us is 1 s), so one attempt finally succeeds, and however many attempts reached the
# server, exactly one job exists. gRPC keeps deadlines in milliseconds, so now + 1 us can round
# up to the next millisecond and a fast loopback call occasionally succeeds at once (seen once
# in CI): each try is checked for exactly one job, and up to 5 tries must show the retry path.
retry_seen=0
for try in 1 2 3 4 5; do
  n_before=$("$bin" list --all -o name | wc -l)
  out=$("$bin" submit -f "$tmp/spec.yaml" --name "retried-$try" --timeout 0.000001 --retries 20 \
    -o name 2>"$err") || fail "retried submit: exit $?; stderr: $(cat "$err")"
  grep -Eq '^jobs/[0-9]+$' <<<"$out" || fail "retried submit: stdout '$out' !~ /^jobs/[0-9]+$/"
  retried_job=$out
  n_after=$("$bin" list --all -o name | wc -l)
  echo "   $(grep -c 'retry' "$err") retries, then $retried_job; jobs $n_before -> $n_after"
  [[ $n_after -eq $((n_before + 1)) ]] || fail "retried submit: $n_before -> $n_after jobs, want +1"
  n_retried=$("$bin" list --all | grep -Ec "^jobs/[0-9]+ +retried-$try ")
  [[ $n_retried -eq 1 ]] || fail "retried submit created $n_retried jobs named 'retried-$try'"
  if grep -Eq 'DEADLINE_EXCEEDED: .*retry 1 of 20 .*request_id [0-9a-f]{8}-[0-9a-f]{4}-4' "$err"; then
    retry_seen=1
    break
  fi
  [[ ! -s $err ]] || fail "retried submit: unexpected stderr '$(cat "$err")'"
done
[[ $retry_seen -eq 1 ]] || fail "5 submits with --timeout 0.000001 never went through a retry"
# Two plain submits of one spec are two jobs (each gets its own request_id).
expect 0 '^jobs/[0-9]+$' '^$' -- submit -f "$tmp/spec.yaml" --name twice -o name
expect 0 '^jobs/[0-9]+$' '^$' -- submit -f "$tmp/spec.yaml" --name twice -o name
expect 2 '^$' 'submit: --request-id must not be empty' -- submit -f "$tmp/spec.yaml" --request-id=
expect 2 '^$' 'submit: --retries must be an integer >= 0' -- submit -f "$tmp/spec.yaml" --retries x
expect 3 '^$' 'cannot reach the coordinator at 127.0.0.1:1' -- --coordinator 127.0.0.1:1 list
expect 3 '^$' "cannot read the TLS root certificate" -- --tls-root-cert "$tmp/absent.pem" list

# --- one real CPU worker: a job runs to SUCCEEDED ------------------------------------------------
start_coordinator run --checkpoint-root "$tmp/checkpoints"
export SYCTL_COORDINATOR=$address
"$worker" --coordinator "$address" --token-file "$tmp/worker_token" --device cpu --heartbeat-ms 200 \
  --checkpoint-root "$tmp/checkpoints" \
  >"$tmp/worker.out" 2>"$tmp/worker.err" &
pids+=($!)
cat >"$tmp/tiny.yaml" <<'EOF'
display_name: tiny
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 16, vocab_size: 64,
        ffn_hidden_size: 64, num_experts: 4, moe_router_topk: 2}
training: {micro_batch_size: 2, global_batch_size: 2, train_iters: 30}
data: {mock_data: true}
EOF
# The worker attaches asynchronously; the job waits PENDING until it does.
expect 0 'SUCCEEDED gen 1' 'jobs/1 SUCCEEDED' -- submit -f "$tmp/tiny.yaml" --wait
grep -Eq '^step [0-9]+ loss [0-9.]+ ' <<<"$out" || fail "submit --wait printed no step line: $out"
grep -q 'RUNNING gen 1' <<<"$out" || fail "submit --wait printed no RUNNING event: $out"
echo "   $(grep -c '^step ' <<<"$out") step lines, last: $(grep '^step ' <<<"$out" | tail -1)"
expect 0 'SUCCEEDED gen 1 ALL_RANKS_FINISHED' 'jobs/1 SUCCEEDED' -- watch 1
expect 0 '^State: +SUCCEEDED$' '^$' -- get jobs/1
grep -Eq '^Last step: +step 30 loss' <<<"$out" || fail "get: last step is not 30: $out"
# The attached worker, idle again after the job.
expect 0 'IDLE' '^$' -- workers
grep -Eq '^ID +HOST +GPU +STATE' <<<"$out" || fail "workers: no table header: $out"
grep -Eq ' cpu +IDLE +- ' <<<"$out" || fail "workers: the CPU worker is not listed idle: $out"
expect 0 '"state": "IDLE"' '^$' -- -o json workers
expect 2 '^$' 'workers takes no arguments' -- workers extra
expect 0 '"step"' 'jobs/2 SUCCEEDED' -- submit -f "$tmp/tiny.yaml" --wait -o json
jq -se '[.[] | select(.step)] | length > 0' <<<"$out" >/dev/null ||
  fail "submit --wait -o json: no step object among the lines: $out"
jq -se '.[-1].event.state == "SUCCEEDED"' <<<"$out" >/dev/null ||
  fail "submit --wait -o json: the last line is not the SUCCEEDED event: $out"
echo "   json values: $(jq -s length <<<"$out")"
# On a terminal (script(1) makes one): a progress bar with ETA on stderr instead of step lines.
if command -v script >/dev/null; then
  script -qec "$bin submit -f $tmp/tiny.yaml --wait" /dev/null >"$tmp/tty.out" ||
    fail "submit --wait on a terminal failed: $(cat -A "$tmp/tty.out")"
  grep -aq 'ETA' "$tmp/tty.out" && grep -aq '30/30 100%' "$tmp/tty.out" ||
    fail "no progress bar on a terminal: $(cat -A "$tmp/tty.out")"
  ! grep -aq '^step ' "$tmp/tty.out" || fail "step lines printed on a terminal"
  echo "ok: progress bar on a terminal: $(tr '\r' '\n' <"$tmp/tty.out" | grep -a ETA | tail -1)"
fi

# --- TLS: both ports serve TLS; syctl trusts the self-signed certificate -------------------------
if command -v openssl >/dev/null; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$tmp/key.pem" -out "$tmp/cert.pem" -days 1 \
    -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null ||
    fail "openssl could not make a certificate"
  start_coordinator tls --noworkers --tls-cert "$tmp/cert.pem" --tls-key "$tmp/key.pem"
  export SYCTL_COORDINATOR=$address
  expect 0 '^jobs/1$' '^$' -- --tls-root-cert "$tmp/cert.pem" submit -f "$tmp/tiny.yaml" -o name
  SYCTL_TLS_ROOT_CERT=$tmp/cert.pem expect 0 '^jobs/1$' '^$' -- list -o name
  expect 3 '^$' 'cannot reach the coordinator' -- list
fi
echo "syctl command line OK"
