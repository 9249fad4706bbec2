#!/usr/bin/python3
"""bench/pytorch/driver.py: the runs of bench/pytorch/run.sh (which starts etcd, the
coordinator and the agents, and calls this with their REST address).

For each scenario (none, pauses, slow) it trains cnn_bench.py with 4 processes under
torch.distributed DDP (gloo, 4 subprocesses on 127.0.0.1) and as a wagma program job of 4
agents under each algorithm, and reports the time from the first training step to the first
moment the mean over the members of the accuracy of their latest model snapshot (saved every
--snap-every steps, evaluated after the run on a fixed 2000-image test subset) reached the
target, with DDP's time over it (the speedup, > 1: faster than DDP). Then
the wrapper's cost per step: the script alone (one process) against a 1-agent wagma program
job. Prints markdown tables. Every process it starts it stops by PID.
"""
import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.realpath(__file__))
SCRIPT = os.path.join(HERE, "cnn_bench.py")
PYTHON = "/usr/bin/python3"

SCENARIOS = {
    "none": [],
    "pauses": ["--pause-prob", "0.1", "--pause-ms", "50"],
    "slow": ["--slow-member", "agent-0", "--slow-ms", "40"],
}
SCENARIO_TEXT = {
    "none": "no straggler",
    "pauses": "transient pauses (p 0.1 per step: one process sleeps 50 ms)",
    "slow": "one worker 40 ms slower per step (agent-0 / rank 0)",
}
# system -> (algorithm, global_sync) of the wagma job; None: DDP
SYSTEMS = {
    "ddp": None,
    "wagma-wait-avoiding": ("wagma", "wait-avoiding"),
    "wagma-barrier": ("wagma", "barrier"),
    "allreduce": ("allreduce", "barrier"),
    "local-sgd": ("local-sgd", "barrier"),
}

CHILDREN = []  # Popen objects this driver started
LIVE_JOB = [None]  # the wagma job running now (stopped through the API on exit)


def say(*a):
    print(f"[pytorch-bench {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def load_average():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


# ---- REST ------------------------------------------------------------------------------------
def http(api, method, path, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(api + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def stop_job(api, name):
    try:
        http(api, "DELETE", f"/v1/jobs/{name}")
    except Exception as e:  # the coordinator may be gone already
        say(f"DELETE {name}: {e}")


# ---- process bookkeeping -----------------------------------------------------------------------
def kill_children():
    for p in CHILDREN:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 5
    for p in CHILDREN:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    CHILDREN.clear()


def programs_of(run_dir):
    """PIDs of processes whose command line names run_dir (the programs of a wagma run: the
    agents launch them, this only waits for them to be gone)."""
    pids = []
    needle = run_dir.encode()
    for c in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(c, "rb") as f:
                if needle in f.read():
                    pids.append(int(c.split("/")[2]))
        except OSError:
            pass
    return pids


# ---- results -----------------------------------------------------------------------------------
def records(run_dir):
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass  # a line being written
    return out


class Evaluator:
    """Evaluates the members' snapshots after a run (the training processes are gone by then,
    so this costs the runs nothing): the example's evaluate() on the first 2000 test images.
    Identical snapshots (DDP's ranks, allreduce's members) are evaluated once."""

    def __init__(self, data_dir, samples=2000, threads=2):
        import torch
        sys.path.insert(0, HERE)
        sys.dont_write_bytecode = True
        import cnn_bench
        torch.set_num_threads(threads)
        self.torch = torch
        self.ex = cnn_bench.example_definitions()
        x, y = self.ex["load"](data_dir, "t10k")
        self.x, self.y = x[:samples], y[:samples]
        self.net = self.ex["Net"]()
        self.cache = {}
        self.evaluated = 0

    def __call__(self, run_dir, snap):
        """The accuracy of one snapshot (None: unreadable, a member killed while writing)."""
        import hashlib
        try:
            state = self.torch.load(os.path.join(run_dir, snap["file"]))
        except Exception:
            return None
        h = hashlib.sha1()
        for k in sorted(state):
            h.update(k.encode())
            h.update(state[k].numpy().tobytes())
        key = h.hexdigest()
        if key not in self.cache:
            self.net.load_state_dict(state)
            self.cache[key] = self.ex["evaluate"](self.net, self.x, self.y)[1]
            self.evaluated += 1
        return self.cache[key]


def analyse(run_dir, members, target, evaluate=None):
    """Time to target: t0 = the earliest first step of the members; the target is reached at
    the first snapshot (in time) after which every member has one and the mean of the
    accuracies of their latest ones is >= target. Snapshots after that one are not evaluated
    (every one is when the target is not reached: "best" is the best such mean)."""
    recs = records(run_dir)
    starts = [r["t"] for r in recs if r["ev"] == "start"]
    res = {"t0": min(starts) if starts else None, "reached": None, "best": None,
           "steps_at": None, "steps": None, "step_ms": None, "evals": []}
    latest = {}
    for snap in sorted((r for r in recs if r["ev"] == "snap"), key=lambda r: r["t"]):
        if evaluate is None:
            break
        acc = evaluate(run_dir, snap)
        if acc is None:
            continue
        res["evals"].append(dict(snap, acc=acc))
        latest[snap["member"]] = (acc, snap["step"])
        if len(latest) < members:
            continue
        mean = statistics.mean(a for a, _ in latest.values())
        res["best"] = mean if res["best"] is None else max(res["best"], mean)
        if mean >= target:
            res["reached"] = snap["t"]
            res["steps_at"] = statistics.mean(s for _, s in latest.values())
            break
    # steps done: the end record's count, else (a member killed) its last snapshot's step
    done = {}
    for r in recs:
        if r["ev"] == "snap" and r["member"] not in done:
            done[r["member"]] = ("snap", r["step"])
        elif r["ev"] == "snap" and done[r["member"]][0] == "snap":
            done[r["member"]] = ("snap", max(done[r["member"]][1], r["step"]))
        elif r["ev"] == "end":
            done[r["member"]] = ("end", r["steps"])
    if done:
        res["steps"] = statistics.mean(n for _, n in done.values())
        res["steps_lower_bound"] = any(k == "snap" for k, _ in done.values())
    ends = [r for r in recs if r["ev"] == "end"]
    ms = [r["step_ms"] for r in ends if r.get("step_ms") is not None]
    res["step_ms"] = statistics.mean(ms) if ms else None
    if evaluate is not None:
        with open(os.path.join(run_dir, "evals.json"), "w") as f:
            json.dump(res["evals"], f)
        for path in glob.glob(os.path.join(run_dir, "*.pt")):
            os.unlink(path)
    return res


# ---- one run -------------------------------------------------------------------------------------
def run_ddp(a, run_dir, extra, iterations, world=4, max_seconds=None):
    os.makedirs(run_dir)
    store = os.path.join(run_dir, "store")
    env = dict(os.environ, WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [PYTHON, SCRIPT, "--mode", "ddp" if world > 1 else "single", "--store", store,
           "--out", run_dir, "--iterations", str(iterations),
           "--max-seconds", str(a.max_seconds if max_seconds is None else max_seconds)] + extra
    launch = time.time()
    procs = []
    for rank in range(world):
        log = open(os.path.join(run_dir, f"rank{rank}.log"), "w")
        p = subprocess.Popen(cmd, env=dict(env, RANK=str(rank)), stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        procs.append(p)
        CHILDREN.append(p)
    deadline = launch + a.max_seconds + a.grace
    failed = None
    for rank, p in enumerate(procs):
        try:
            rc = p.wait(max(1, deadline - time.time()))
            if rc != 0 and failed is None:
                failed = f"rank {rank} exited with status {rc}"
        except subprocess.TimeoutExpired:
            failed = failed or "timed out"
    kill_children()
    return launch, failed


def run_wagma(a, run_dir, extra, name, algorithm, global_sync, workers, iterations,
              max_seconds):
    os.makedirs(run_dir)
    spec = {"name": name,
            "program": {"name": a.program, "args": ["--mode", "wagma", "--out", run_dir] + extra,
                        "max_restarts": 0},
            "algorithm": algorithm, "workers": workers, "group_size": 2,
            "staleness_bound": a.staleness_bound, "global_sync": global_sync,
            "batch_size": a.batch_size, "iterations": iterations, "seed": a.seed}
    launch = time.time()
    code, body = http(a.api, "POST", "/v1/jobs", spec)
    if code not in (200, 201):
        return launch, f"POST /v1/jobs: {code} {body}"
    LIVE_JOB[0] = name
    deadline = launch + max_seconds + a.grace
    failed, stopped, next_get = None, False, 0.0
    while True:
        now = time.time()
        if not stopped:  # the time cap
            r = analyse(run_dir, workers, a.target)
            if r["t0"] and now - r["t0"] > max_seconds:
                stop_job(a.api, name)
                stopped = True
        if now >= deadline and not stopped:
            stop_job(a.api, name)
            stopped = True
            failed = "timed out"
        if now >= next_get:
            next_get = now + 1.0
            code, job = http(a.api, "GET", f"/v1/jobs/{name}")
            state = job.get("status", {}).get("state") if isinstance(job, dict) else None
            if state in ("succeeded", "failed", "stopped"):
                if state == "failed":
                    failed = f"job failed: {job['status'].get('reason', '?')}"
                break
        if now >= deadline + 30:
            failed = failed or "the job did not end"
            break
        time.sleep(0.2)
    LIVE_JOB[0] = None
    # the agents stop the programs; wait until they are gone before the next run
    end = time.time() + 30
    while programs_of(run_dir) and time.time() < end:
        time.sleep(0.2)
    if programs_of(run_dir):
        say(f"{name}: programs still running 30 s after the job ended")
    return launch, failed


# ---- the benchmark ---------------------------------------------------------------------------------
def common_args(a):
    return ["--batch-size", str(a.batch_size), "--lr", str(a.lr), "--momentum", str(a.momentum),
            "--seed", str(a.seed), "--snap-every", str(a.snap_every)]


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def time_to_accuracy(a, out):
    evaluator = Evaluator(a.data_dir)
    rows = []
    stamp = time.strftime("%H%M%S")
    for scen in a.scenarios:
        ddp_time = None
        for system in a.systems:
            run_dir = os.path.join(out, f"{scen}-{system}")
            extra = common_args(a) + SCENARIOS[scen]
            if SYSTEMS[system] is None:
                cap = a.max_seconds
                say(f"{scen} / {system}: start (cap {cap:.1f} s; load {load_average()})")
                launch, failed = run_ddp(a, run_dir, extra, a.iterations)
            else:
                # not reached within cap_factor x DDP's time: the speedup is below 1/cap_factor
                cap = a.max_seconds if ddp_time is None else \
                    min(a.max_seconds, max(a.min_cap, a.cap_factor * ddp_time))
                say(f"{scen} / {system}: start (cap {cap:.1f} s; load {load_average()})")
                alg, gs = SYSTEMS[system]
                launch, failed = run_wagma(a, run_dir, extra, f"pt-{stamp}-{scen}-{system}",
                                           alg, gs, 4, a.iterations, cap)
            before = evaluator.evaluated
            r = analyse(run_dir, 4, a.target, evaluator)
            unique = evaluator.evaluated - before
            evals = r["evals"]
            t = r["reached"] - r["t0"] if r["reached"] is not None else None
            if system == "ddp":
                ddp_time = t
            if t is not None:
                cell = f"{t:.1f}"
            else:
                cell = f"not reached in {cap:.0f} s (best {fmt(r['best'], 3)})"
            speed = f"{ddp_time / t:.2f}x" if t is not None and ddp_time is not None else "-"
            startup = r["t0"] - launch if r["t0"] else None
            note = f" ({failed})" if failed else ""
            per_it = 1000.0 * t / r["steps_at"] if t is not None and r["steps_at"] else None
            run = fmt(r["steps"], 0)
            if r.get("steps_lower_bound"):
                run = "≥ " + run
            rows.append((scen, system, cell + note, speed, fmt(r["steps_at"], 0), fmt(per_it),
                         run, fmt(startup)))
            say(f"{scen} / {system}: time to {a.target}: {cell}{note}, speedup {speed}, "
                f"start-up {fmt(startup)} s ({len(evals)} snapshots, {unique} not seen "
                "before)")
    lines = [f"| scenario | system | time to {a.target} (s) | speedup vs DDP | iterations at "
             "target | ms per iteration | steps computed | start-up (s) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def overhead(a, out):
    n = a.overhead_iterations
    extra = ["--batch-size", str(a.batch_size), "--lr", str(a.lr), "--momentum", str(a.momentum),
             "--seed", str(a.seed), "--snap-every", "0", "--warmup", "20"]
    progs = ["script alone"] + [f"wagma job, 1 agent, {alg}" for alg in a.overhead_algorithms]
    got = {p: [] for p in progs}
    stamp = time.strftime("%H%M%S")
    for rep in range(a.overhead_repeat):
        for i, prog in enumerate(progs):
            run_dir = os.path.join(out, f"overhead-{rep}-{i}")
            say(f"overhead: {prog} ({n} steps, repetition {rep + 1}; load {load_average()})")
            if i == 0:
                _, failed = run_ddp(a, run_dir, extra, n, world=1, max_seconds=0)
            else:
                alg = a.overhead_algorithms[i - 1]
                _, failed = run_wagma(a, run_dir, extra, f"pt-{stamp}-oh{rep}-{alg}", alg,
                                      "barrier", 1, n, a.max_seconds)
            r = analyse(run_dir, 1, 2.0)
            if failed or r.get("step_ms") is None:
                say(f"overhead: {prog}: no measurement ({failed})")
                continue
            got[prog].append(r["step_ms"])
            say(f"overhead: {prog}: {r['step_ms']:.3f} ms/step")
    base = min(got[progs[0]]) if got[progs[0]] else None
    lines = ["| program | ms/step (best of %d) | all repetitions | ratio to the script alone |"
             % a.overhead_repeat, "|---|---:|---|---:|"]
    for prog in progs:
        best = min(got[prog]) if got[prog] else None
        ratio = f"{best / base:.3f}" if best is not None and base else "-"
        lines.append(f"| {prog} | {fmt(best, 2)} | "
                     f"{', '.join(f'{x:.2f}' for x in got[prog]) or '-'} | {ratio} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--api", required=True)
    ap.add_argument("--program", default="cnn_bench")
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--snap-every", type=int, default=25,
                    help="the members' models are saved (and evaluated) every N steps")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--iterations", type=int, default=500, help="the cap of a run")
    ap.add_argument("--max-seconds", type=float, default=60,
                    help="the cap of a run, from its first step")
    ap.add_argument("--cap-factor", type=float, default=3.0,
                    help="a wagma run's time cap: this times DDP's time to the target...")
    ap.add_argument("--min-cap", type=float, default=15.0, help="...but at least this (s)")
    ap.add_argument("--grace", type=float, default=90,
                    help="start-up and shut-down allowance beyond --max-seconds")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--staleness-bound", type=int, default=8)
    ap.add_argument("--scenarios", default="none pauses slow")
    ap.add_argument("--systems", default=" ".join(SYSTEMS))
    ap.add_argument("--overhead-iterations", type=int, default=300, help="0: skip")
    ap.add_argument("--overhead-algorithms", default="wagma allreduce local-sgd")
    ap.add_argument("--overhead-repeat", type=int, default=2)
    a = ap.parse_args()
    a.scenarios = a.scenarios.split()
    a.systems = a.systems.split()
    a.overhead_algorithms = a.overhead_algorithms.split()
    for s in a.scenarios:
        if s not in SCENARIOS:
            sys.exit(f"unknown scenario {s} (none, pauses, slow)")
    for s in a.systems:
        if s not in SYSTEMS:
            sys.exit(f"unknown system {s} ({', '.join(SYSTEMS)})")
    if "ddp" in a.systems and a.systems[0] != "ddp":
        a.systems.remove("ddp")
        a.systems.insert(0, "ddp")

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    os.makedirs(a.out, exist_ok=True)
    t_start, load0 = time.time(), load_average()
    try:
        report = [f"target {a.target}: the mean over the members of the accuracy of their "
                  f"latest snapshot (saved every {a.snap_every} steps, evaluated after the run "
                  f"on the first 2000 test images); cap {a.iterations} iterations, or "
                  f"{a.max_seconds:g} s from the first step (a wagma run: {a.cap_factor:g} x "
                  f"DDP's time to the target, at least {a.min_cap:g} s); batch {a.batch_size} per process, SGD lr {a.lr} momentum {a.momentum}, "
                  f"seed {a.seed}; wagma jobs: 4 workers, group_size 2, staleness_bound "
                  f"{a.staleness_bound}", ""]
        if a.scenarios and a.systems:
            report += [f"- {s}: {SCENARIO_TEXT[s]}" for s in a.scenarios] + [""]
            report += time_to_accuracy(a, a.out) + [""]
        if a.overhead_iterations > 0:
            report += [f"wrapper cost: {a.overhead_iterations} steps, mean time per step after "
                       "20 warm-up steps, no snapshots, no straggler", ""]
            report += overhead(a, a.out) + [""]
        report.append(f"load average {load0} at the start, {load_average()} at the end; "
                      f"{time.time() - t_start:.0f} s in all")
    finally:
        kill_children()
        if LIVE_JOB[0]:
            stop_job(a.api, LIVE_JOB[0])
    text = "\n".join(report) + "\n"
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
