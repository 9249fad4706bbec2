#!/usr/bin/env bash
# Allreduce: wagma's TCP transport against MPI_Allreduce over TCP, same sizes, same host, at
# several P in one run; the engine's group round beside an allreduce among S ranks of the
# same buffer (the P/S groups' concurrent allreduces), their ratio in the column
# round/allreduce(S), and a 4 KiB latency table.
#   bench/allreduce/run.sh [BUILD_DIR] [P ...]        (defaults: build, 4 8)
# Env: OLD=DIR   a second build (e.g. the version before a change, with this bench source
#                copied in: docs/benchmarks.md) measured in the same run, alternating;
#      S (group size, default 2), MIN/MAX (bytes, default 4096 / 67108864, x4 steps),
#      REPEAT (default 3), SECONDS_PER_SIZE (default 0.3), ENGINE (1: the engine's round, the
#      default; 0: skip), LAT (4 KiB allreduces timed one by one per repetition, default 2000;
#      0: skip), SHM (1: MPI over shared memory too, for reference).
# Per repetition, P and size the programs run back to back (wagma, OLD, MPI over TCP), in an
# order that rotates between repetitions, so load drifting on a shared machine hits all
# columns alike. GB/s: best of the repetitions; CPU and latency: median of the repetitions.
# MPI over its TCP transport (--mca btl tcp,self on lo) uses the same loopback sockets as
# wagma: the fair baseline.
set -euo pipefail
BUILD=${1:-build}
shift || true
PS=("$@")
[ ${#PS[@]} -gt 0 ] || PS=(4 8)
S=${S:-2}
MIN=${MIN:-4096}
MAX=${MAX:-67108864}
REPEAT=${REPEAT:-3}
SECS=${SECONDS_PER_SIZE:-0.3}
ENGINE=${ENGINE:-1}
LAT=${LAT:-2000}
SHM=${SHM:-0}
OLD=${OLD:-}
dir=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$dir/../.." && pwd)
[[ "$BUILD" = /* ]] || BUILD="$root/$BUILD"
[ -z "$OLD" ] || [[ "$OLD" = /* ]] || OLD="$root/$OLD"
WAGMA="$BUILD/bench/allreduce/bench_allreduce"
MPIB="$BUILD/bench/allreduce/bench_allreduce_mpi"
[ -x "$WAGMA" ] || { echo "missing $WAGMA (cmake --build $BUILD --target bench_allreduce)" >&2; exit 1; }
[ -z "$OLD" ] || [ -x "$OLD/bench/allreduce/bench_allreduce" ] || { echo "missing $OLD/bench/allreduce/bench_allreduce" >&2; exit 1; }
[ -x "$MPIB" ] || echo "note: $MPIB not built (no MPI found): MPI columns empty" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }

# Runs one program; prefixes its data lines with "tag P".
run_one() { # tag P args...
  local tag=$1 p=$2
  shift 2
  case ${tag%eng} in
    new) "$WAGMA" -P "$p" -S "$S" --group 1 "$@" ;;
    old) "$OLD/bench/allreduce/bench_allreduce" -P "$p" -S "$S" "$@" ;;
    mpi) OMPI_MCA_btl=tcp,self OMPI_MCA_pml=ob1 OMPI_MCA_btl_tcp_if_include=lo \
           mpirun --allow-run-as-root --oversubscribe -np "$p" "$MPIB" "$@" 2>/dev/null || true ;;
    shm) mpirun --allow-run-as-root --oversubscribe -np "$p" "$MPIB" "$@" 2>/dev/null || true ;;
  esac | grep -v '^#' | sed "s/^/$tag $p /" >> "$tmp/raw"
}

tags=(new)
[ -z "$OLD" ] || tags+=(old)
[ -x "$MPIB" ] && tags+=(mpi)
[ -x "$MPIB" ] && [ "$SHM" = 1 ] && tags+=(shm)
for p in "${PS[@]}"; do
  echo "P=$p start $(load)" >> "$tmp/loads"
  for ((rep = 0; rep < REPEAT; rep++)); do
    n=${#tags[@]}
    order=()
    for ((i = 0; i < n; i++)); do order+=("${tags[(i + rep) % n]}"); done
    for ((size = MIN; size <= MAX; size *= 4)); do
      for tag in "${order[@]}"; do
        run_one "$tag" "$p" --min "$size" --max "$size" --seconds "$SECS"
      done
    done
    if [ "$LAT" -gt 0 ]; then
      for tag in "${order[@]}"; do
        [ "$tag" = shm ] && continue
        run_one "$tag" "$p" --coll 0 --lat "$LAT"
      done
    fi
    if [ "$ENGINE" = 1 ]; then
      for tag in new old; do
        [ "$tag" = old ] && [ -z "$OLD" ] && continue
        run_one "${tag}eng" "$p" --min "$MIN" --max "$MAX" --seconds "$SECS" --coll 0 --engine 1 2>/dev/null || true
      done
    fi
  done
  echo "P=$p end $(load)" >> "$tmp/loads"
done

echo "allreduce (MEAN) on $(nproc) cores, REPEAT=$REPEAT, S=$S; GB/s = bus bandwidth, best of $REPEAT; CPU = process CPU time (all threads) per operation, median"
cat "$tmp/loads" | sed 's/^/load average (1, 5, 15 min): /'
/usr/bin/python3 - "$tmp/raw" "$ENGINE" "$S" <<'EOF'
import sys, statistics as st
raw, engine = sys.argv[1], sys.argv[2] == "1"
S = int(sys.argv[3])
bw, cpu, eng, engcpu, lat, grp = {}, {}, {}, {}, {}, {}
for line in open(raw):
    f = line.split()
    if len(f) < 4:
        continue
    tag, p = f[0], int(f[1])
    if f[2] == "lat":
        lat.setdefault((tag, p), []).append((float(f[4]), float(f[5]), float(f[6])))
        continue
    size = int(f[2])
    if tag.endswith("eng"):
        if len(f) >= 8 and f[6] != "-":
            eng.setdefault((tag[:-3], p, size), []).append(float(f[6]))
            engcpu.setdefault((tag[:-3], p, size), []).append(float(f[7]))
        continue
    if tag == "new" and len(f) >= 6 and f[5] != "-":  # the groups' busbw -> µs of one
        grp.setdefault((p, size), []).append(size * 2 * (S - 1) / S / (float(f[5]) * 1e9) * 1e6)
    if f[3] != "-":
        bw.setdefault((tag, p, size), []).append(float(f[3]))
        cpu.setdefault((tag, p, size), []).append(float(f[4]))
def label(s):
    return f"{s // 1048576} MiB" if s >= 1048576 else f"{s // 1024} KiB"
def best(d, k): return max(d[k]) if k in d else None
def med(d, k): return st.median(d[k]) if k in d else None
def fmt(v, spec): return "-" if v is None else format(v, spec)
has_old = any(k[0] == "old" for k in bw)
for p in sorted({k[1] for k in bw}):
    sizes = sorted({k[2] for k in bw if k[1] == p})
    cols = ["size", "wagma GB/s"] + (["before GB/s"] if has_old else []) + ["MPI tcp GB/s", "wagma/MPI"] \
        + (["before/MPI"] if has_old else []) + ["CPU µs/op wagma"] + (["before"] if has_old else []) + ["MPI"] \
        + (["engine round µs", "engine CPU µs/round", "allreduce(S) µs", "round/allreduce(S)"] if engine else []) \
        + (["before: engine µs", "CPU"] if engine and has_old else [])
    print(f"\nP = {p}\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for s in sizes:
        w, o, m = best(bw, ("new", p, s)), best(bw, ("old", p, s)), best(bw, ("mpi", p, s))
        row = [label(s), fmt(w, ".3f")] + ([fmt(o, ".3f")] if has_old else []) + [fmt(m, ".3f"),
               fmt(w / m if w and m else None, ".2f")] + ([fmt(o / m if o and m else None, ".2f")] if has_old else [])
        row += [fmt(med(cpu, ("new", p, s)), ".1f")] + ([fmt(med(cpu, ("old", p, s)), ".1f")] if has_old else []) \
            + [fmt(med(cpu, ("mpi", p, s)), ".1f")]
        if engine:
            e, g = med(eng, ("new", p, s)), med(grp, (p, s))
            row += [fmt(e, ".1f"), fmt(med(engcpu, ("new", p, s)), ".1f"), fmt(g, ".1f"),
                    fmt(e / g if e and g else None, ".2f")]
            if has_old:
                row += [fmt(med(eng, ("old", p, s)), ".1f"), fmt(med(engcpu, ("old", p, s)), ".1f")]
        print("| " + " | ".join(row) + " |")
if lat:
    print("\nLatency of one 4 KiB allreduce (µs, every rank's samples; median of the repetitions' percentiles)\n")
    print("| P | program | p50 µs | p99 µs | CPU µs/op |")
    print("|---:|---|---:|---:|---:|")
    names = {"new": "wagma", "old": "before", "mpi": "MPI tcp"}
    for (tag, p) in sorted(lat, key=lambda k: (k[1], ["new", "old", "mpi"].index(k[0]))):
        v = lat[(tag, p)]
        print(f"| {p} | {names.get(tag, tag)} | {st.median(x[0] for x in v):.1f} | "
              f"{st.median(x[1] for x in v):.1f} | {st.median(x[2] for x in v):.1f} |")
EOF
