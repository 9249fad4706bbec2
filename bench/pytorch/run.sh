#!/usr/bin/env bash
# bench/pytorch/run.sh — the same PyTorch script (the CNN of examples/pytorch/fmnist_cnn.py on
# Fashion-MNIST) under torch.distributed DDP (gloo, 4 processes on 127.0.0.1) and as a wagma
# program job of 4 agents (wagma wait-avoiding, wagma barrier, allreduce, local-sgd), in three
# scenarios: no straggler, transient pauses (each step, with probability 0.1, one process
# sleeps 50 ms), one worker 40 ms slower per step. Reports the time from the first training
# step to a target test accuracy (the mean over the members of the accuracy of their latest
# model snapshot, saved every 25 steps and evaluated after the run on a fixed 2000-image test
# subset) and DDP's time over it; then the wrapper's cost per step: the script alone (one
# process, no wagma) against a 1-agent wagma program job.
#
# It starts a private etcd, a wagma-coordinator and 4 wagma-agents (--programs with
# bench/pytorch/cnn_bench.py as the program cnn_bench) on 127.0.0.1, and runs
# bench/pytorch/driver.py against them, which launches the DDP processes and submits the jobs.
# Everything it starts it stops by PID (trap on EXIT); its temp dir is removed. Python is
# /usr/bin/python3 with Debian's python3-torch (CPU), one torch thread per process. Nothing is
# downloaded. About 5 minutes on 2 cores (docs/benchmarks.md, "PyTorch programs").
#
# usage: bench/pytorch/run.sh [--build DIR] [--out DIR] [driver options...]
#   --build DIR  the build with the binaries and libwagma (default build, or $WAGMA_BUILD_DIR)
#   --out DIR    keep the logs, the members' records and results.md there (default: a temp
#                dir, removed at the end)
#   driver options (bench/pytorch/driver.py --help): --target A (0.85), --snap-every N (25),
#   --iterations N (cap, 500), --max-seconds S (cap from the first step, 60; a wagma run's:
#   --cap-factor 3 x DDP's time to the target, at least --min-cap 15), --scenarios "none
#   pauses slow", --systems "ddp wagma-wait-avoiding wagma-barrier allreduce local-sgd",
#   --overhead-iterations N (300; 0 skips), --overhead-repeat R (2)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${WAGMA_BUILD_DIR:-$ROOT/build}"
OUT=""
DRIVER_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
  --build) BUILD="$2"; shift 2 ;;
  --out) OUT="$2"; shift 2 ;;
  -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
  *) DRIVER_ARGS+=("$1"); shift ;;
  esac
done
BUILD="$(cd "$BUILD" && pwd)"
COORD="$BUILD/coordinator/wagma-coordinator"
AGENT="$BUILD/agent/wagma-agent"
LIB="$BUILD/worker/libwagma.so"
for f in "$COORD" "$AGENT" "$LIB"; do
  [ -e "$f" ] || { echo "pytorch bench: $f missing: build wagma-coordinator, wagma-agent and wagma_worker in $BUILD" >&2; exit 1; }
done
command -v etcd >/dev/null || { echo "pytorch bench: etcd missing (scripts/deps.sh --bench)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "pytorch bench: /usr/bin/python3 has no torch (python3-torch)" >&2; exit 1; }
[ -d /usr/share/datasets/fashion-mnist ] || { echo "pytorch bench: /usr/share/datasets/fashion-mnist missing (dataset-fashion-mnist)" >&2; exit 1; }

say() { printf '[pytorch-bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

PIDS=()
TMP=""
stop_pids() { # TERM, up to 10 s, KILL
  local pid alive
  [ $# -gt 0 ] || return 0
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 1 100); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  return 0
}
cleanup() {
  local rc=$?
  set +e
  # the driver and the agents together (their programs die with them), then the coordinator,
  # then etcd (PIDS: etcd, coordinator, agents, driver)
  stop_pids "${PIDS[@]:2}"
  [ ${#PIDS[@]} -ge 2 ] && stop_pids "${PIDS[1]}"
  [ ${#PIDS[@]} -ge 1 ] && stop_pids "${PIDS[0]}"
  if [ -n "$TMP" ] && [ -d "$TMP" ]; then
    if [ "$rc" != 0 ]; then
      for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "---- $(basename "$f") (last lines)"; tail -n 15 "$f"; }; done
    fi
    if [ -n "$OUT" ]; then
      mkdir -p "$OUT"
      cp -r "$TMP"/*.log "$TMP/runs/." "$OUT/" 2>/dev/null
    fi
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

TMP="$(mktemp -d "${TMPDIR:-/tmp}/wagma-pytorch-bench.XXXXXX")"
USED=" "
port_free() {
  case "$USED" in *" $1 "*) return 1 ;; esac
  ! (ss -Htan 2>/dev/null || true) | awk '{print $4}' | grep -Eq "[:.]$1\$"
}
free_port() { # sets PORT (not in a subshell: USED remembers it)
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000)) # below the ephemeral range (32768+)
    if port_free "$p"; then USED="$USED$p "; PORT=$p; return 0; fi
  done
  echo "pytorch bench: no free port" >&2; return 1
}
wait_http() { # url seconds
  local deadline=$((SECONDS + $2))
  until curl -fsS -m 2 "$1" >/dev/null 2>&1; do
    [ $SECONDS -ge $deadline ] && { echo "pytorch bench: $1 did not come up" >&2; return 1; }
    sleep 0.2
  done
}

free_port; ETCD_CLIENT=$PORT
free_port; ETCD_PEER=$PORT
free_port; REST=$PORT
etcd --name pytorch-bench --data-dir "$TMP/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "pytorch-bench=http://127.0.0.1:$ETCD_PEER" >"$TMP/etcd.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$ETCD_CLIENT/health" 30

"$COORD" --etcd "127.0.0.1:$ETCD_CLIENT" --listen "127.0.0.1:$REST" >"$TMP/coordinator.log" 2>&1 &
PIDS+=($!)
API="http://127.0.0.1:$REST"
wait_http "$API/healthz" 30

mkdir -p "$TMP/programs" "$TMP/runs"
ln -s "$ROOT/bench/pytorch/cnn_bench.py" "$TMP/programs/cnn_bench"
for i in 0 1 2 3; do
  free_port
  "$AGENT" --etcd "127.0.0.1:$ETCD_CLIENT" --name "agent-$i" --listen "127.0.0.1:$PORT" \
    --programs "$TMP/programs" --program-env "PYTHONPATH=$ROOT/python" \
    --program-env "WAGMA_LIBRARY=$LIB" --program-env "OMP_NUM_THREADS=1" \
    >"$TMP/agent-$i.log" 2>&1 &
  PIDS+=($!)
done
deadline=$((SECONDS + 30))
until [ "$(curl -fsS -m 5 "$API/v1/agents" | grep -o '"name"' | wc -l)" -ge 4 ]; do
  [ $SECONDS -ge $deadline ] && { echo "pytorch bench: agents did not register" >&2; exit 1; }
  sleep 0.3
done
say "etcd, coordinator ($API) and 4 agents up; $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg)"

/usr/bin/python3 "$ROOT/bench/pytorch/driver.py" --api "$API" --program cnn_bench \
  --out "$TMP/runs" "${DRIVER_ARGS[@]}" &
DRIVER=$!
PIDS+=("$DRIVER")
wait "$DRIVER"
