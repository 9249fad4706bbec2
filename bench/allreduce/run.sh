#!/usr/bin/env bash
# Allreduce bus bandwidth: wagma's TCP transport against MPI_Allreduce, same sizes, same host.
#   bench/allreduce/run.sh [BUILD_DIR] [P]        (defaults: build, 4)
# Env: S (group size, default 2), MIN/MAX (bytes, default 4096 / 67108864), SECONDS_PER_SIZE.
# MPI runs twice: over its TCP transport (--mca btl tcp,self: the same loopback sockets as
# wagma, the fair baseline) and with its default shared-memory transport (for reference).
set -euo pipefail
BUILD=${1:-build}
P=${2:-4}
S=${S:-2}
MIN=${MIN:-4096}
MAX=${MAX:-67108864}
SECS=${SECONDS_PER_SIZE:-0.5}
dir=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$dir/../.." && pwd)
[[ "$BUILD" = /* ]] || BUILD="$root/$BUILD"
WAGMA="$BUILD/bench/allreduce/bench_allreduce"
MPIB="$BUILD/bench/allreduce/bench_allreduce_mpi"
[ -x "$WAGMA" ] || { echo "missing $WAGMA (cmake --build $BUILD --target bench_allreduce)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$WAGMA" -P "$P" -S "$S" --min "$MIN" --max "$MAX" --seconds "$SECS" | grep -v '^#' > "$tmp/wagma"
mpirun_args=(--allow-run-as-root --oversubscribe -np "$P")
if [ -x "$MPIB" ]; then
  OMPI_MCA_btl=tcp,self OMPI_MCA_pml=ob1 OMPI_MCA_btl_tcp_if_include=lo \
    mpirun "${mpirun_args[@]}" "$MPIB" --min "$MIN" --max "$MAX" --seconds "$SECS" 2>/dev/null \
    | grep -v '^#' > "$tmp/mpi_tcp" || true
  mpirun "${mpirun_args[@]}" "$MPIB" --min "$MIN" --max "$MAX" --seconds "$SECS" 2>/dev/null \
    | grep -v '^#' > "$tmp/mpi_sm" || true
else
  echo "note: $MPIB not built (no MPI found); MPI columns empty" >&2
  : > "$tmp/mpi_tcp"; : > "$tmp/mpi_sm"
fi

echo "allreduce bus bandwidth (GB/s), P=$P on $(hostname), $(nproc) cores; group = P/$S groups of $S at once"
awk -v S="$S" '
  FILENAME == ARGV[1] { w[$1] = $2; g[$1] = $3; order[n++] = $1; next }
  FILENAME == ARGV[2] { t[$1] = $2; next }
  FILENAME == ARGV[3] { m[$1] = $2; next }
  END {
    printf "| %10s | %11s | %11s | %13s | %13s | %15s |\n", "size", "wagma GB/s", "MPI GB/s", "ratio wagma/MPI", "MPI shm GB/s", "wagma group(S=" S ")"
    printf "|-----------:|------------:|------------:|----------------:|--------------:|-----------------:|\n"
    for (i = 0; i < n; i++) {
      s = order[i]; sz = s + 0
      label = sz >= 1048576 ? sprintf("%d MiB", sz / 1048576) : sprintf("%d KiB", sz / 1024)
      ratio = (s in t && t[s] > 0) ? sprintf("%.2f", w[s] / t[s]) : "-"
      printf "| %10s | %11.3f | %11s | %15s | %13s | %16.3f |\n", label, w[s], (s in t) ? t[s] : "-", ratio, (s in m) ? m[s] : "-", g[s]
    }
  }' "$tmp/wagma" "$tmp/mpi_tcp" "$tmp/mpi_sm"
