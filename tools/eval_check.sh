#!/usr/bin/env bash
# File: tools/eval_check.sh
#
# Issue 18's validation-loss proof on one machine (the GPU host; CPU works without the last step):
#   1. SPEC (default: quickstart.yaml) trained for EVAL_STEPS (300) steps on DEVICE (cuda:0 when
#      a GPU is visible, else cpu) with training.eval_interval = EVAL_STEPS / 3 and eval_iters 10,
#      a checkpoint at the end and an HF export (--export-hf); the log reports the validation
#      loss at every eval_interval;
#   2. `--eval` on the checkpoint, same device: equals the in-training value of the last step
#      within 1e-5 (relative);
#   3. `--eval` on the HF export, in fp32 on the CPU, writing the scored windows
#      (--eval_tokens_out), and tools/hf_eval_check.py scoring the same windows with transformers
#      in fp32 (GPU when there is one): within 1e-3 (skipped when python3 lacks transformers).
# Usage: tools/eval_check.sh BIN_DIR [SPEC] [OUT_DIR]   (BIN_DIR: bazel-bin or the GPU bundle)
# Exit 0 only when every comparison held.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=$1
spec=$(realpath "${2:-examples/quickstart.yaml}")
out=${3:-/tmp/switchyard-eval-check}
worker=$bin/switchyard-worker
[[ -x $worker ]] || worker=$bin/worker/switchyard-worker
if [[ -z ${SWITCHYARD_DATA_DIR:-} && -f $bin/data/kjv/corpus.json ]]; then
  export SWITCHYARD_DATA_DIR="$(cd "$bin/data" && pwd)"
fi
steps=${EVAL_STEPS:-300}
device=${DEVICE:-$( (nvidia-smi -L 2>/dev/null | grep -q '^GPU') && echo cuda:0 || echo cpu)}
rm -rf "$out"
mkdir -p "$out"
cd "$out"
seq=$(sed -n 's/^  seq_length: *\([0-9]*\).*/\1/p' "$spec")
sed -e "s/^  train_iters: .*/  train_iters: $steps\n  eval_interval: $((steps / 3))\n  eval_iters: 10/" \
  -e "s/^  save_interval: .*/  save_interval: $steps/" -e "s/^  log_interval: .*/  log_interval: 50/" \
  -e "s/^  save: .*/  save: ckpt/" "$spec" >run.yaml
fail=0
echo "== 1. train $steps steps on $device, eval every $((steps / 3)), export HF"
"$worker" --standalone --config run.yaml --device "$device" --export-hf hf 2>&1 | tee train.log |
  grep -E 'validation loss|exported|error' || true
mapfile -t vals < <(sed -n 's/.*| validation loss \([0-9.]*\) .*/\1/p' train.log)
echo "in-training validation losses: ${vals[*]:-none}"
if [[ ${#vals[@]} -ne 3 ]]; then
  echo "FAIL: expected 3 evaluations (steps $((steps / 3)), $((2 * steps / 3)), $steps)"
  fail=1
fi
echo "== 2. --eval on the checkpoint ($device)"
"$worker" --eval --load ckpt --config run.yaml --device "$device" 2>&1 | tee eval_ckpt.log | tail -1
ckpt=$(sed -n 's/^validation loss \([0-9.]*\) .*/\1/p' eval_ckpt.log)
last=${vals[${#vals[@]}-1]:-nan}
if python3 -c "import sys; a, b = float('$ckpt'), float('$last'); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)"; then
  echo "checkpoint --eval $ckpt == in-training $last (1e-5 relative): OK"
else
  echo "FAIL: checkpoint --eval ${ckpt:-none} vs in-training $last"
  fail=1
fi
echo "== 3. --eval on the HF export (cpu, fp32), then transformers on the same windows"
"$worker" --eval --load hf --config run.yaml --device cpu --eval_tokens_out tokens.i32 2>&1 |
  tee eval_hf.log | tail -2
ours=$(sed -n 's/^validation loss \([0-9.]*\) .*/\1/p' eval_hf.log)
if python3 -c 'import transformers' 2>/dev/null; then
  python3 "$here/hf_eval_check.py" --hf hf --tokens tokens.i32 --seq "$seq" --ours "$ours" || fail=1
else
  echo "transformers not importable here: step 3's comparison skipped (run this on the GPU host)"
fi
[[ $fail -eq 0 ]] && echo "eval_check: OK"
exit $fail
