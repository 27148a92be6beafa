#!/usr/bin/env bash
# Installs everything a fresh Debian 12 machine needs to build and test Switchyard, and nothing
# else: Debian packages (Bazel, gRPC, Protobuf, Abseil, prometheus-cpp, ...) and the pinned PyPI
# packages (CUTLASS / cuDNN frontend headers, kubernetes-validate for deploy/); then builds the
# default training corpus from the bible-kjv packages (tools/prepare_corpus.sh). Idempotent: a
# second run checks and returns quickly.
# The CUDA 13 toolkit (nvcc, cuBLAS, NCCL) is expected at /usr/local/cuda (or $CUDA_PATH).
set -euo pipefail

DEBIAN_PACKAGES=(
  bazel-bootstrap            # Bazel 4.2.3, used offline with the shims in third_party/shims
  pkg-config
  protobuf-compiler libprotobuf-dev
  protobuf-compiler-grpc libgrpc++-dev
  libabsl-dev
  prometheus-cpp-dev
  nlohmann-json3-dev
  libyaml-cpp-dev
  libcpp-httplib-dev
  libgloo-dev
  libsqlite3-dev
  libgtest-dev libgmock-dev
  clang-format
  bible-kjv-text bible-kjv  # default training corpus (KJV text + its decoder); tools/prepare_corpus.sh
  jq python3-yaml openssl bsdutils  # cli/syctl_test.sh: JSON/YAML checks, a TLS cert, `script`
  prometheus  # deploy/deploy_test.py: promtool checks and a real Prometheus scraping the binaries
  patchelf xz-utils  # tools/bundle_binaries.sh: RUNPATH of bundled binaries; packing
)
PYPI_PACKAGES=(
  "nvidia-cutlass==4.2.0.0"  # CUTLASS 4.2 C++ headers (cutlass_library/source/include)
  "nvidia-cudnn-frontend==1.32.0"  # cuDNN frontend C++ headers (fused attention; libcudnn loaded at run time)
  # deploy/deploy_test.py: Kubernetes 1.22-1.32 OpenAPI schemas bundled (no network at test time);
  # installed with its dependencies (jsonschema, referencing, ...), unlike the header packages
  "kubernetes-validate==1.32.0"
)

log() { echo "[setup] $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

for spec in "${PYPI_PACKAGES[@]}"; do
  name=${spec%%==*}
  want=${spec##*==}
  have=$(python3 -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)
  if [ "$have" != "$want" ]; then
    if [ "$name" = kubernetes-validate ]; then
      log "installing $spec (with its dependencies)"
      python3 -m pip install -q "$spec"
    else
      log "installing $spec (headers only, no dependencies)"
      python3 -m pip install -q --no-deps "$spec"
    fi
  fi
done

cuda=${CUDA_PATH:-/usr/local/cuda}
if [ ! -x "$cuda/bin/nvcc" ]; then
  log "ERROR: no CUDA toolkit at $cuda (expected nvcc, cuBLAS and NCCL there; set CUDA_PATH)"
  exit 1
fi
log "ok: $(bazel --version 2>/dev/null || echo bazel), $(protoc --version), nvcc $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"

# The default training corpus (needs the packages above and Bazel; quick when already built).
"$(dirname "$0")/prepare_corpus.sh"
