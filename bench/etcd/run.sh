#!/usr/bin/env bash
# bench/etcd/run.sh — builds and runs bench_etcd: libwagma_etcd puts/s and put->watch
# latency with 1 and 8 client threads, then `etcdctl check perf` against the same private
# etcd, and prints the ratio. Usage: bench/etcd/run.sh [build dir]   (default build-bench)
# Environment: WAGMA_BENCH_SECONDS (5), WAGMA_BENCH_PERF_LOAD (l).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DWAGMA_WITH_CUDA=OFF >/dev/null
cmake --build "$build" --target bench_etcd -j"$(nproc)" >/dev/null
exec "$build/bench/etcd/bench_etcd"
