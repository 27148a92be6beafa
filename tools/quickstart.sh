#!/usr/bin/env bash
# The main job: sets the machine up if needed (packages and the default corpus), builds the
# binaries, prints the compute backend, then runs the cluster quickstart
# (tools/quickstart_cluster.sh): a switchyard-coordinator with its SQLite store, one
# switchyard-worker agent per GPU (two CPU workers when there is no GPU), the example MoE job
# (examples/quickstart.yaml, expert-parallel over the workers) submitted with syctl and followed
# until it SUCCEEDS (exit 0). One process without a coordinator:
# `switchyard-worker --standalone --config examples/quickstart.yaml`.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
bazel build --color=no --curses=no //cli:syctl //worker:switchyard-worker \
  //coordinator:switchyard-coordinator
bin=$(bazel info --color=no bazel-bin 2>/dev/null)
"$bin/cli/syctl" version
"$bin/worker/switchyard-worker" --self-check
tools/quickstart_cluster.sh "$bin" examples/quickstart.yaml
