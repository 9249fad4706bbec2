#!/usr/bin/env bash
# Installs wagma's build and test dependencies from Debian's registry.
# Idempotent: packages already present are not fetched again; apt-get update runs
# only when something is missing. Needs root (or sudo) on Debian 12.
#   scripts/deps.sh          what scripts/test.sh and scripts/demo.sh need
#   scripts/deps.sh --bench  plus the benchmarks' baselines and plotting (PyTorch, gnuplot)
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates curl procps psmisc iproute2
  etcd-server etcd-client
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev
  libmicrohttpd-dev libjansson-dev libcmocka-dev libopenblas-dev zlib1g-dev
  libcurl4-openssl-dev libssl-dev dataset-fashion-mnist
  openmpi-bin libopenmpi-dev wrk yamllint valgrind clang
  libclang-rt-dev # libFuzzer runtime for .ci/run: only a Recommends of clang, which
  #                 --no-install-recommends skips
  libyaml-dev
)
if [ "${1:-}" = "--bench" ]; then
  PACKAGES+=(python3-torch gnuplot-nox)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "deps: need root to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
