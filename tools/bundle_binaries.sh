#!/usr/bin/env bash
# Makes a folder of copied binaries self-contained: the second half of tools/gpu_bundle.sh, a
# script of its own so that //tools:bundle_test runs exactly this code on the CPU binaries.
#
#   tools/bundle_binaries.sh BUNDLE_DIR
#
# BUNDLE_DIR holds the executables (ELF files at its top level). This script strips them, then
#   1. copies into BUNDLE_DIR/lib/ every shared library they need that the GPU host does not
#      provide (host_lib_re below: glibc, libstdc++, libgcc_s, the NVIDIA driver, the CUDA
#      runtime, cuBLAS, NCCL), as real files under their soname, stripped, and lists them in
#      BUNDLE_DIR/LIBRARIES ("soname  <- source path");
#   2. gives every executable an $ORIGIN-relative search path with patchelf, so that it starts
#      without LD_LIBRARY_PATH: "$ORIGIN/lib:$ORIGIN/../lib:/usr/local/cuda/lib64" (../lib for a
#      packed binary unpacked into .unpacked/, the CUDA directory for cuBLAS, which the GPU host
#      keeps outside the loader's default path). It is a DT_RPATH (--force-rpath), not a
#      DT_RUNPATH: the loader uses an executable's DT_RPATH for every library loaded on its
#      behalf, the dependencies of the bundled libraries included, whereas a DT_RUNPATH serves
#      only the executable's direct dependencies and would need patchelf on every bundled library
#      too (measured: that grows lib/ by several MiB, libgrpc.so.29 alone from 7.09 to 7.88 MB,
#      which put the GPU bundle over its 60 MiB limit). Neither the bundled libraries nor the
#      host's have a DT_RUNPATH of their own, which would disable the executable's DT_RPATH for
#      their dependencies; step 3 would catch it. A DT_RPATH is searched before LD_LIBRARY_PATH:
#      the bundle's libraries win, which is the point of a bundle;
#   3. checks with ldd, in an empty environment, that every dependency (ldd lists them
#      transitively) of every executable that the host does not provide resolves inside
#      BUNDLE_DIR/lib (exits 1 naming the binary and library if not);
#   4. stores every binary over 1 MiB xz-compressed under packed/ behind a same-named launcher
#      that unpacks it on first use (see Packing).
# Needs patchelf, ldd, strip and xz (tools/setup.sh installs patchelf).
set -euo pipefail
bundle=$(cd "${1:?usage: bundle_binaries.sh BUNDLE_DIR}" && pwd)

# Libraries the GPU host provides (matched on the soname's stem, before ".so").
host_lib_re='^(libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|ld-linux(-x86-64)?|libstdc\+\+|libgcc_s|libcuda|libnvidia-.*|libcudart|libcublas|libcublasLt|libnccl)$'
exe_rpath='$ORIGIN/lib:$ORIGIN/../lib:/usr/local/cuda/lib64'

log() { echo "[bundle_binaries] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
command -v patchelf >/dev/null || die "patchelf not found (tools/setup.sh installs it)"
is_elf() { [[ -f $1 && $(head -c 4 "$1" | od -An -c | tr -d ' ') == 177ELF ]]; }

binaries=()
for f in "$bundle"/*; do
  if is_elf "$f"; then binaries+=("$f"); fi
done
[[ ${#binaries[@]} -gt 0 ]] || die "no ELF binaries in $bundle"
for f in "${binaries[@]}"; do strip "$f"; done
mkdir -p "$bundle/lib"

# --- Shared libraries ----------------------------------------------------------------------------
declare -A lib_src=()
missing=()
for f in "${binaries[@]}"; do
  # ldd lists transitive dependencies: "soname => /path (0x...)" or "soname => not found".
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    stem=${soname%%.so*}
    [[ $stem =~ $host_lib_re ]] && continue
    if [[ $path == not ]]; then
      missing+=("$soname (needed by $(basename "$f"))")
      continue
    fi
    real=$(readlink -f "$path")
    if [[ -n ${lib_src[$soname]:-} && ${lib_src[$soname]} != "$real" ]]; then
      die "$soname resolves to both ${lib_src[$soname]} and $real"
    fi
    lib_src[$soname]=$real
  done < <(ldd "$f")
done
[[ ${#missing[@]} -eq 0 ]] || die "unresolved libraries on this machine: ${missing[*]}"
for soname in "${!lib_src[@]}"; do
  cp "${lib_src[$soname]}" "$bundle/lib/$soname"
  chmod u+w "$bundle/lib/$soname"
  strip --strip-unneeded "$bundle/lib/$soname"
done
for f in "${binaries[@]}"; do patchelf --force-rpath --set-rpath "$exe_rpath" "$f"; done
for soname in $(printf '%s\n' "${!lib_src[@]}" | sort); do
  echo "$soname  <- ${lib_src[$soname]}"
done >"$bundle/LIBRARIES"
log "${#lib_src[@]} shared libraries bundled; RPATH set on ${#binaries[@]} binaries"

# --- Check: only host-provided libraries resolve outside the bundle, with no environment --------
bad=()
for f in "${binaries[@]}"; do
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    stem=${soname%%.so*}
    if [[ $path == not ]]; then
      bad+=("$(basename "$f"): $soname not found")
    elif [[ ! $stem =~ $host_lib_re && $(readlink -m "$path") != "$bundle/lib/"* ]]; then
      bad+=("$(basename "$f"): $soname => $path")
    fi
  done < <(env -i /usr/bin/ldd "$f")
done
if [[ ${#bad[@]} -gt 0 ]]; then
  printf '  %s\n' "${bad[@]}" >&2
  die "the dependencies above do not resolve inside the bundle and are not provided by the GPU host"
fi

# --- Packing: binaries over 1 MiB are stored xz-compressed -------------------------------------
# Their fatbins (cubins of every kernel, not strippable) make the plain GPU bundle ~100 MiB. Each
# packed binary <name> becomes packed/<name>.xz plus a small shell launcher <name> that unpacks it
# once (xz, or python3's lzma when xz is missing) into .unpacked/ next to it (or, when the bundle
# is read-only, into $TMPDIR) and execs it with the same arguments, so scripts call every binary
# exactly as before. The unpacked binary finds lib/ through its RPATH ($ORIGIN/../lib), with no
# LD_LIBRARY_PATH; only for a read-only bundle (unpacked into $TMPDIR) does the launcher put lib/
# on LD_LIBRARY_PATH.
mkdir -p "$bundle/packed"
packed=0
for f in "${binaries[@]}"; do
  (($(stat -c %s "$f") > 1048576)) || continue
  name=$(basename "$f")
  xz -6 -T0 -c "$f" >"$bundle/packed/$name.xz"
  chmod 644 "$bundle/packed/$name.xz"
  cat >"$f" <<'LAUNCHER'
#!/bin/sh
# Launcher written by tools/bundle_binaries.sh: unpacks packed/<name>.xz once, then runs it.
here=$(cd "$(dirname "$0")" && pwd)
name=$(basename "$0")
dir="$here/.unpacked"
if ! { mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ]; }; then
  # Read-only bundle: unpack into $TMPDIR, where the binary's $ORIGIN/../lib is not the bundle's
  # lib/; only then is lib/ put on LD_LIBRARY_PATH.
  dir="${TMPDIR:-/tmp}/switchyard_gpu_bundle_$(id -u)"
  export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
mkdir -p "$dir" || exit 127
bin="$dir/$name"
if [ ! -x "$bin" ] || [ "$here/packed/$name.xz" -nt "$bin" ]; then
  tmp="$bin.tmp.$$"
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$here/packed/$name.xz" >"$tmp"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
      "$here/packed/$name.xz" >"$tmp"
  fi || { echo "$name: cannot unpack $here/packed/$name.xz" >&2; rm -f "$tmp"; exit 127; }
  chmod 755 "$tmp" && mv -f "$tmp" "$bin" || exit 127
fi
exec "$bin" "$@"
LAUNCHER
  chmod 755 "$f"
  packed=$((packed + 1))
done
log "$packed binaries packed (xz) behind launchers"
