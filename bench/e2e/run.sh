#!/usr/bin/env bash
# bench/e2e/run.sh — time to a target test accuracy, end to end: a private etcd, a coordinator
# and 4 CPU wagma-agents on 127.0.0.1 train Fashion-MNIST (MLP) through the REST API, for
#   algorithms: wagma (global_sync barrier), wagma (wait-avoiding), allreduce (the baseline:
#               synchronous data-parallel SGD), local-sgd, adpsgd, asgd and dc-asgd (one
#               parameter-server shard, the 3 other agents workers; dc_lambda 0.04; the
#               shard runs plain SGD at lr 0.05: with momentum 0.9 both diverged here, as
#               momentum SGD does with delayed gradients, see bench/delay)
#   settings:   none (no straggler), transient (every agent pauses 40 ms with probability 0.1
#               per step), persistent (one agent computes 4x slower: --slow-factor 4),
#               absolute (one agent sleeps a fixed 40 ms every step: --sleep-prob 1
#               --sleep-ms 40; the same straggler for every algorithm)
# For each run it polls GET /v1/jobs/{id} every 0.5 s and records the mean over members of the
# last evaluation accuracy (2000 test samples, every 50 iterations). Reports the wall time from
# submission to the first poll at or above the target, the speedup over allreduce in the same
# setting, and the final accuracy (whole test set, after the last iteration).
#
# usage: bench/e2e/run.sh [--iterations N] [--target A] [--out DIR] [--settings "..."]
#                         [--algorithms "..."] [--build DIR] [--repeat R]
# With --repeat R every run is repeated R times (interleaved: each round runs every algorithm
# once) and the table shows medians. Writes DIR/results.md (the table),
# DIR/<setting>-<algorithm>.dat (the first repetition) and DIR/e2e.png (gnuplot).
# Stops everything it starts by PID; installs curl, etcd, gnuplot with scripts/deps.sh --bench.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${WAGMA_BUILD_DIR:-$ROOT/build}"
ITERATIONS=1500
TARGET=0.87
OUT="$ROOT/bench/e2e/out"
SETTINGS="none transient persistent absolute"
ALGORITHMS="wagma-barrier wagma-wait-avoiding allreduce local-sgd adpsgd asgd dc-asgd"
RUN_TIMEOUT=400
REPEAT=1
while [ $# -gt 0 ]; do
  case "$1" in
  --iterations) ITERATIONS="$2"; shift 2 ;;
  --target) TARGET="$2"; shift 2 ;;
  --out) OUT="$2"; shift 2 ;;
  --settings) SETTINGS="$2"; shift 2 ;;
  --algorithms) ALGORITHMS="$2"; shift 2 ;;
  --build) BUILD="$2"; shift 2 ;;
  --repeat) REPEAT="$2"; shift 2 ;;
  -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
  *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
"$ROOT/scripts/deps.sh" --bench
COORD="$BUILD/coordinator/wagma-coordinator"
AGENT="$BUILD/agent/wagma-agent"
[ -x "$COORD" ] && [ -x "$AGENT" ] || { echo "build wagma-coordinator and wagma-agent in $BUILD first" >&2; exit 1; }
mkdir -p "$OUT"

say() { printf '[e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

PIDS=()
TMP=""
stop_all() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  PIDS=()
  [ -n "$TMP" ] && rm -rf "$TMP"
  TMP=""
}
trap stop_all EXIT
trap 'exit 130' INT TERM

USED=" "
# free_port: sets PORT to a port nobody listens on and that this script did not hand out yet
# (not in a subshell: USED must remember it).
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000)) # below the ephemeral range (32768+)
    case "$USED" in *" $p "*) continue ;; esac
    if ! (ss -Htan 2>/dev/null || true) | awk '{print $4}' | grep -Eq "[:.]$p\$"; then
      USED="$USED$p "; PORT=$p; return 0
    fi
  done
  return 1
}
wait_http() {
  local deadline=$((SECONDS + $2))
  until curl -fsS -m 2 "$1" >/dev/null 2>&1; do
    [ $SECONDS -ge $deadline ] && { echo "$1 did not come up" >&2; return 1; }
    sleep 0.2
  done
}

# start_cluster SETTING: etcd + coordinator + 4 agents with the setting's straggler flags.
start_cluster() {
  TMP="$(mktemp -d "${TMPDIR:-/tmp}/wagma-e2e.XXXXXX")"
  local ec ep rest
  free_port; ec=$PORT; free_port; ep=$PORT; free_port; rest=$PORT
  etcd --name e2e --data-dir "$TMP/etcd" --listen-client-urls "http://127.0.0.1:$ec" \
    --advertise-client-urls "http://127.0.0.1:$ec" --listen-peer-urls "http://127.0.0.1:$ep" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ep" \
    --initial-cluster "e2e=http://127.0.0.1:$ep" >"$TMP/etcd.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$ec/health" 30
  "$COORD" --etcd "127.0.0.1:$ec" --listen "127.0.0.1:$rest" >"$TMP/coordinator.log" 2>&1 &
  PIDS+=($!)
  API="http://127.0.0.1:$rest"
  wait_http "$API/healthz" 30
  for i in 0 1 2 3; do
    local extra=()
    case "$1" in
    transient) extra=(--sleep-prob 0.1 --sleep-ms 40) ;;
    persistent) [ "$i" = 3 ] && extra=(--slow-factor 4) ;;
    absolute) [ "$i" = 3 ] && extra=(--sleep-prob 1 --sleep-ms 40) ;;
    esac
    free_port
    "$AGENT" --etcd "127.0.0.1:$ec" --name "agent-$i" --listen "127.0.0.1:$PORT" \
      --eval-samples 2000 --progress-interval 0.5 --linger 5 --collective-timeout 30 \
      "${extra[@]}" >"$TMP/agent-$i.log" 2>&1 &
    PIDS+=($!)
  done
  local deadline=$((SECONDS + 30))
  until [ "$(curl -fsS "$API/v1/agents" | grep -o '"name"' | wc -l)" -ge 4 ]; do
    [ $SECONDS -ge $deadline ] && { echo "agents did not register" >&2; return 1; }
    sleep 0.3
  done
}

mean_of() { grep -o "\"$1\":[0-9][0-9.eE+-]*" | cut -d: -f2 | awk '{s+=$1; n++} END {if (n) printf "%.4f", s/n}'; }

# run_job SETTING ALGORITHM REP -> prints "time_to_target final_accuracy wall_total state"
run_job() {
  local setting=$1 algo=$2 name="$1-$2-r$3" algorithm sync dat="$OUT/$1-$2.dat"
  [ "$3" = 1 ] || dat="$OUT/$1-$2-r$3.dat"
  case "$algo" in
  wagma-barrier) algorithm=wagma; sync=barrier ;;
  wagma-wait-avoiding) algorithm=wagma; sync=wait-avoiding ;;
  *) algorithm=$algo; sync=barrier ;;
  esac
  local momentum=0.9
  case "$algo" in asgd | dc-asgd) momentum=0 ;; esac
  local spec="{\"name\":\"$name\",\"model\":\"mlp\",\"dataset\":\"fashion-mnist\",\"algorithm\":\"$algorithm\",\"global_sync\":\"$sync\",\"workers\":4,\"group_size\":2,\"staleness_bound\":8,\"optimizer\":{\"type\":\"sgd\",\"lr\":0.05,\"momentum\":$momentum},\"batch_size\":64,\"iterations\":$ITERATIONS,\"eval_every\":50,\"seed\":7,\"ps_shards\":1}"
  local t0 tta="-" state="" job acc now
  t0=$(date +%s.%N)
  curl -fsS -X POST -H 'Content-Type: application/json' -d "$spec" "$API/v1/jobs" >/dev/null
  echo "# seconds mean_accuracy min_iteration ($name)" >"$dat"
  while :; do
    job=$(curl -fsS "$API/v1/jobs/$name" || true)
    now=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')
    state=$(echo "$job" | grep -o '"state":"[a-z]*"' | head -n 1 | cut -d'"' -f4 || true)
    acc=$(echo "$job" | mean_of accuracy || true)
    local it
    it=$(echo "$job" | grep -o '"iteration":[0-9]*' | tail -n +2 | cut -d: -f2 | sort -n | head -n 1 || true)
    if [ -n "$acc" ]; then
      echo "$now $acc ${it:-0}" >>"$dat"
      if [ "$tta" = "-" ] && awk -v a="$acc" -v t="$TARGET" 'BEGIN {exit !(a >= t)}'; then
        tta=$(printf '%.1f' "$now")
      fi
    fi
    case "$state" in succeeded | failed | stopped) break ;; esac
    if awk -v n="$now" -v m="$RUN_TIMEOUT" 'BEGIN {exit !(n >= m)}'; then
      curl -fsS -X DELETE "$API/v1/jobs/$name" >/dev/null || true
      state=timeout
      break
    fi
    sleep 0.5
  done
  local final="-"
  [ "$state" = succeeded ] && final=$(echo "$job" | mean_of accuracy || true)
  printf '%s %s %.1f %s\n' "$tta" "$final" "$now" "$state"
}

# median of numbers ("-" = not reached, counted as +infinity); "-" when most are "-".
median() {
  printf '%s\n' "$@" | sed 's/^-$/1e30/' | sort -g |
    awk '{v[NR] = $1} END {m = v[int((NR + 1) / 2)]; if (m + 0 >= 1e30) print "-"; else print m}'
}

RESULTS="$OUT/results.md"
{
  echo "Medians of $REPEAT run(s)."
  echo
  echo "| setting | algorithm | time to $TARGET (s) | speedup vs allreduce | final accuracy | wall for $ITERATIONS it (s) |"
  echo "|---|---|---|---|---|---|"
} >"$RESULTS"
for setting in $SETTINGS; do
  say "setting $setting: starting etcd, coordinator, 4 agents"
  start_cluster "$setting"
  declare -A TTA=() FIN=() WALL=()
  for rep in $(seq 1 "$REPEAT"); do
    for algo in $ALGORITHMS; do
      say "  $setting / $algo (#$rep): training $ITERATIONS iterations"
      read -r tta fin wall st < <(run_job "$setting" "$algo" "$rep")
      say "  $setting / $algo (#$rep): time to $TARGET ${tta}s, final accuracy $fin, ${wall}s ($st)"
      TTA[$algo]="${TTA[$algo]:-} $tta"; FIN[$algo]="${FIN[$algo]:-} $fin"; WALL[$algo]="${WALL[$algo]:-} $wall"
      sleep 1
    done
  done
  for algo in $ALGORITHMS; do
    TTA[$algo]=$(median ${TTA[$algo]}); FIN[$algo]=$(median ${FIN[$algo]}); WALL[$algo]=$(median ${WALL[$algo]})
  done
  for algo in $ALGORITHMS; do
    ratio="-"
    if [ "${TTA[$algo]}" != "-" ] && [ "${TTA[allreduce]:--}" != "-" ]; then
      ratio=$(awk -v b="${TTA[allreduce]}" -v x="${TTA[$algo]}" 'BEGIN {printf "%.2fx", b / x}')
    fi
    echo "| $setting | $algo | ${TTA[$algo]} | $ratio | ${FIN[$algo]} | ${WALL[$algo]} |" >>"$RESULTS"
  done
  unset TTA FIN WALL
  stop_all
done
cat "$RESULTS"

if command -v gnuplot >/dev/null; then
  n=$(echo $SETTINGS | wc -w)
  {
    echo "set terminal pngcairo size $((480 * n)),420 noenhanced font ',10'"
    echo "set output '$OUT/e2e.png'"
    echo "set multiplot layout 1,$n title 'Fashion-MNIST MLP, 4 CPU agents: mean test accuracy (2000 samples) vs wall time'"
    echo "set xlabel 'seconds since submission'; set ylabel 'accuracy'; set yrange [0.75:0.91]; set grid"
    echo "set key bottom right"
    for setting in $SETTINGS; do
      echo "set title '$setting'"
      echo "set arrow from graph 0, first $TARGET to graph 1, first $TARGET nohead dt 2 lc rgb 'gray'"
      plot="plot "
      for algo in $ALGORITHMS; do
        plot="$plot '$OUT/$setting-$algo.dat' using 1:2 with lines lw 2 title '$algo',"
      done
      echo "${plot%,}"
      echo "unset arrow"
    done
    echo "unset multiplot"
  } | gnuplot && say "plot: $OUT/e2e.png"
fi
