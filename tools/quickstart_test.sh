#!/usr/bin/env bash
# README.md's quick-start commands that can run inside a Bazel test, as written, with the real
# binaries from runfiles (tools/readme_check.py lists them; .ci/run runs tools/quickstart.sh itself
# after the tests, since its setup and bazel build cannot run inside a test):
#   1. the cluster quickstart as the GPU bundle ships it: a flat folder holding the three binaries,
#      quickstart_cluster.sh, quickstart.yaml and data/kjv (the default corpus), then
#      `env -i PATH=/usr/bin:/bin HOME=/tmp ./quickstart_cluster.sh . quickstart.yaml` (plus
#      QUICKSTART_DIR, so that the run directory is this test's). The spec carries no vocab_size:
#      the coordinator fills it from the corpus; the job must SUCCEED (syctl exits 0).
#   2. `switchyard-worker --standalone --config examples/quickstart.yaml`: 100 steps, checkpoints in
#      ./quickstart-checkpoints; then the same command with `--export-hf DIR` (the README's "add
#      --export-hf DIR"), which resumes from step 100 and writes a HuggingFace Qwen3-MoE directory.
set -u
coordinator=$(realpath "$1")
worker=$(realpath "$2")
syctl=$(realpath "$3")
cluster_script=$(realpath "$4")
example=$(realpath "$5")
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# 1. The bundle's cluster quickstart.
source "$(dirname "$cluster_script")/flat_bundle_lib.sh"
bundle="$tmp/bundle"
rm -rf "$tmp/quickstart"
flat_bundle "$bundle" "$coordinator" "$worker" "$syctl" "$cluster_script" "$example"
data=$(switchyard_data_dir)
grep -q 'vocab_size' "$bundle/quickstart.yaml" &&
  fail "examples/quickstart.yaml names vocab_size: this test is meant to show the coordinator fills it"
start=$SECONDS
(cd "$bundle" && env -i PATH=/usr/bin:/bin HOME=/tmp QUICKSTART_DIR="$tmp/quickstart" \
  ./quickstart_cluster.sh . quickstart.yaml) >"$tmp/cluster.out" 2>&1
rc=$?
tail -4 "$tmp/cluster.out" | sed 's/^/    /'
if [[ $rc -ne 0 ]]; then
  cat "$tmp/cluster.out" >&2
  for f in "$tmp"/quickstart/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done
  fail "env -i ./quickstart_cluster.sh . quickstart.yaml exited $rc"
fi
grep -q 'SUCCEEDED' "$tmp/cluster.out" || fail "the cluster quickstart did not report SUCCEEDED"
grep -q 'vocab_size' "$tmp/quickstart/job.yaml" &&
  fail "quickstart_cluster.sh still writes vocab_size into the job spec"
grep -q 'default corpus "kjv"' "$tmp/quickstart/coordinator.log" ||
  fail "the coordinator did not find the bundle's default corpus"
echo "ok: env -i ./quickstart_cluster.sh . quickstart.yaml SUCCEEDED in $((SECONDS - start)) s" \
  "(no vocab_size in the spec: the coordinator's default corpus filled it)"

# 2. One process without a coordinator, in a fresh directory holding examples/quickstart.yaml.
work="$tmp/standalone"
rm -rf "$work"
mkdir -p "$work/examples"
cp "$example" "$work/examples/quickstart.yaml"
cd "$work" || fail "cd $work"
export SWITCHYARD_DATA_DIR="$data"
start=$SECONDS
switchyard-worker() { "$worker" "$@"; }
switchyard-worker --standalone --config examples/quickstart.yaml >"$tmp/standalone.out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || { tail -20 "$tmp/standalone.out" >&2; fail "switchyard-worker --standalone exited $rc"; }
grep -E '^step (10|100)/' "$tmp/standalone.out" | sed 's/^/    /'
for step in 50 100; do
  # The sharded format (worker/checkpoint/README.md): one process writes shard_0 and the
  # manifest, which is written last (a committed step has both).
  for f in shard_0.safetensors manifest.json; do
    [[ -f quickstart-checkpoints/step_$step/$f ]] ||
      fail "no ./quickstart-checkpoints/step_$step/$f: $(ls -R quickstart-checkpoints)"
  done
done
echo "ok: switchyard-worker --standalone --config examples/quickstart.yaml in" \
  "$((SECONDS - start)) s; checkpoints $(cd quickstart-checkpoints && echo step_*)"
switchyard-worker --standalone --config examples/quickstart.yaml --export-hf hf-export \
  >"$tmp/export.out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || { tail -20 "$tmp/export.out" >&2; fail "... --export-hf hf-export exited $rc"; }
for f in config.json model.safetensors; do
  [[ -s hf-export/$f ]] || fail "--export-hf wrote no hf-export/$f: $(ls hf-export 2>&1)"
done
grep -q '"Qwen3MoeForCausalLM"' hf-export/config.json ||
  fail "hf-export/config.json is not a Qwen3-MoE config: $(head -c 300 hf-export/config.json)"
tail -2 "$tmp/export.out" | sed 's/^/    /'
echo "ok: ... --export-hf hf-export wrote $(cd hf-export && echo *)"
echo "PASS: the README's cluster (bundle form) and standalone quick starts"
