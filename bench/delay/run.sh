#!/usr/bin/env bash
# The delayed-gradient study (bench_delay.c): MLP on Fashion-MNIST, batch 64, 2,000 steps,
# SGD momentum 0.9 at lr 0.01 / 0.05 / 0.2 and Adam at 3e-4 / 1e-3 / 3e-3, delays 0 / 8 / 32 /
# 128; final test accuracy per cell, each against delay 0 of its row.
# Usage: bench/delay/run.sh [build dir] [extra bench_delay flags]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
shift || true
cmake --build "$build" --target bench_delay -j2 >/dev/null
"$build/bench/delay/bench_delay" --steps 2000 --batch 64 --delays 0,8,32,128 "$@"
