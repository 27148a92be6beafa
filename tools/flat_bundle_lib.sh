#!/usr/bin/env bash
# Sourced by the tools/*_test.sh scripts that run a bundle script (quickstart_cluster.sh,
# planner_proof.sh) the way the GPU bundle ships it. Needs fail() defined by the caller.
#
# switchyard_data_dir: where tools/setup.sh put the default corpus (SWITCHYARD_DATA_DIR, else
# ~/.cache/switchyard/data of the user, whatever HOME says).
switchyard_data_dir() {
  local home
  home=$(getent passwd "$(id -un)" | cut -d: -f6)
  echo "${SWITCHYARD_DATA_DIR:-$home/.cache/switchyard/data}"
}

# flat_bundle DIR COORDINATOR WORKER SYCTL SCRIPT EXAMPLE: a fresh flat folder DIR holding the
# three binaries (symlinks), SCRIPT and cluster_lib.sh beside it (copies), EXAMPLE as
# quickstart.yaml and data/kjv, the default corpus (switchyard_data_dir), so that
# `cd DIR && ./SCRIPT . quickstart.yaml ...` runs as on the GPU host.
flat_bundle() {
  local dir=$1 coordinator=$2 worker=$3 syctl=$4 script=$5 example=$6
  local data
  data=$(switchyard_data_dir)
  [[ -f $data/kjv/corpus.json ]] || fail "no default corpus in $data (run tools/setup.sh)"
  rm -rf "$dir"
  mkdir -p "$dir/data"
  ln -s "$coordinator" "$dir/switchyard-coordinator"
  ln -s "$worker" "$dir/switchyard-worker"
  ln -s "$syctl" "$dir/syctl"
  cp "$script" "$dir/$(basename "$script")"
  cp "$(dirname "$script")/cluster_lib.sh" "$dir/cluster_lib.sh"
  cp "$example" "$dir/quickstart.yaml"
  ln -s "$data/kjv" "$dir/data/kjv"
}
