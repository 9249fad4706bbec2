#!/usr/bin/env bash
# scripts/gpu-check.sh — verifies a GPU machine in one command: configures a CUDA build
# (WAGMA_WITH_CUDA=ON: a machine without CUDA fails at configure), builds exactly the tests
# labelled gpu and the GPU benchmarks, runs the gpu tests (a skipped test is a FAILURE here: the
# point is to run them on a GPU; only the tests also labelled multigpu, one NCCL rank per GPU,
# may skip, on a machine of one GPU), then the benchmarks: bench_train_gpu, samples/s of the MLP
# and LeNet-5 at batch 64, 512 and 4096 on the GPU against the CPU path in the same run, with
# the ratios; bench_nccl_gpu, the NCCL lane's data path per payload against a bare
# ncclAllReduce, by size; bench_nccl_multi_gpu, a round of wagma_comm_step between two GPUs
# over NCCL (with and without an agent's device copies) against a bare ncclAllReduce among them
# (not run on a machine of one GPU). The gpu tests: test_train_gpu (the CUDA backend's conformance),
# test_agent_gpu (agents training cuda jobs, each in its wagma-train over libwagma),
# test_nccl_gpu (single-rank NCCL: initialisation,
# a self-transfer, fresh communicators per epoch, revoke, abort; docs/design.md §6.4), and the
# multigpu ones, test_nccl_multi_gpu and test_nccl_engine_multi_gpu.
#
# Environment (all optional):
#   WAGMA_BUILD_DIR  build folder (default build-gpu)
#   BATCHES          benchmark batch sizes (default 64,512,4096)
#   MODELS           benchmark models (default "mlp lenet5")
#   SECONDS_PER_POINT  minimum timed seconds per benchmark point (default 2)
#   CPU_THREADS      BLAS threads of the CPU side (default: every online core)
#   DATA             synthetic (default) or fashion
#   NCCL_REPS        bench_nccl_gpu repetitions per size (default 200)
#   NCCL_ROUNDS      bench_nccl_multi_gpu rounds per size (default 300)
# Exit status: 0 all gpu tests passed and the benchmark ran; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${WAGMA_BUILD_DIR:-build-gpu}
batches=${BATCHES:-64,512,4096}
models=${MODELS:-mlp lenet5}

echo "== GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi

echo "== configure ($build, WAGMA_WITH_CUDA=ON)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWAGMA_WITH_CUDA=ON \
  -DWAGMA_WERROR="${WAGMA_WERROR:-ON}" >/dev/null
# The gpu-labelled tests; each test is the executable of the same name (wagma_add_test).
mapfile -t tests < <(cd "$build" && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: *//p' | sort -u)
if [ "${#tests[@]}" -eq 0 ]; then
  echo "no test is labelled gpu" >&2
  exit 1
fi
echo "== build: ${tests[*]} bench_train_gpu bench_nccl_gpu bench_nccl_multi_gpu"
cmake --build "$build" -j"$(nproc)" --target "${tests[@]}" bench_train_gpu bench_nccl_gpu \
  bench_nccl_multi_gpu

echo "== tests labelled gpu"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
(cd "$build" && ctest -L gpu --no-tests=error --output-on-failure -V) 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "gpu tests FAILED" >&2
  exit 1
fi
# A skipped test fails the check, except the multigpu-labelled ones on a machine of one GPU
# (they need one GPU per NCCL rank): those are listed as not run.
mapfile -t multi < <(cd "$build" && ctest -N -L multigpu | sed -n 's/^ *Test *#[0-9]*: *//p')
mapfile -t skipped < <(sed -n 's/^ *[0-9]*\/[0-9]* *Test *#[0-9]*: *\([^ ]*\) .*Skipped.*/\1/p' "$log")
ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
for t in "${skipped[@]}"; do
  if [ "${ngpus:-0}" -eq 1 ] && printf '%s\n' "${multi[@]}" | grep -qx "$t"; then
    echo "not run: $t needs 2 or more GPUs; this machine has 1"
  else
    echo "gpu test $t was SKIPPED: this machine has no usable CUDA GPU (see its SKIP line)" >&2
    exit 1
  fi
done

echo "== benchmark: GPU vs CPU, batches $batches"
margs=()
for m in $models; do margs+=(--model "$m"); done
extra=()
[ -n "${CPU_THREADS:-}" ] && extra+=(--cpu-threads "$CPU_THREADS")
"$build/bench/train/bench_train_gpu" "${margs[@]}" --batch "$batches" \
  --seconds "${SECONDS_PER_POINT:-2}" --data "${DATA:-synthetic}" "${extra[@]}"
echo "== benchmark: the NCCL data path per payload vs a bare ncclAllReduce (one rank)"
"$build/bench/nccl/bench_nccl_gpu" "${NCCL_REPS:-200}"
echo "== benchmark: a round of two ranks over NCCL vs a bare ncclAllReduce (two GPUs)"
set +e
"$build/bench/nccl/bench_nccl_multi_gpu" "${NCCL_ROUNDS:-300}"
status=$?
set -e
if [ "$status" -eq 77 ] && [ "${ngpus:-0}" -le 1 ]; then
  echo "not run: bench_nccl_multi_gpu needs 2 or more GPUs; this machine has ${ngpus:-0}"
elif [ "$status" -ne 0 ]; then
  echo "bench_nccl_multi_gpu FAILED" >&2
  exit 1
fi
echo "== gpu-check: all gpu tests passed"
