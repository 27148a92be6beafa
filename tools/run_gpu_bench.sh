#!/usr/bin/env bash
# Runs inside the GPU bundle: the PyTorch reference layer and Switchyard's MoE-layer benchmark in
# the same command on the same GPU, then prints Switchyard's table with the ratio.
#   run_gpu_bench.sh [configs]     (default: all three BASELINES.md configs)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
configs=${1:-mixtral8x7b,qwen3_30b_a3b,dsv3_layer}
out=${OUT:-/tmp}
echo "== PyTorch reference (torch_moe_baseline.py)"
python3 "$here/torch_moe_baseline.py" --configs "$configs" --json "$out/torch_moe.json" || echo "torch baseline failed"
echo "== Switchyard moe_layer_benchmark"
"$here/bench_moe_layer_benchmark" --configs "$configs" --torch_json "$out/torch_moe.json"
