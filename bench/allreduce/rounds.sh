#!/usr/bin/env bash
# Rounds as an allreduce (docs/design.md §5.11): the engine's round on the star path and on the
# allreduce path, against the baseline the issue names, one allreduce among the round's group,
# all in the same run.
#   bench/allreduce/rounds.sh [BUILD_DIR] [P ...]        (defaults: build, 4)
# Env: S (group size, default 2), MIN/MAX (bytes, default 4096 / 16777216, x4 steps), REPEAT
# (default 3), SECONDS_PER_SIZE (default 0.3).
# Per repetition and size, bench_allreduce runs twice, WAGMA_ENGINE_ROUNDS=star then =allreduce
# (the order alternates between repetitions), each measuring the P/S groups' concurrent
# allreduces (--group 1) and the engine's round (--engine 1). Medians of the repetitions.
# Columns: the group allreduce (µs, from its bus bandwidth), the star round and the allreduce
# round (µs), and the ratios round / group allreduce and star / allreduce round.
set -euo pipefail
BUILD=${1:-build}
shift || true
PS=("$@")
[ ${#PS[@]} -gt 0 ] || PS=(4)
S=${S:-2}
MIN=${MIN:-4096}
MAX=${MAX:-16777216}
REPEAT=${REPEAT:-3}
SECS=${SECONDS_PER_SIZE:-0.3}
root=$(cd "$(dirname "$0")/../.." && pwd)
[[ "$BUILD" = /* ]] || BUILD="$root/$BUILD"
B="$BUILD/bench/allreduce/bench_allreduce"
[ -x "$B" ] || { echo "missing $B (cmake --build $BUILD --target bench_allreduce)" >&2; exit 1; }
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for p in "${PS[@]}"; do
  for ((rep = 0; rep < REPEAT; rep++)); do
    modes=(star allreduce)
    ((rep % 2)) && modes=(allreduce star)
    for ((size = MIN; size <= MAX; size *= 4)); do
      for m in "${modes[@]}"; do
        WAGMA_ENGINE_ROUNDS=$m "$B" -P "$p" -S "$S" --min "$size" --max "$size" --seconds "$SECS" \
          --group 1 --engine 1 2>/dev/null | grep -v '^#' | sed "s/^/$m $p /" >> "$raw" || true
      done
    done
  done
done
echo "rounds on $(nproc) cores, S=$S, REPEAT=$REPEAT; medians; load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$raw" "$S" <<'PY'
import sys, statistics as st
raw, S = sys.argv[1], int(sys.argv[2])
grp, rnd = {}, {}
for line in open(raw):
    f = line.split()
    if len(f) < 8:
        continue
    mode, p, size = f[0], int(f[1]), int(f[2])
    if f[5] != "-":  # group busbw -> µs of one group allreduce
        grp.setdefault((p, size), []).append(size * 2 * (S - 1) / S / (float(f[5]) * 1e9) * 1e6)
    if f[6] != "-":
        rnd.setdefault((mode, p, size), []).append(float(f[6]))
def med(d, k): return st.median(d[k]) if k in d else None
def fmt(v, spec=".1f"): return "-" if v is None else format(v, spec)
def label(s): return f"{s // 1048576} MiB" if s >= 1048576 else f"{s // 1024} KiB"
for p in sorted({k[0] for k in grp} | {k[1] for k in rnd}):
    print(f"\nP = {p}, groups of {S}\n")
    print("| size | group allreduce µs | star round µs | allreduce round µs | star / group | allreduce round / group | star / allreduce round |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s in sorted({k[2] for k in rnd if k[1] == p}):
        g, a, b = med(grp, (p, s)), med(rnd, ("star", p, s)), med(rnd, ("allreduce", p, s))
        r = lambda x, y: fmt(x / y if x and y else None, ".2f")
        print(f"| {label(s)} | {fmt(g)} | {fmt(a)} | {fmt(b)} | {r(a, g)} | {r(b, g)} | {r(a, b)} |")
PY
