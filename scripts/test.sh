#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs what is missing, configures,
# builds and runs every test (unit and integration). Exits non-zero on any failure.
#
# Environment (all optional):
#   WAGMA_BUILD_DIR   build folder (default: build)
#   WAGMA_SANITIZE    e.g. address,undefined — sanitizer build; skips "timing" tests
#   WAGMA_WITH_CUDA   AUTO (default), ON or OFF
#   WAGMA_WERROR      ON (default) or OFF
#   WAGMA_CTEST_ARGS  extra arguments for ctest (e.g. "-R etcd")
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

scripts/deps.sh

build_dir=${WAGMA_BUILD_DIR:-build}
sanitize=${WAGMA_SANITIZE:-}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWAGMA_WERROR="${WAGMA_WERROR:-ON}" -DWAGMA_SANITIZE="$sanitize" \
  -DWAGMA_WITH_CUDA="${WAGMA_WITH_CUDA:-AUTO}"
cmake --build "$build_dir" -j"$(nproc)"

ctest_args=(--output-on-failure --no-tests=error)
if [ -n "$sanitize" ]; then
  # Wall-clock assertions mean nothing under a sanitizer's slowdown.
  ctest_args+=(-LE timing)
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0"
  export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi
# shellcheck disable=SC2206
ctest_args+=(${WAGMA_CTEST_ARGS:-})
cd "$build_dir"
ctest "${ctest_args[@]}"
