#!/usr/bin/env bash
# //tools:bundle_test: every binary we ship answers --help with exit 0, and a bundle made by the
# real tools/bundle_binaries.sh (the library half of tools/gpu_bundle.sh) from the binaries that
# build without CUDA work starts every one of them with no environment at all (env -i: no
# LD_LIBRARY_PATH, no PATH).
#
#   bundle_test.sh <bundle_binaries.sh> <binary>...
#
# Checks, each printed with its evidence:
#   1. <binary> --help exits 0 and prints its usage on stdout (Abseil's --help exits 1; see
#      common/command_line.h), and --version (or syctl's `version`) exits 0 where it exists.
#   2. bundle_binaries.sh succeeds on a folder holding copies of the binaries; every executable
#      (the unpacked ones behind launchers included) got the $ORIGIN-relative DT_RPATH.
#   3. Independently of the script's own check: under env -i, ldd resolves every dependency
#      (transitively) of every bundled executable either inside the bundle's lib/ or, for the
#      libraries the GPU host provides, anywhere; never "not found".
#      The negative control runs the same check on an original binary (no RPATH): its gRPC and
#      Abseil resolve in this machine's system directories, which the GPU host lacks, and the
#      check must report that, so it cannot pass vacuously.
#   4. env -i <bundle>/<name> --help exits 0 for every binary (launchers of packed ones included).
set -uo pipefail
script=$1
shift
tmp=${TEST_TMPDIR:-$(mktemp -d)}
bundle="$tmp/bundle"
rm -rf "$bundle"
mkdir -p "$bundle"
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# Must match bundle_binaries.sh: what the GPU host provides.
host_lib_re='^(libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|ld-linux(-x86-64)?|libstdc\+\+|libgcc_s|libcuda|libnvidia-.*|libcudart|libcublas|libcublasLt|libnccl)$'
is_elf() { [[ -f $1 && $(head -c 4 "$1" | od -An -c | tr -d ' ') == 177ELF ]]; }

# Prints "<file>: <soname> => <path>" for every dependency that does not resolve inside
# $2/lib and is not host-provided; returns 1 if there is any.
outside_bundle() {
  local f=$1 root=$2 bad=0 soname arrow path stem
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    stem=${soname%%.so*}
    if [[ $path == not ]]; then
      echo "  $(basename "$f"): $soname not found"
      bad=1
    elif [[ ! $stem =~ $host_lib_re && $(readlink -m "$path") != "$root/lib/"* ]]; then
      echo "  $(basename "$f"): $soname => $path"
      bad=1
    fi
  done < <(env -i /usr/bin/ldd "$f")
  return $bad
}

# --- 1. --help and --version on the built binaries --------------------------------------------
names=()
for bin in "$@"; do
  name=$(basename "$bin")
  names+=("$name")
  out=$("$bin" --help 2>"$tmp/err")
  rc=$?
  if [[ $rc -ne 0 || -z $out ]]; then
    fail "$name --help exited $rc with $(wc -c <<<"$out") bytes on stdout: $(head -3 "$tmp/err")"
  else
    echo "ok: $name --help exits 0 ($(wc -l <<<"$out") lines): $(head -1 <<<"$out")"
  fi
  case $name in
    syctl) version=(version) ;;
    switchyard-worker | switchyard-coordinator) version=(--version) ;;
    *) version=() ;;
  esac
  if [[ ${#version[@]} -gt 0 ]]; then
    out=$("$bin" "${version[@]}" 2>&1)
    rc=$?
    if [[ $rc -ne 0 ]]; then fail "$name ${version[*]} exited $rc: $out"; else echo "ok: $name ${version[*]}: $out"; fi
  fi
  cp -L "$bin" "$bundle/$name"
  chmod u+w,a+rx "$bundle/$name"
done

# --- 2. the real bundling script --------------------------------------------------------------
if ! "$script" "$bundle"; then
  fail "bundle_binaries.sh failed"
  echo "$failures failure(s)"
  exit 1
fi
echo "bundle: $(ls "$bundle" | tr '\n' ' ')"
echo "lib/ ($(ls "$bundle/lib" | wc -l) libraries): $(ls "$bundle/lib" | head -5 | tr '\n' ' ')..."
elves=()  # the executables
for f in "$bundle"/*; do
  if is_elf "$f"; then elves+=("$f"); fi
done
# Packed binaries: their launcher unpacks them on first use (run it once, with no environment).
for name in "${names[@]}"; do
  if ! is_elf "$bundle/$name"; then
    env -i "$bundle/$name" --help >/dev/null 2>&1
    if is_elf "$bundle/.unpacked/$name"; then
      elves+=("$bundle/.unpacked/$name")
      echo "packed: $name (launcher + packed/$name.xz, unpacked to .unpacked/)"
    else
      fail "$name is neither an ELF binary nor a launcher that unpacks one into .unpacked/"
    fi
  fi
done
want='$ORIGIN/lib:$ORIGIN/../lib:/usr/local/cuda/lib64'
for f in "${elves[@]}"; do
  rpath=$(readelf -d "$f" | sed -n 's/.*(RPATH).*\[\(.*\)\]/\1/p')
  [[ $rpath == "$want" ]] || fail "$(basename "$f"): RPATH '$rpath', want '$want'"
done
echo "RPATH $want on ${#elves[@]} executables"

# --- 3. ldd with no environment ---------------------------------------------------------------
for f in "${elves[@]}"; do
  if ! report=$(outside_bundle "$f" "$bundle"); then
    fail "$(basename "$f") needs libraries outside the bundle:"
    echo "$report"
  fi
done
echo "ldd (env -i): the libraries of ${#elves[@]} executables resolve inside the bundle or to" \
  "host-provided libraries"
# Negative control: the original binary, which has no RPATH, must be caught by the same check.
if report=$(outside_bundle "$(readlink -f "$1")" "$bundle"); then
  fail "negative control: the check accepted $1 (no RPATH), so it cannot detect a missing RPATH"
else
  echo "negative control: original $(basename "$1") (no RPATH) is rejected:"
  echo "$report" | head -3
fi

# --- 4. every bundled binary starts with no environment ---------------------------------------
for name in "${names[@]}"; do
  out=$(env -i "$bundle/$name" --help 2>"$tmp/err")
  rc=$?
  if [[ $rc -ne 0 || -z $out ]]; then
    fail "env -i bundle/$name --help exited $rc: $(head -3 "$tmp/err")"
  else
    echo "ok: env -i bundle/$name --help exits 0"
  fi
done

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "PASS: ${#names[@]} binaries"
