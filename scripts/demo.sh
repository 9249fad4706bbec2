#!/usr/bin/env bash
# wagma demo: a private etcd, a coordinator and 4 CPU agents on 127.0.0.1, one Fashion-MNIST
# job (MLP, WAGMA-SGD) submitted through the REST API; shows progress and the group
# assignments while it trains and prints "final test accuracy: 0.XXXX".
#
# Everything it starts it stops BY PID (trap on EXIT) and its temp dir is removed.
# Knobs (environment): WAGMA_DEMO_SKIP_DEPS=1 (do not run scripts/deps.sh),
# WAGMA_DEMO_SKIP_BUILD=1, WAGMA_BUILD_DIR (default build), WAGMA_DEMO_MODEL (mlp | lenet5 |
# softmax), WAGMA_DEMO_ALGORITHM (wagma | allreduce | local-sgd), WAGMA_DEMO_ITERATIONS (1000),
# WAGMA_DEMO_DATASET (fashion-mnist | synthetic), WAGMA_DEMO_TIMEOUT (seconds, 900),
# WAGMA_DEMO_PROGRAM=pytorch (train the PyTorch example examples/pytorch/fmnist_cnn.py as a
# program launched by the agents, docs/programs.md, instead of the built-in model; needs
# python3-torch, which scripts/deps.sh installs; WAGMA_DEMO_ITERATIONS defaults to 300 then).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${WAGMA_BUILD_DIR:-$ROOT/build}"
MODEL="${WAGMA_DEMO_MODEL:-mlp}"
ALGORITHM="${WAGMA_DEMO_ALGORITHM:-wagma}"
PROGRAM="${WAGMA_DEMO_PROGRAM:-}"
case "$PROGRAM" in "" | pytorch) ;; *) echo "demo: WAGMA_DEMO_PROGRAM must be pytorch" >&2; exit 2 ;; esac
ITERATIONS="${WAGMA_DEMO_ITERATIONS:-$([ -n "$PROGRAM" ] && echo 300 || echo 1000)}"
DATASET="${WAGMA_DEMO_DATASET:-fashion-mnist}"
TIMEOUT="${WAGMA_DEMO_TIMEOUT:-900}"
AGENTS=4

say() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

PIDS=()
TMP=""
cleanup() {
  local rc=$?
  set +e
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 1 50); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  if [ -n "$TMP" ] && [ -d "$TMP" ]; then
    if [ "$rc" != 0 ]; then
      for f in "$TMP"/*.log; do echo "---- $(basename "$f") (last lines)"; tail -n 15 "$f"; done
    fi
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. dependencies and build ------------------------------------------------------------
if [ "${WAGMA_DEMO_SKIP_DEPS:-0}" != 1 ]; then
  say "checking dependencies (scripts/deps.sh)"
  "$ROOT/scripts/deps.sh"
fi
if [ "${WAGMA_DEMO_SKIP_BUILD:-0}" != 1 ]; then
  say "building into $BUILD"
  cmake -S "$ROOT" -B "$BUILD" >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target wagma-coordinator wagma-agent wagma_worker >/dev/null
fi
COORD="$BUILD/coordinator/wagma-coordinator"
AGENT="$BUILD/agent/wagma-agent"
[ -x "$COORD" ] && [ -x "$AGENT" ] || { echo "demo: binaries missing in $BUILD" >&2; exit 1; }

# ---- 2. free ports, temp dir ----------------------------------------------------------------
TMP="$(mktemp -d "${TMPDIR:-/tmp}/wagma-demo.XXXXXX")"
USED=" "
port_free() {
  case "$USED" in *" $1 "*) return 1 ;; esac
  ! (ss -Htan 2>/dev/null || true) | awk '{print $4}' | grep -Eq "[:.]$1\$"
}
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000)) # below the ephemeral range (32768+)
    if port_free "$p"; then USED="$USED$p "; echo "$p"; return 0; fi
  done
  echo "demo: no free port" >&2; return 1
}
ETCD_CLIENT=$(free_port); USED="$USED$ETCD_CLIENT "
ETCD_PEER=$(free_port); USED="$USED$ETCD_PEER "
REST=$(free_port); USED="$USED$REST "
AGENT_PORTS=()
for i in $(seq 0 $((AGENTS - 1))); do p=$(free_port); USED="$USED$p "; AGENT_PORTS+=("$p"); done

wait_http() { # url seconds
  local deadline=$((SECONDS + $2))
  until curl -fsS -m 2 "$1" >/dev/null 2>&1; do
    [ $SECONDS -ge $deadline ] && { echo "demo: $1 did not come up" >&2; return 1; }
    sleep 0.2
  done
}

# ---- 3. etcd, coordinator, agents -----------------------------------------------------------
say "starting etcd on 127.0.0.1:$ETCD_CLIENT (data in $TMP/etcd)"
etcd --name demo --data-dir "$TMP/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "demo=http://127.0.0.1:$ETCD_PEER" >"$TMP/etcd.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$ETCD_CLIENT/health" 30

say "starting wagma-coordinator on http://127.0.0.1:$REST"
"$COORD" --etcd "127.0.0.1:$ETCD_CLIENT" --listen "127.0.0.1:$REST" >"$TMP/coordinator.log" 2>&1 &
PIDS+=($!)
API="http://127.0.0.1:$REST"
wait_http "$API/healthz" 30

PROGRAM_ARGS=()
if [ -n "$PROGRAM" ]; then # the agents launch the example from a programs directory
  mkdir -p "$TMP/programs"
  ln -s "$ROOT/examples/pytorch/fmnist_cnn.py" "$TMP/programs/fmnist_cnn"
  PROGRAM_ARGS=(--programs "$TMP/programs" --program-env "PYTHONPATH=$ROOT/python"
                --program-env "WAGMA_LIBRARY=$BUILD/worker/libwagma.so")
fi
for i in $(seq 0 $((AGENTS - 1))); do
  "$AGENT" --etcd "127.0.0.1:$ETCD_CLIENT" --name "agent-$i" \
    --listen "127.0.0.1:${AGENT_PORTS[$i]}" --eval-samples 2000 "${PROGRAM_ARGS[@]}" \
    >"$TMP/agent-$i.log" 2>&1 &
  PIDS+=($!)
  say "started wagma-agent agent-$i (pid $!, collective on 127.0.0.1:${AGENT_PORTS[$i]})"
done

deadline=$((SECONDS + 30))
until [ "$(curl -fsS -m 5 "$API/v1/agents" | grep -o '"name"' | wc -l)" -ge $AGENTS ]; do
  [ $SECONDS -ge $deadline ] && { echo "demo: agents did not register" >&2; exit 1; }
  sleep 0.3
done
say "$AGENTS agents registered"

# ---- 4. the job -------------------------------------------------------------------------------
if [ -n "$PROGRAM" ]; then
  SPEC=$(cat <<EOF
{"name":"demo","program":{"name":"fmnist_cnn","args":["--lr","0.05","--momentum","0.9"]},
 "algorithm":"$ALGORITHM","workers":$AGENTS,"group_size":2,"staleness_bound":8,
 "global_sync":"barrier","batch_size":32,"iterations":$ITERATIONS,"seed":7}
EOF
  )
else
  SPEC=$(cat <<EOF
{"name":"demo","model":"$MODEL","dataset":"$DATASET","algorithm":"$ALGORITHM","workers":$AGENTS,
 "group_size":2,"staleness_bound":8,"global_sync":"barrier",
 "optimizer":{"type":"sgd","lr":0.05,"momentum":0.9},
 "batch_size":64,"iterations":$ITERATIONS,"eval_every":50,"seed":7}
EOF
  )
fi
say "POST /v1/jobs $(echo "$SPEC" | tr -d '\n')"
curl -fsS -m 10 -X POST -H 'Content-Type: application/json' -d "$SPEC" "$API/v1/jobs" >/dev/null

field() { grep -o "\"$1\":[^,}]*" | head -n 1 | cut -d: -f2- | tr -d '"'; }
mean_of() { grep -o "\"$1\":[0-9][0-9.eE+-]*" | cut -d: -f2 | awk '{s+=$1; n++} END {if (n) printf "%.4f", s/n; else print "-"}'; }

start=$SECONDS
state=pending
while :; do
  job=$(curl -fsS -m 5 "$API/v1/jobs/demo" || true)
  state=$(echo "$job" | grep -o '"state":"[a-z]*"' | head -n 1 | cut -d'"' -f4)
  epoch=$(echo "$job" | grep -o '"status":{[^}]*' | field epoch)
  iter=$(echo "$job" | grep -o '"status":{[^}]*' | field iteration)
  say "job demo: state ${state:-?}, epoch ${epoch:-?}, iteration ${iter:-?}/$ITERATIONS," \
    "loss $(echo "$job" | mean_of loss), accuracy $(echo "$job" | mean_of accuracy)" \
    "(mean over members)"
  if [ "$state" = running ]; then
    groups=$(curl -fsS -m 5 "$API/v1/jobs/demo/groups" 2>/dev/null || true)
    echo "           round $(echo "$groups" | field iteration) ($(echo "$groups" | field kind)," \
      "phase $(echo "$groups" | field phase)) groups:" \
      "$(echo "$groups" | grep -o '"members":\[[^]]*\]' | sed 's/"members"://; s/"//g' | tr '\n' ' ')"
  fi
  case "$state" in succeeded | failed | stopped) break ;; esac
  [ $((SECONDS - start)) -ge "$TIMEOUT" ] && { echo "demo: job did not finish in ${TIMEOUT}s" >&2; exit 1; }
  sleep 3
done

job=$(curl -fsS -m 5 "$API/v1/jobs/demo")
if [ "$state" != succeeded ]; then
  echo "demo: job $state: $(echo "$job" | grep -o '"reason":"[^"]*"')" >&2
  exit 1
fi
say "job succeeded in $((SECONDS - start)) s: $(echo "$job" | grep -o '"reason":"[^"]*"' | cut -d'"' -f4)"
echo "final test accuracy: $(echo "$job" | mean_of accuracy)"
