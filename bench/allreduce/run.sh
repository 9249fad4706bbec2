#!/usr/bin/env bash
# Allreduce bus bandwidth: wagma's TCP transport against MPI_Allreduce, same sizes, same host.
#   bench/allreduce/run.sh [BUILD_DIR] [P]        (defaults: build, 4)
# Env: S (group size, default 2), MIN/MAX (bytes, default 4096 / 67108864, x4 steps),
#      REPEAT (default 3: best of N per size and column), SECONDS_PER_SIZE (default 0.3).
# For each size the three programs run back to back (wagma, MPI over TCP, MPI default), so
# load drifting on a shared machine hits all columns alike. MPI over its TCP transport
# (--mca btl tcp,self on lo) uses the same loopback sockets as wagma: the fair baseline; MPI
# with its default shared-memory transport is shown for reference.
set -euo pipefail
BUILD=${1:-build}
P=${2:-4}
S=${S:-2}
MIN=${MIN:-4096}
MAX=${MAX:-67108864}
REPEAT=${REPEAT:-3}
SECS=${SECONDS_PER_SIZE:-0.3}
dir=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$dir/../.." && pwd)
[[ "$BUILD" = /* ]] || BUILD="$root/$BUILD"
WAGMA="$BUILD/bench/allreduce/bench_allreduce"
MPIB="$BUILD/bench/allreduce/bench_allreduce_mpi"
[ -x "$WAGMA" ] || { echo "missing $WAGMA (cmake --build $BUILD --target bench_allreduce)" >&2; exit 1; }
[ -x "$MPIB" ] || echo "note: $MPIB not built (no MPI found): MPI columns empty" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpirun_args=(--allow-run-as-root --oversubscribe -np "$P")

for ((rep = 0; rep < REPEAT; rep++)); do
  for ((size = MIN; size <= MAX; size *= 4)); do
    args=(--min "$size" --max "$size" --seconds "$SECS")
    "$WAGMA" -P "$P" -S "$S" "${args[@]}" | grep -v '^#' >> "$tmp/wagma"
    if [ -x "$MPIB" ]; then
      OMPI_MCA_btl=tcp,self OMPI_MCA_pml=ob1 OMPI_MCA_btl_tcp_if_include=lo \
        mpirun "${mpirun_args[@]}" "$MPIB" "${args[@]}" 2>/dev/null | grep -v '^#' >> "$tmp/mpi_tcp" || true
      mpirun "${mpirun_args[@]}" "$MPIB" "${args[@]}" 2>/dev/null | grep -v '^#' >> "$tmp/mpi_sm" || true
    fi
  done
done
touch "$tmp/mpi_tcp" "$tmp/mpi_sm"

echo "allreduce bus bandwidth (GB/s, best of $REPEAT), P=$P on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); group = P/$S groups of $S at once"
awk -v S="$S" '
  function best(a, k, v) { if (!(k in a) || v > a[k]) a[k] = v }
  FILENAME == ARGV[1] { if (!($1 in w)) order[n++] = $1; best(w, $1, $2); best(g, $1, $3); next }
  FILENAME == ARGV[2] { best(t, $1, $2); next }
  FILENAME == ARGV[3] { best(m, $1, $2); next }
  END {
    printf "| %8s | %10s | %12s | %15s | %12s | %17s |\n", "size", "wagma GB/s", "MPI tcp GB/s", "ratio wagma/MPI", "MPI shm GB/s", "wagma group S=" S
    printf "|---------:|-----------:|-------------:|----------------:|-------------:|------------------:|\n"
    for (i = 0; i < n; i++) {
      s = order[i]; sz = s + 0
      label = sz >= 1048576 ? sprintf("%d MiB", sz / 1048576) : sprintf("%d KiB", sz / 1024)
      ratio = (s in t && t[s] > 0) ? sprintf("%.2f", w[s] / t[s]) : "-"
      printf "| %8s | %10.3f | %12s | %15s | %12s | %17.3f |\n", label, w[s], (s in t) ? sprintf("%.3f", t[s]) : "-", ratio, (s in m) ? sprintf("%.3f", m[s]) : "-", g[s]
    }
  }' "$tmp/wagma" "$tmp/mpi_tcp" "$tmp/mpi_sm"
