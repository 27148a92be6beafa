#!/usr/bin/env bash
# Command-line contract of switchyard-worker (see worker/main.cc).
set -u
bin="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$bin" --self-check) || fail "--self-check exited $?"
echo "$out"
grep -q '^switchyard-worker 0\.1\.0 ' <<<"$out" || fail "--self-check: no version line"
grep -Eq '^backend: (CUDA, [0-9]+ device\(s\)|CPU only \(.+\))$' <<<"$out" || fail "no backend line"
grep -Eq '^CUDA driver .*, NCCL [0-9]+\.[0-9]+\.[0-9]+$' <<<"$out" || fail "no versions line"
"$bin" --self_check >/dev/null || fail "--self_check spelling rejected"

"$bin" >/dev/null 2>"$TEST_TMPDIR/err"; rc=$?
[[ $rc -eq 2 ]] || fail "no mode: exit $rc, want 2"
grep -q 'usage:' "$TEST_TMPDIR/err" || fail "no mode: usage not on stderr"

"$bin" --self-check extra >/dev/null 2>&1; rc=$?
[[ $rc -eq 2 ]] || fail "positional argument: exit $rc, want 2"
# --standalone: a tiny MoE job on mock data, on the CPU.
cat >"$TEST_TMPDIR/job.yaml" <<'YAML'
model:
  num_layers: 2
  hidden_size: 32
  num_attention_heads: 4
  num_query_groups: 2
  ffn_hidden_size: 48
  seq_length: 16
  vocab_size: 64
  qk_layernorm: true
  num_experts: 4
  moe_router_topk: 2
  moe_ffn_hidden_size: 24
  moe_router_load_balancing_type: aux_loss
  moe_aux_loss_coeff: 0.01
training:
  micro_batch_size: 2
  global_batch_size: 4
  train_iters: 6
  lr: 0.003
data:
  mock_data: true
YAML
sed "s|^training:|training:\n  save: $TEST_TMPDIR/ckpt\n  save_interval: 3|" "$TEST_TMPDIR/job.yaml" >"$TEST_TMPDIR/job2.yaml"
out=$("$bin" --standalone --config "$TEST_TMPDIR/job2.yaml" --device cpu --steps 4) ||
  fail "--standalone exited $?"
echo "$out"
grep -Eq '^step 4/6 \| loss [0-9.]+ \| aux .* \| MFU - \| imbalance' <<<"$out" || fail "no step line"
grep -q "saved checkpoint .*step_3" <<<"$out" || fail "no checkpoint at step 3"
out=$("$bin" --standalone --config "$TEST_TMPDIR/job2.yaml" --device cpu \
  --export-hf "$TEST_TMPDIR/hf") || fail "resumed run exited $?"
echo "$out"
grep -q "resumed from .* at step 4" <<<"$out" || fail "did not resume at step 4"
grep -q "^step 6/6 " <<<"$out" || fail "did not finish"
[[ -f "$TEST_TMPDIR/hf/config.json" && -f "$TEST_TMPDIR/hf/model.safetensors" ]] || fail "no HF export"
out=$("$bin" --standalone --config "$TEST_TMPDIR/job.yaml" --device cpu --steps 1 \
  --init-from-hf "$TEST_TMPDIR/hf") || fail "--init-from-hf exited $?"
grep -q "initialised from" <<<"$out" || fail "no HF init line"

# Validation loss (training.eval_interval) on the default corpus (data.split defaults to
# "969,30,1" for a job that evaluates), then --eval on the saved checkpoint: the same number.
sed -e "/vocab_size/d" -e "/mock_data/d" -e "s|^data:|data: {}|" \
  -e "s|^training:|training:\n  save: $TEST_TMPDIR/eval_ckpt\n  save_interval: 2\n  eval_interval: 2\n  eval_iters: 2|" \
  -e "s|train_iters: 6|train_iters: 4|" "$TEST_TMPDIR/job.yaml" >"$TEST_TMPDIR/eval.yaml"
out=$("$bin" --standalone --config "$TEST_TMPDIR/eval.yaml" --device cpu) ||
  fail "--standalone with eval_interval exited $?"
echo "$out"
grep -q 'split "969,30,1": [0-9]* training documents, [1-9][0-9]* validation documents' <<<"$out" ||
  fail "no default split with evaluation"
val2=$(grep '^step 2/4 ' <<<"$out" | grep -Eo 'validation loss [0-9.]+ \| validation ppl [0-9.]+')
val4=$(grep '^step 4/4 ' <<<"$out" | grep -Eo 'validation loss [0-9.]+ \| validation ppl [0-9.]+')
[[ -n "$val2" && -n "$val4" ]] || fail "no validation loss on steps 2 and 4"
grep '^step 1/4 \|^step 3/4 ' <<<"$out" | grep -q 'validation' && fail "validation off-interval"
out=$("$bin" --eval --load "$TEST_TMPDIR/eval_ckpt" --config "$TEST_TMPDIR/eval.yaml" \
  --device cpu) || fail "--eval exited $?"
echo "$out"
grep -q "loaded .*eval_ckpt at step 4" <<<"$out" || fail "--eval: did not load step 4"
grep -q "^$val4 | 2 global batches" <<<"$out" || fail "--eval: not the in-training $val4"
out=$("$bin" --eval --load "$TEST_TMPDIR/eval_ckpt/step_2" --config "$TEST_TMPDIR/eval.yaml" \
  --device cpu) || fail "--eval step_2 exited $?"
grep -q "^$val2 | " <<<"$out" || fail "--eval step_2: not the in-training $val2: $out"
# Two ranks (DP 2 over Gloo) evaluate the one-process checkpoint: the same loss within 1e-5.
"$bin" --eval --load "$TEST_TMPDIR/eval_ckpt" --rank 1 --world-size 2 \
  --rendezvous "$TEST_TMPDIR/rdzv_eval" --config "$TEST_TMPDIR/eval.yaml" --device cpu \
  >"$TEST_TMPDIR/ev1.out" 2>"$TEST_TMPDIR/ev1.err" &
pid1=$!
out=$("$bin" --eval --load "$TEST_TMPDIR/eval_ckpt" --rank 0 --world-size 2 \
  --rendezvous "$TEST_TMPDIR/rdzv_eval" --config "$TEST_TMPDIR/eval.yaml" --device cpu) ||
  fail "--eval on 2 ranks: rank 0 exited $?"
wait $pid1 || fail "--eval on 2 ranks: rank 1 exited $?: $(cat "$TEST_TMPDIR/ev1.err")"
echo "$out"
got=$(grep -Eo '^validation loss [0-9.]+' <<<"$out" | awk '{print $3}')
want=$(awk '{print $3}' <<<"$val4")
awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(a != "" && d < 1e-5 && d > -1e-5) }' ||
  fail "--eval on 2 ranks: $got, one process $want"
"$bin" --eval --config "$TEST_TMPDIR/eval.yaml" >/dev/null 2>"$TEST_TMPDIR/err"; rc=$?
[[ $rc -eq 2 ]] || fail "--eval without --load: exit $rc, want 2"
"$bin" --eval --load "$TEST_TMPDIR/eval_ckpt" --config "$TEST_TMPDIR/job.yaml" --device cpu \
  >/dev/null 2>"$TEST_TMPDIR/err"; rc=$?
[[ $rc -eq 1 ]] || fail "--eval on mock data: exit $rc, want 1"
grep -q 'data.mock_data' "$TEST_TMPDIR/err" || fail "--eval on mock data: $(cat "$TEST_TMPDIR/err")"

# Bad input: exit 1 and a message naming the field.
sed 's/num_query_groups: 2/num_query_groups: 3/' "$TEST_TMPDIR/job.yaml" >"$TEST_TMPDIR/bad.yaml"
"$bin" --standalone --config "$TEST_TMPDIR/bad.yaml" --device cpu >/dev/null 2>"$TEST_TMPDIR/err"
rc=$?
[[ $rc -eq 1 ]] || fail "bad spec: exit $rc, want 1"
grep -q 'num_query_groups' "$TEST_TMPDIR/err" || fail "bad spec: field not named: $(cat "$TEST_TMPDIR/err")"
"$bin" --standalone >/dev/null 2>&1; rc=$?
[[ $rc -eq 2 ]] || fail "--standalone without --config: exit $rc, want 2"

# A 2-rank job (EP = 2, DP = 2) over Gloo on the CPU, launched by hand as the coordinator will:
# rank 0 logs, both save (asynchronously, --async-save: each rank its own shards) at step 2 and
# at the end; then one standalone process resumes the 2-rank checkpoint (resharded to EP = 1)
# and finishes.
sed -e "s|^training:|training:\n  save: $TEST_TMPDIR/dist_ckpt\n  save_interval: 2|" \
  -e "s|^data:|parallel:\n  expert_model_parallel_size: 2\ndata:|" \
  -e "s|micro_batch_size: 2|micro_batch_size: 1|" "$TEST_TMPDIR/job.yaml" >"$TEST_TMPDIR/dist.yaml"
rdzv="$TEST_TMPDIR/rdzv1"
"$bin" --rank 1 --world-size 2 --rendezvous "$rdzv" --config "$TEST_TMPDIR/dist.yaml" \
  --device cpu --steps 4 --async-save >"$TEST_TMPDIR/r1.out" 2>"$TEST_TMPDIR/r1.err" &
pid1=$!
out=$("$bin" --rank 0 --world-size 2 --rendezvous "$rdzv" --config "$TEST_TMPDIR/dist.yaml" \
  --device cpu --steps 4 --async-save) || fail "rank 0 exited $?"
wait $pid1 || fail "rank 1 exited $?: $(cat "$TEST_TMPDIR/r1.err")"
echo "$out"
[[ ! -s "$TEST_TMPDIR/r1.out" ]] || fail "rank 1 printed a log: $(cat "$TEST_TMPDIR/r1.out")"
grep -Eq '^step 4/6 \| loss [0-9.]+ .* \| imbalance' <<<"$out" || fail "2 ranks: no step 4 line"
grep -q "saved checkpoint .*dist_ckpt/step_4" <<<"$out" || fail "2 ranks: no checkpoint at step 4"
for s in 2 4; do
  for f in manifest.json shard_0.safetensors shard_1.safetensors; do
    [[ -f "$TEST_TMPDIR/dist_ckpt/step_$s/$f" ]] || fail "2 ranks: step_$s has no $f"
  done
done
sed -e "s|expert_model_parallel_size: 2|expert_model_parallel_size: 1|" "$TEST_TMPDIR/dist.yaml" \
  >"$TEST_TMPDIR/dist1.yaml"
out=$("$bin" --standalone --config "$TEST_TMPDIR/dist1.yaml" --device cpu) ||
  fail "resuming the 2-rank checkpoint in one process exited $?"
echo "$out"
grep -q "resumed from .*dist_ckpt at step 4" <<<"$out" || fail "did not resume the 2-rank checkpoint"
grep -q "^step 6/6 " <<<"$out" || fail "resumed 2-rank job did not finish"
# Expert tensor parallelism from the command line: ETP = 2 (EP = 1) on 2 ranks; the spec's size
# reaches the process groups (a mismatch would be rejected naming the field) and the job trains.
sed -e "s|expert_model_parallel_size: 2|expert_tensor_parallel_size: 2|" -e "/save/d" \
  "$TEST_TMPDIR/dist.yaml" >"$TEST_TMPDIR/etp.yaml"
rdzv4="$TEST_TMPDIR/rdzv4"
"$bin" --rank 1 --world-size 2 --rendezvous "$rdzv4" --config "$TEST_TMPDIR/etp.yaml" \
  --device cpu --steps 2 >/dev/null 2>"$TEST_TMPDIR/e1.err" &
pid1=$!
out=$("$bin" --rank 0 --world-size 2 --rendezvous "$rdzv4" --config "$TEST_TMPDIR/etp.yaml" \
  --device cpu --steps 2) || fail "ETP 2: rank 0 exited $?"
wait $pid1 || fail "ETP 2: rank 1 exited $?: $(cat "$TEST_TMPDIR/e1.err")"
echo "$out"
grep -Eq '^step 2/6 \| loss [0-9.]+ ' <<<"$out" || fail "ETP 2: no step 2 line"
# Tensor parallelism from the command line: TP = 2 (with sequence parallelism) on 2 ranks. The
# spec's TP must reach the process groups: built with TP = 1, the trainer would refuse the
# launched layout and both ranks would exit 1.
sed -e "s|expert_model_parallel_size: 2|tensor_model_parallel_size: 2\n  sequence_parallel: true|" \
  -e "/save/d" \
  "$TEST_TMPDIR/dist.yaml" >"$TEST_TMPDIR/tp.yaml"
rdzv5="$TEST_TMPDIR/rdzv5"
"$bin" --rank 1 --world-size 2 --rendezvous "$rdzv5" --config "$TEST_TMPDIR/tp.yaml" \
  --device cpu --steps 2 >/dev/null 2>"$TEST_TMPDIR/t1.err" &
pid1=$!
out=$("$bin" --rank 0 --world-size 2 --rendezvous "$rdzv5" --config "$TEST_TMPDIR/tp.yaml" \
  --device cpu --steps 2) || fail "TP 2: rank 0 exited $?"
wait $pid1 || fail "TP 2: rank 1 exited $?: $(cat "$TEST_TMPDIR/t1.err")"
echo "$out"
grep -Eq '^step 2/6 \| loss [0-9.]+ ' <<<"$out" || fail "TP 2: no step 2 line"
# A rank whose peer never comes: the rendezvous times out with an error, exit 1, no hang.
"$bin" --rank 0 --world-size 2 --rendezvous "$TEST_TMPDIR/rdzv2" --config "$TEST_TMPDIR/dist.yaml" \
  --device cpu --comm-timeout 2 >/dev/null 2>"$TEST_TMPDIR/err"; rc=$?
[[ $rc -eq 1 ]] || fail "missing peer: exit $rc, want 1"
cat "$TEST_TMPDIR/err"
grep -qi 'deadline\|timed out\|timeout' "$TEST_TMPDIR/err" || fail "missing peer: no timeout error"
# A killed peer: rank 1 is SIGKILLed after rank 0 logged step 3; rank 0 must exit 1 within a
# bounded time (not the 60 s communicator timeout) with an error naming rank 1.
sed -e "s|train_iters: 6|train_iters: 100000|" -e "/save/d" "$TEST_TMPDIR/dist.yaml" \
  >"$TEST_TMPDIR/long.yaml"
rdzv3="$TEST_TMPDIR/rdzv3"
"$bin" --rank 1 --world-size 2 --rendezvous "$rdzv3" --config "$TEST_TMPDIR/long.yaml" \
  --device cpu >/dev/null 2>&1 &
pid1=$!
"$bin" --rank 0 --world-size 2 --rendezvous "$rdzv3" --config "$TEST_TMPDIR/long.yaml" \
  --device cpu >"$TEST_TMPDIR/k0.out" 2>"$TEST_TMPDIR/k0.err" &
pid0=$!
for _ in $(seq 600); do
  grep -q "^step 3/" "$TEST_TMPDIR/k0.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "^step 3/" "$TEST_TMPDIR/k0.out" || fail "killed peer: rank 0 never reached step 3"
kill -9 $pid1
t0=$(date +%s.%N)
wait $pid0; rc=$?
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
echo "killed peer: rank 0 exited $rc after ${elapsed} s: $(cat "$TEST_TMPDIR/k0.err")"
[[ $rc -eq 1 ]] || fail "killed peer: rank 0 exit $rc, want 1"
grep -q "lost rank(s): 1" "$TEST_TMPDIR/k0.err" || fail "killed peer: the error does not name rank 1"
awk -v e="$elapsed" 'BEGIN { exit !(e < 20) }' || fail "killed peer: rank 0 took ${elapsed} s"
"$bin" --rank 2 --world-size 2 --rendezvous "$rdzv" --config "$TEST_TMPDIR/dist.yaml" \
  >/dev/null 2>&1; rc=$?
[[ $rc -eq 2 ]] || fail "--rank outside the world: exit $rc, want 2"
echo "switchyard-worker command line OK"
