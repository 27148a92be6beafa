#!/usr/bin/env bash
# The main job: sets the machine up if needed (packages and the default corpus), builds the
# binaries, prints the compute backend, then trains the example MoE model
# (examples/quickstart.yaml) on the default corpus in one worker process, on the GPU when there is
# one and on the CPU otherwise, and exports it as a HuggingFace Qwen3-MoE checkpoint.
# (A later issue replaces the single process with a coordinator and workers: `syctl quickstart`.)
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
bazel build --color=no --curses=no //cli:syctl //worker:switchyard-worker
bin=$(bazel info --color=no bazel-bin 2>/dev/null)
"$bin/cli/syctl" version
"$bin/worker/switchyard-worker" --self-check
rm -rf /tmp/switchyard-quickstart
"$bin/worker/switchyard-worker" --standalone --config examples/quickstart.yaml \
  --export-hf /tmp/switchyard-quickstart/hf
