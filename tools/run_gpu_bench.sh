#!/usr/bin/env bash
# Runs inside the GPU bundle: each PyTorch reference and the matching Switchyard benchmark in the
# same command on the same GPU, then Switchyard's table with the ratio.
#   run_gpu_bench.sh [sections] [moe configs]
#     sections: comma-separated from moe,attention,train,ep (default: moe,attention,train;
#               ep needs >= 2 GPUs)
#     moe configs: for the MoE-layer section (default: all three BASELINES.md configs)
#   run_gpu_bench.sh <moe configs>   (the old form: a first argument that is not a list of
#                                     sections runs only the MoE-layer section on those configs)
# Environment: OUT (where the PyTorch JSON files go, default /tmp); TRAIN_ARGS (extra flags for
# both training benchmarks, e.g. "--model small" or "--steps 10"; default none); SY_TRAIN_ARGS
# (extra flags for Switchyard's only, e.g. "--breakdown").
#   moe:       torch_moe_baseline.py --json torch_moe.json, then
#              bench_moe_layer_benchmark --torch_json torch_moe.json
#   attention: torch_attention_baseline.py (SDPA on its cuDNN and FlashAttention-2 backends), then
#              bench_attention_benchmark (native, cuDNN deterministic, cuDNN default)
#   train:     torch_train_baseline.py --json torch_train.json, then
#              bench_train_benchmark --torch_json torch_train.json (its last line: RESULT_JSON {...})
#   ep:        with N = min(visible GPUs, 4) >= 2 (EP_SIZES overrides, e.g. "2 4"): the MoE layer
#              at EP = 1 and EP = N on qwen3_30b_a3b and dsv3_layer (per-GPU TFLOP/s, tokens per
#              GPU as BASELINES.md), then bench_ep_dispatch_benchmark --ep N (dispatch + combine
#              bandwidth next to a plain NCCL all-to-all of the same bytes), then
#              bench_train_benchmark --world N --ep N (DP x EP training of the benchmark model).
# Exit status: non-zero when a Switchyard benchmark failed (a failed PyTorch reference is reported
# but does not fail the run).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# cuDNN (attention's cuDNN backend, loaded at run time): the nvidia-cudnn-cu13 wheel's folder
# first when python3 has it (one consistent cuDNN 9; the host's own may be older), else whatever
# libcudnn.so.9 the search path finds.
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${cudnn_lib:+$cudnn_lib:}$here/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
sections=${1:-moe,attention,train}
configs=${2:-mixtral8x7b,qwen3_30b_a3b,dsv3_layer}
if [[ ! $sections =~ ^(moe|attention|train|ep)(,(moe|attention|train|ep))*$ ]]; then
  configs=$sections
  sections=moe
fi
out=${OUT:-/tmp}
read -r -a train_args <<<"${TRAIN_ARGS:-}"
read -r -a sy_train_args <<<"${SY_TRAIN_ARGS:-}"
status=0
want() { [[ ,$sections, == *",$1,"* ]]; }

if want moe; then
  echo "== PyTorch reference (torch_moe_baseline.py)"
  python3 "$here/torch_moe_baseline.py" --configs "$configs" --json "$out/torch_moe.json" ||
    echo "torch baseline failed"
  echo "== Switchyard moe_layer_benchmark"
  "$here/bench_moe_layer_benchmark" --configs "$configs" --torch_json "$out/torch_moe.json" ||
    status=1
fi

if want attention; then
  echo "== PyTorch reference (torch_attention_baseline.py)"
  python3 "$here/torch_attention_baseline.py" || echo "torch attention baseline failed"
  echo "== Switchyard attention_benchmark"
  "$here/bench_attention_benchmark" || status=1
fi

if want train; then
  echo "== PyTorch reference (torch_train_baseline.py ${train_args[*]})"
  rm -f "$out/torch_train.json"
  python3 "$here/torch_train_baseline.py" "${train_args[@]}" --json "$out/torch_train.json" ||
    echo "torch train baseline failed (see its JSON 'error')"
  echo "== Switchyard train_benchmark ${train_args[*]} ${sy_train_args[*]}"
  "$here/bench_train_benchmark" "${train_args[@]}" "${sy_train_args[@]}" --torch_json "$out/torch_train.json" || status=1
fi
if want ep; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  sizes=${EP_SIZES:-$((gpus > 4 ? 4 : gpus))}
  ep_configs=qwen3_30b_a3b,dsv3_layer
  echo "== Switchyard moe_layer_benchmark, EP = 1 ($ep_configs)"
  "$here/bench_moe_layer_benchmark" --configs "$ep_configs" || status=1
  for n in $sizes; do
    if [[ $n -lt 2 || $n -gt $gpus ]]; then
      echo "ep: EP = $n needs $n GPUs, $gpus visible: skipped"
      continue
    fi
    echo "== Switchyard moe_layer_benchmark --ep $n ($ep_configs)"
    "$here/bench_moe_layer_benchmark" --ep "$n" --configs "$ep_configs" || status=1
    echo "== Switchyard ep_dispatch_benchmark --ep $n"
    "$here/bench_ep_dispatch_benchmark" --ep "$n" || status=1
    echo "== Switchyard train_benchmark --world $n --ep $n ${train_args[*]}"
    "$here/bench_train_benchmark" --world "$n" --ep "$n" "${train_args[@]}" || status=1
  done
fi
exit $status
