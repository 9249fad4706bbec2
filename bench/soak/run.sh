#!/usr/bin/env bash
# bench/soak/run.sh — the long soak run (issue 9): the driver of the suite's test_soak
# (tests/integration/soak/soak.c) until 1,000 events. etcd, a coordinator pair and 6 agents
# train jobs back to back (softmax on synthetic data, 4 workers, min 2, 4000 iterations each;
# the first on a calm cluster is the accuracy baseline) while the driver injects SIGKILLs,
# SIGSTOP/SIGCONT, agent restarts, leaves, joins, etcd restarts and coordinator leader kills.
# It prints one line per event and job and a summary: events survived, worst stall (bound:
# max lease TTL + 1 s + 3 s slack), accuracy of each job against the calm one.
# Usage: bench/soak/run.sh [build dir] [driver flags...]   (default build-bench; e.g.
#        bench/soak/run.sh build-bench --events 1000 --seed 1). With --transport nccl the
#        agents average over the NCCL transport against the fake NCCL (wagma-agent-fakenccl).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
shift || true
# A build dir that exists keeps its configuration (the figures say which build they used).
[ -f "$build/CMakeCache.txt" ] ||
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DWAGMA_WITH_CUDA=OFF >/dev/null
agent=agent/wagma-agent
case " $* " in # --transport nccl: the agent built against the fake NCCL
*" --transport nccl "* | *" --transport=nccl "*) agent=tests/integration/agent/wagma-agent-fakenccl ;;
esac
cmake --build "$build" --target wagma_soak "$(basename "$agent")" wagma-coordinator \
  -j"$(nproc)" >/dev/null
export WAGMA_AGENT_BIN=$PWD/$build/$agent
export WAGMA_COORDINATOR_BIN=$PWD/$build/coordinator/wagma-coordinator
[ $# -gt 0 ] || set -- --events 1000 --seed 1
exec "$build/tests/integration/soak/wagma_soak" "$@"
