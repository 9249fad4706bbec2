#!/usr/bin/env bash
# bench/train/run.sh — single-process CPU training throughput: wagma_train vs PyTorch (baseline),
# same models, batch size, optimizer and data, one thread each. Prints both and the ratio.
#
# Environment (optional): WAGMA_BUILD_DIR (default build), BATCH (64), STEPS (300),
# MODELS ("lenet5 mlp"), DATA (fashion|synthetic), ROUNDS (3: best of N, alternating runs).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${WAGMA_BUILD_DIR:-build}
batch=${BATCH:-64}
steps=${STEPS:-300}
models=${MODELS:-lenet5 mlp}
data=${DATA:-fashion}
rounds=${ROUNDS:-3}
scripts/deps.sh --bench # the PyTorch baseline (python3-torch)

if [ ! -x "$build/bench/train/bench_train" ]; then
  cmake -S . -B "$build" >/dev/null
  cmake --build "$build" --target bench_train -j"$(nproc)" >/dev/null
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
have_torch=1
/usr/bin/python3 -c "import torch" 2>/dev/null || have_torch=0

margs=()
for m in $models; do margs+=(--model "$m"); done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 0; r < rounds; r++)); do
  "$build/bench/train/bench_train" "${margs[@]}" --batch "$batch" --steps "$steps" \
    --threads 1 --data "$data" | tee -a "$out"
  if [ "$have_torch" = 1 ]; then
    /usr/bin/python3 bench/train/torch_baseline.py "${margs[@]}" --batch "$batch" \
      --steps "$steps" --data "$data" | tee -a "$out"
  fi
done
[ "$have_torch" = 1 ] || echo "torch not importable by /usr/bin/python3: no baseline (apt-get install python3-torch)"

best() { # best() SIDE MODEL FIELD: the largest value after FIELD on SIDE's lines for MODEL
  awk -v s="$1" -v m="$2" -v f="$3" '$1==s && $2==m {for (i = 3; i < NF; i++) if ($i==f && $(i+1)>b) b=$(i+1)}
    END {print b+0}' "$out"
}
ratio() { awk -v w="$1" -v t="$2" 'BEGIN {if (t > 0) printf "%.2fx", w / t; else print "n/a"}'; }

echo
echo "best of $rounds, batch $batch, $steps timed steps, 1 thread ($(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
echo "wall = samples per wall-clock second; cpu = per second of the process's CPU time"
printf '%-8s %12s %12s %7s %12s %12s %7s\n' model "wagma wall" "torch wall" ratio \
  "wagma cpu" "torch cpu" ratio
for m in $models; do
  ww=$(best wagma "$m" samples/s) tw=$(best torch "$m" samples/s)
  wc=$(best wagma "$m" cpu_samples/s) tc=$(best torch "$m" cpu_samples/s)
  printf '%-8s %12s %12s %7s %12s %12s %7s\n' "$m" "$ww" "$tw" "$(ratio "$ww" "$tw")" \
    "$wc" "$tc" "$(ratio "$wc" "$tc")"
done
