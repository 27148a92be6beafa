#!/usr/bin/env bash
# Builds the GPU bundle: a self-contained folder (.gpu_bundle/) to copy to a GPU host and run
# with its run_gpu_tests.sh. It holds
#   - every test tagged `gpu`, named by target (//kernels/gemm:gemm_gpu_test ->
#     kernels_gemm_gemm_gpu_test), every cc_binary under //bench/... (bench_<pkg>_<name>),
#     switchyard-worker, switchyard-coordinator and syctl, each with an $ORIGIN-relative RPATH to lib/;
#   - lib/: the shared libraries those need that the GPU host lacks (gRPC, Protobuf, Abseil, ...),
#     copied as real files under their soname, stripped;
#   - torch_moe_baseline.py (the PyTorch MoE-layer reference, from /work/shared/bench),
#     torch_train_baseline.py (the PyTorch training-step reference, from bench/),
#     run_gpu_tests.sh, run_gpu_bench.sh, gpu_ab_call.sh (one device call's tests and A/B timings
#     within a budget, results in one summary file), quickstart_cluster.sh (+ quickstart.yaml and
#     cluster_lib.sh: the cluster quickstart, `./quickstart_cluster.sh . quickstart.yaml`),
#     hung_worker_demo.sh (`./hung_worker_demo.sh . quickstart.yaml`: a worker SIGSTOPped inside the
#     EP dispatch, the survivor fails within the timeout, the job restarts from its checkpoint),
#     preempt_demo.sh (`./preempt_demo.sh . quickstart.yaml`: preemption at a checkpoint on two
#     workers), eval_check.sh + hf_eval_check.py (`./eval_check.sh . quickstart.yaml`: validation
#     loss in training, --eval on the checkpoint and on the HF export vs transformers),
#     planner_proof.sh (`./planner_proof.sh . SPEC WORLD ITERS MAPPING...`: runs that calibrate
#     the searched plan, issue 14) and MANIFEST.
# The GPU host (Ubuntu 24.04, glibc 2.39) provides glibc, libstdc++, libgcc_s, the NVIDIA driver,
# the CUDA 13.0 runtime and cuBLAS (/usr/local/cuda/lib64) and NCCL 2.28 (/usr/lib/x86_64-linux-gnu);
# those are never bundled. tools/bundle_binaries.sh does the library half: copies the other
# libraries into lib/, gives every binary an $ORIGIN-relative RPATH (each starts without
# LD_LIBRARY_PATH or a wrapper), checks with ldd in an empty environment that every other
# dependency resolves inside the bundle, and stores binaries over 1 MiB xz-compressed under
# packed/ behind same-named launcher scripts. This script fails if the bundle exceeds 60 MiB.
#
# Usage: tools/gpu_bundle.sh            (BAZEL_OUTPUT_BASE=<dir> to use a private output base)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
bundle="$repo/.gpu_bundle"
max_mib=60

log() { echo "[gpu_bundle] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

startup=()
if [[ -n ${BAZEL_OUTPUT_BASE:-} ]]; then startup=(--output_base="$BAZEL_OUTPUT_BASE"); fi
bz() {
  local cmd=$1
  shift
  bazel "${startup[@]}" "$cmd" --color=no --curses=no "$@"
}
query_log=$(mktemp)
trap 'rm -f "$query_log"' EXIT
query() {
  local out
  out=$(bz query "$1" 2>"$query_log") || {
    cat "$query_log" >&2
    die "bazel query '$1' failed"
  }
  echo "$out"
}

# --- Targets -------------------------------------------------------------------------------------
log "querying targets"
# The universe is every top-level folder with a BUILD file rather than //..., which would also
# descend into the bazel-<dir> convenience symlink and fail to load the external repositories
# there. (Command substitution, not <(...), so that a failing query stops the script.)
universe="//:all"
for d in */; do
  d=${d%/}
  [[ $d == bazel-* ]] && continue
  if [[ -n $(find "$d" \( -name BUILD -o -name BUILD.bazel \) -print -quit) ]]; then
    universe+=" + //$d/..."
  fi
done
txt=$(query "attr(tags, \"\\bgpu\\b\", tests($universe))" | sort)
gpu_tests=()
if [[ -n $txt ]]; then mapfile -t gpu_tests <<<"$txt"; fi
bench=()
if [[ $universe == *//bench/...* ]]; then
  txt=$(query 'kind("cc_binary rule", //bench/...)' | sort)
  if [[ -n $txt ]]; then mapfile -t bench <<<"$txt"; fi
fi
tools=(//worker:switchyard-worker //cli:syctl //coordinator:switchyard-coordinator)
# GPU_BUNDLE_ONLY="sub1 sub2 ...": only the gpu tests and bench binaries whose target contains
# one of the substrings (the three binaries always), for a bundle that fits one transfer when
# the whole set does not (e.g. GPU_BUNDLE_ONLY="worker/ bench:train" after a worker-only change).
if [[ -n ${GPU_BUNDLE_ONLY:-} ]]; then
  keep() {
    local t=$1 s
    for s in $GPU_BUNDLE_ONLY; do [[ $t == *"$s"* ]] && return 0; done
    return 1
  }
  picked=()
  for t in "${gpu_tests[@]}"; do keep "$t" && picked+=("$t"); done
  gpu_tests=("${picked[@]}")
  picked=()
  for t in "${bench[@]}"; do keep "$t" && picked+=("$t"); done
  bench=("${picked[@]}")
  log "GPU_BUNDLE_ONLY=$GPU_BUNDLE_ONLY"
fi
targets=("${gpu_tests[@]}" "${bench[@]}" "${tools[@]}")
log "${#gpu_tests[@]} gpu test(s), ${#bench[@]} bench binar(ies), ${#tools[@]} tools"

log "building"
bz build "${targets[@]}" >&2
bin_dir=$(bz info bazel-bin 2>/dev/null)

# --- Binaries ------------------------------------------------------------------------------------
rm -rf "$bundle"
mkdir -p "$bundle/lib"
# //a/b:c -> a_b_c ; the three binaries keep their own names.
bundle_name() {
  case $1 in
    //worker:switchyard-worker) echo switchyard-worker ;;
    //cli:syctl) echo syctl ;;
    //coordinator:switchyard-coordinator) echo switchyard-coordinator ;;
    *)
      local pkg=${1#//}
      pkg=${pkg%%:*}
      echo "${pkg//\//_}_${1##*:}"
      ;;
  esac
}
manifest_targets=()
for t in "${targets[@]}"; do
  pkg=${t#//}
  pkg=${pkg%%:*}
  src="$bin_dir/$pkg/${t##*:}"
  [[ -f $src ]] || die "no output for $t at $src"
  name=$(bundle_name "$t")
  [[ -e $bundle/$name ]] && die "two targets map to bundle name $name"
  cp "$src" "$bundle/$name"
  chmod u+w,a+rx "$bundle/$name"
  manifest_targets+=("$name  <- $t")
done

# --- Shared libraries, RPATH, check, packing (tools/bundle_binaries.sh) ----------------------
tools/bundle_binaries.sh "$bundle"
nlibs=$(wc -l <"$bundle/LIBRARIES")

# --- Scripts and reference -----------------------------------------------------------------------
baseline=""
for p in /work/shared/bench/torch_moe_baseline.py "$repo/../shared/bench/torch_moe_baseline.py"; do
  if [[ -f $p ]]; then
    baseline=$p
    break
  fi
done
if [[ -n $baseline ]]; then
  cp "$baseline" "$bundle/torch_moe_baseline.py"
  chmod 644 "$bundle/torch_moe_baseline.py"
else
  log "WARNING: torch_moe_baseline.py not found (/work/shared/bench or ../shared/bench)"
fi
cp bench/torch_train_baseline.py "$bundle/torch_train_baseline.py"
chmod 644 "$bundle/torch_train_baseline.py"
cp bench/torch_attention_baseline.py "$bundle/torch_attention_baseline.py"
chmod 644 "$bundle/torch_attention_baseline.py"
# The default corpus (tools/prepare_corpus.sh) for the trainer's GPU test; the extracted JSONL is
# left out (only the dataset, tokenizer and manifest are read).
corpus_dir="${SWITCHYARD_DATA_DIR:-$HOME/.cache/switchyard/data}/kjv"
if [[ -f $corpus_dir/corpus.json ]]; then
  mkdir -p "$bundle/data/kjv"
  cp "$corpus_dir"/corpus.json "$corpus_dir"/*.bin "$corpus_dir"/*.idx "$corpus_dir"/tokenizer.json \
    "$bundle/data/kjv/"
else
  log "WARNING: no corpus at $corpus_dir (run tools/prepare_corpus.sh); the trainer GPU test will fail"
fi
cp tools/run_gpu_tests.sh "$bundle/run_gpu_tests.sh"
cp tools/run_gpu_bench.sh "$bundle/run_gpu_bench.sh"
cp tools/gpu_ab_call.sh "$bundle/gpu_ab_call.sh"
cp tools/ncu_table.py "$bundle/ncu_table.py"
cp tools/quickstart_cluster.sh tools/cluster_lib.sh tools/preempt_demo.sh tools/hung_worker_demo.sh tools/eval_check.sh \
  tools/hf_eval_check.py tools/planner_proof.sh "$bundle/"
cp examples/quickstart.yaml "$bundle/quickstart.yaml"
chmod 755 "$bundle/run_gpu_tests.sh" "$bundle/run_gpu_bench.sh" "$bundle/gpu_ab_call.sh" \
  "$bundle/quickstart_cluster.sh" \
  "$bundle/preempt_demo.sh" "$bundle/hung_worker_demo.sh" "$bundle/eval_check.sh" "$bundle/planner_proof.sh"

{
  echo "Switchyard GPU bundle"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (+ local changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "run: ./run_gpu_tests.sh [name-substring...]; ./run_gpu_bench.sh [moe,attention,train]"
  echo "binaries over 1 MiB are stored as packed/<name>.xz; <name> is a launcher that unpacks and runs it"
  echo "binaries:"
  printf '  %s\n' "${manifest_targets[@]}"
  echo "lib/:"
  sed 's/^/  /' "$bundle/LIBRARIES"
} >"$bundle/MANIFEST"
rm "$bundle/LIBRARIES"

bytes=$(du -sb "$bundle" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "gpu bundle: $bundle, ${#targets[@]} binaries, $nlibs libraries, $mib MiB (limit $max_mib MiB)"
if ((bytes > max_mib * 1048576)); then
  die "bundle is $mib MiB, over the $max_mib MiB limit: select what the change needs with GPU_BUNDLE_ONLY=\"substring ...\" (e.g. \"worker/ bench:train\")"
fi
