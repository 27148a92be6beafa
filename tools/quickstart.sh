#!/usr/bin/env bash
# The main job: sets the machine up if needed, builds the binaries and runs them.
# Today: `syctl version` and `switchyard-worker --self-check` (which GPUs, or CPU only). Later
# issues turn this into the quickstart training job (coordinator + workers + an example MoE job).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
bazel build --color=no --curses=no //cli:syctl //worker:switchyard-worker
bin=$(bazel info --color=no bazel-bin 2>/dev/null)
"$bin/cli/syctl" version
"$bin/worker/switchyard-worker" --self-check
