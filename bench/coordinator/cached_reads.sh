#!/usr/bin/env bash
# Cached read throughput of the coordinator for a job with 64 members (issue 14), with wrk.
#   bench/coordinator/cached_reads.sh [BUILD_DIR] [DURATION_S] [CONNECTIONS] [REPEATS]
# Starts its own etcd on a free port and, on it, the coordinator of BUILD_DIR ("new") and, when
# OLD=/path/to/wagma-coordinator is set, that binary too ("old", e.g. built from an earlier
# commit), each with --read-staleness-ms 0 (consistent reads, the default) and, unless
# STALE_MS=0, a third/fourth process with --read-staleness-ms $STALE_MS (default 1000). All
# follow the same etcd, so one of them leads and the others are followers: followers serve the
# same reads. Then it registers MEMBERS (64) fake agents (leased keys), submits one job with 64
# workers, waits for its plan, writes a progress record for each member, and, while a
# background writer updates PROGRESS_RATE (default 64) progress records per second (the job's
# agents each reporting once a second), measures with wrk, REPEATS (default 3) times in turn:
#   baseline  GET /healthz                   (no etcd, no cache: the HTTP server's own cost)
#             GET /v1/jobs/{id}              (spec, status and 64 members' progress)
#             GET /v1/jobs/{id}/plan, /groups, /events (the timeline)
#             the four reads mixed (wrk script cached_reads.lua)
#             GET /v1/jobs/{id} again with WIDE_CONNS (default 128, the per-address limit) connections
# on every coordinator, and prints req/s, p50, p99 and the ratio to /healthz on the same
# server, with the load average before each run. Processes are stopped by PID at exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-coord}
dur=${2:-5}
conns=${3:-64}
repeats=${4:-3}
members=${MEMBERS:-64}
stale_ms=${STALE_MS:-1000}
rate=${PROGRESS_RATE:-64}
wide=${WIDE_CONNS:-128} # the server takes 128 connections per client address
tmp=$(mktemp -d)
pids=()
cleanup() { # newest first: the coordinators before their etcd
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
cport=$(free_port)
pport=$(free_port)
etcd --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$cport" \
  --advertise-client-urls "http://127.0.0.1:$cport" --listen-peer-urls "http://127.0.0.1:$pport" \
  --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "default=http://127.0.0.1:$pport" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
export ETCDCTL_API=3
E="etcdctl --endpoints=127.0.0.1:$cport"
for _ in $(seq 100); do $E endpoint health >/dev/null 2>&1 && break; sleep 0.1; done

names=() ports=()
start_coord() { # name, binary, extra flags...
  local name=$1 bin=$2 port
  shift 2
  port=$(free_port)
  "$bin" --etcd "127.0.0.1:$cport" --listen "127.0.0.1:$port" --log-level warn --id "$name" \
    "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
  names+=("$name")
  ports+=("$port")
}
start_coord new "$build/coordinator/wagma-coordinator"
[[ $stale_ms -gt 0 ]] && start_coord "new-stale$stale_ms" "$build/coordinator/wagma-coordinator" \
  --read-staleness-ms "$stale_ms"
if [[ -n ${OLD:-} ]]; then
  start_coord old "$OLD"
  [[ $stale_ms -gt 0 ]] && start_coord "old-stale$stale_ms" "$OLD" --read-staleness-ms "$stale_ms"
fi
base="http://127.0.0.1:${ports[0]}"

lease=$($E lease grant 3600 | awk '{print $2}')
for ((i = 0; i < members; i++)); do
  $E put --lease="$lease" "$(printf '/wagma/agents/agent-%02d' "$i")" \
    "{\"address\":\"127.0.0.1:$((7000 + i))\"}" >/dev/null
done
curl -sf -XPOST -H 'Content-Type: application/json' \
  -d "{\"name\":\"bench\",\"workers\":$members,\"iterations\":100000}" "$base/v1/jobs" >/dev/null
for _ in $(seq 200); do
  curl -sf "$base/v1/jobs/bench" | grep -q '"state":"running"' && break
  sleep 0.1
done
curl -sf "$base/v1/jobs/bench/plan" >/dev/null || { echo "no plan for the job" >&2; exit 1; }
# One progress record per member, then PROGRESS_RATE updates a second in the background.
"$build/bench/coordinator/bench_progress_writer" "127.0.0.1:$cport" bench "$members" 0 0 agent-
"$build/bench/coordinator/bench_progress_writer" "127.0.0.1:$cport" bench "$members" "$rate" \
  3600 agent- &
pids+=($!)
sleep 1
body=$(curl -sf "$base/v1/jobs/bench" | wc -c)

run() { # label, url, wrk args...
  local label=$1 url=$2
  shift 2
  local load out rps p50 p99 non2xx
  load=$(cut -d' ' -f1 /proc/loadavg)
  out=$(wrk -t2 -c"$conns" -d"${dur}s" --latency "$@" "$url")
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  echo "$label|$rps|$p50|$p99|${non2xx:-0}|$load"
}
echo "cpu: $(nproc) cores; wrk -t2 -c$conns -d${dur}s (one row -c$wide); job of $members members (GET body $body bytes);"
echo "progress writes: $rate/s; coordinators: ${names[*]} (one etcd on loopback)"
echo
echo "| run | coordinator | request | req/s | p50 | p99 | non-2xx | load avg (1 min) | vs /healthz |"
echo "|---|---|---|---|---|---|---|---|---|"
for ((r = 1; r <= repeats; r++)); do
  for k in "${!names[@]}"; do
    u="http://127.0.0.1:${ports[k]}"
    rows=()
    rows+=("$(run "GET /healthz" "$u/healthz")")
    rows+=("$(run "GET /v1/jobs/bench" "$u/v1/jobs/bench")")
    rows+=("$(run "GET /v1/jobs/bench/plan" "$u/v1/jobs/bench/plan")")
    rows+=("$(run "GET /v1/jobs/bench/groups" "$u/v1/jobs/bench/groups")")
    rows+=("$(run "GET /v1/jobs/bench/events" "$u/v1/jobs/bench/events")")
    rows+=("$(run "mixed (job, plan, groups, events)" "$u" -s "$root/bench/coordinator/cached_reads.lua")")
    rows+=("$(conns=$wide run "GET /v1/jobs/bench, $wide connections" "$u/v1/jobs/bench")")
    baseline=$(echo "${rows[0]}" | cut -d'|' -f2)
    for row in "${rows[@]}"; do
      IFS='|' read -r label rps p50 p99 non load <<<"$row"
      ratio=$(python3 -c "print(f'{float($rps)/float($baseline):.2f}x')")
      echo "| $r | ${names[k]} | $label | $rps | $p50 | $p99 | $non | $load | $ratio |"
    done
  done
done
