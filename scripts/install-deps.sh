#!/usr/bin/env bash
# Installs the Debian packages kiln's build, tests and benchmarks need.
# Idempotent: does nothing when everything is present. The only place that lists system packages.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev       # tests, micro-benchmarks
  libcli11-dev nlohmann-json3-dev libfmt-dev         # CLI, JSON, formatting
  libcpp-httplib-dev                                 # OpenAI-compatible server
  libopenmpi-dev openmpi-bin                         # distributed engine
  libopenblas-dev libdnnl-dev                        # peers in benchmarks only
  bible-kjv                                          # bundled default corpus
  python3
  curl procps                                        # the end-to-end MPI checks: HTTP requests, rank processes
  clang libclang-rt-dev llvm                         # sanitizer builds and libFuzzer (make test, make fuzz); llvm-symbolizer
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
