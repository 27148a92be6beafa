#!/usr/bin/env bash
# Adds a baseline training benchmark to the GPU bundle, for gpu_ab_call.sh's alternating A/B runs
# (`./base_bench_train_benchmark` against `./bench_train_benchmark` in one device call):
# builds //bench:train_benchmark at REV in a git worktree (its own Bazel output base; the
# content-keyed disk cache of .bazelrc turns the actions REV shares with the tree into hits), gives
# it the bundle's search path, and stores it as packed/base_bench_train_benchmark.xz behind a copy
# of the bundle's launcher script. The commit goes into BASE_FROM.
#
#   tools/gpu_bundle.sh && tools/gpu_base_binary.sh REV
#   (WORKTREE=DIR: the worktree to build in; default /tmp/switchyard_base_<REV>, created if absent)
#
# Do not edit sources while a Bazel build runs: an action whose inputs change under it can leave a
# disk-cache entry keyed by the old content that holds the new content's output, and a later build
# of the old content (this script, at REV) then links the wrong object (seen in session 19: an
# undefined reference to a function whose signature the edit had changed). A worktree whose files
# got a trailing comment has new keys and builds clean.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
bundle="$repo/.gpu_bundle"
die() {
  echo "[gpu_base_binary] ERROR: $*" >&2
  exit 1
}
[[ $# -eq 1 ]] || die "usage: tools/gpu_base_binary.sh REV"
rev=$(git rev-parse --short "$1^{commit}") || die "unknown revision '$1'"
launcher="$bundle/bench_train_benchmark"
[[ -f $launcher ]] || die "no $launcher: run tools/gpu_bundle.sh first"
[[ $(head -c 2 "$launcher") == '#!' ]] || die "$launcher is not a launcher script"
wt=${WORKTREE:-/tmp/switchyard_base_$rev}
if [[ ! -d $wt ]]; then
  git worktree add --detach -f "$wt" "$rev" >/dev/null
fi
[[ $(git -C "$wt" rev-parse --short HEAD) == "$rev" ]] || die "$wt is not at $rev"
(cd "$wt" && bazel build --color=no --curses=no //bench:train_benchmark) ||
  die "building //bench:train_benchmark at $rev in $wt failed"
bin="$(cd "$wt" && bazel info bazel-bin 2>/dev/null)/bench/train_benchmark"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$bin" "$tmp/base"
chmod u+w "$tmp/base"
# The bundle's search path (tools/bundle_binaries.sh): lib/ beside the launcher, ../lib from
# .unpacked/, and the GPU host's CUDA directory for cuBLAS.
patchelf --force-rpath --set-rpath "\$ORIGIN/lib:\$ORIGIN/../lib:/usr/local/cuda/lib64" "$tmp/base"
strip "$tmp/base"
mkdir -p "$bundle/packed"
xz -T2 -6 -c "$tmp/base" >"$bundle/packed/base_bench_train_benchmark.xz"
cp "$launcher" "$bundle/base_bench_train_benchmark"  # it runs packed/<its own name>.xz
echo "$rev" >"$bundle/BASE_FROM"
echo "[gpu_base_binary] $bundle/base_bench_train_benchmark is $rev;" \
  "bundle $(du -sm "$bundle" | cut -f1) MiB (carry limit 64)" >&2
