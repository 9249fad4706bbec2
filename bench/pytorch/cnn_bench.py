#!/usr/bin/python3
"""bench/pytorch/cnn_bench.py: the training script of bench/pytorch/run.sh, three ways.

The CNN, the data loading and the evaluation are those of examples/pytorch/fmnist_cnn.py, read
from that file (its definitions of load_idx, load, Net and evaluate, without its wagma import),
so the benchmark trains exactly the example's model. SGD with momentum, random batches drawn
with replacement, one torch thread, as the example.

  --mode single   the script alone: one process, no wagma, no torch.distributed
  --mode ddp      torch.distributed DistributedDataParallel, gloo, RANK / WORLD_SIZE from the
                  environment, rendezvous through a FileStore (--store): torch 1.13's TCPStore
                  listens on every interface, and the benchmark binds only 127.0.0.1 (gloo's
                  own sockets: GLOO_SOCKET_IFNAME=lo, set by the driver)
  --mode wagma    a wagma program (the agent launches it; wagma.torch as in the example): the
                  job's algorithm, iterations and seed are the spec's

Rank r of DDP (and the single process, as agent-0) seeds its batch generator as wagma.torch's
wrap seeds agent-r of rank r, so DDP and a wagma allreduce job draw the same batches.

Stragglers, the same in every mode (the member's name is $WAGMA_AGENT under wagma, agent-<rank>
otherwise):
  --pause-prob P --pause-ms M   at each step s, with probability P (drawn from --pause-seed and
                                s, so every process draws the same), one member (drawn the same
                                way among the ranks) sleeps M ms before its step
  --slow-member NAME --slow-ms M  that member sleeps M ms before every step

Every --snap-every steps (from its first step on, before the step) the member saves its model
(the state_dict, 40 KB) to --out/<member>-<step>.pt: the driver evaluates the snapshots after
the run, so evaluating costs the training nothing. It writes JSON lines to
--out/<member>.jsonl: {"ev":"start"} at its first step, {"ev":"snap","step","file"},
{"ev":"end","steps","step_ms"} (step_ms: mean wall time per step after --warmup steps; with
--snap-every 0 nothing but training is in the window); "t" is time.time(). DDP ranks stop
together at the first snapshot --max-seconds after their first step, or after --iterations
(a wagma job: the spec's iterations, or the driver stops it through the REST API).
"""
import argparse
import ast
import gzip
import hashlib
import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.realpath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "pytorch", "fmnist_cnn.py")


def example_definitions(path=EXAMPLE):
    """load_idx, load, Net, evaluate from the example (the file's top-level definitions only:
    its `import wagma.torch` is not run)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    wanted = {"load_idx", "load", "Net", "evaluate"}
    body = [n for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in wanted]
    missing = wanted - {n.name for n in body}
    if missing:
        sys.exit(f"cnn_bench: {path} has no {sorted(missing)}")
    ns = {"gzip": gzip, "os": os, "np": np, "torch": torch, "nn": nn, "F": F}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    return ns


class Log:
    def __init__(self, out, member):
        self.member = member
        self.f = None
        if out:
            os.makedirs(out, exist_ok=True)
            self.f = open(os.path.join(out, f"{member}.jsonl"), "a", encoding="utf-8")

    def __call__(self, ev, **kw):
        if self.f:
            self.f.write(json.dumps(dict(ev=ev, t=time.time(), member=self.member, **kw)) + "\n")
            self.f.flush()


def straggle(args, step, rank, size, member):
    """The injected delays of this member at this step (seconds slept)."""
    slept = 0.0
    if args.slow_ms > 0 and member == args.slow_member:
        slept += args.slow_ms / 1000.0
    if args.pause_prob > 0 and size > 0:
        r = random.Random(f"{args.pause_seed}/{step}")
        if r.random() < args.pause_prob and r.randrange(size) == rank:
            slept += args.pause_ms / 1000.0
    if slept:
        time.sleep(slept)
    return slept


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("single", "ddp", "wagma"), required=True)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--iterations", type=int, default=1000, help="single / ddp: the cap")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--snap-every", type=int, default=50, help="0: never (needs --out)")
    ap.add_argument("--eval-samples", type=int, default=2000, help="the final evaluation")
    ap.add_argument("--max-seconds", type=float, default=0.0,
                    help="ddp: stop at the first snapshot this long after the first step "
                    "(0: no cap)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--pause-prob", type=float, default=0.0)
    ap.add_argument("--pause-ms", type=float, default=50.0)
    ap.add_argument("--pause-seed", type=int, default=7)
    ap.add_argument("--slow-member", default="")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--store", default="", help="ddp: the FileStore's file")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)

    ex = example_definitions()
    x_train, y_train = ex["load"](args.data_dir, "train")
    x_test, y_test = ex["load"](args.data_dir, "t10k")
    x_eval, y_eval = x_test[:args.eval_samples], y_test[:args.eval_samples]

    def evaluate(model):
        return ex["evaluate"](model, x_eval, y_eval)

    job = None
    dist = None
    if args.mode == "wagma":
        import wagma.torch
        job = wagma.torch.init(samples=len(x_train), batch_size=args.batch_size)
        member = os.environ.get("WAGMA_AGENT", "wagma")
    elif args.mode == "ddp":
        import datetime
        import torch.distributed as dist
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.FileStore(args.store, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        member = f"agent-{rank}"
    else:
        rank, world, member = 0, 1, "agent-0"
    log = Log(args.out, member)

    torch.manual_seed(args.seed)  # every process builds the same initial model
    net = ex["Net"]()
    model = net
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
    if job is not None:
        opt = job.wrap(opt, net)  # reseeds torch per member
        steps = job.loop()
    else:
        if dist is not None:
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(net)
        # each process its own batches: the generator seeded as wagma.torch's wrap seeds a
        # member (agent-<rank> of rank <rank>, iteration 0), so that rank r of DDP draws the
        # same batches as agent-r of a wagma job
        key = f"{args.seed}/{member}/0/{rank}".encode()
        torch.manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        steps = iter(range(args.iterations))

    def where():
        if job is not None:
            st = job.status()
            return st.rank, st.size
        return rank, world

    done = 0
    if job is not None:
        def on_sigterm(_signum, _frame):
            # when the driver stops the job, the agent sends stop and SIGTERM at once: the
            # record of the steps done first
            log("end", steps=done, step_ms=None, stopped=True, signal="SIGTERM")
            os._exit(0)

        signal.signal(signal.SIGTERM, on_sigterm)
    last_snap = None
    t_warm = None
    t_start = None
    stop = False
    for step in steps:
        if t_start is None:
            t_start = time.time()
            log("start", step=step)
        if args.out and args.snap_every > 0 and (last_snap is None
                                    or step // args.snap_every > last_snap // args.snap_every):
            last_snap = step
            snap = os.path.join(args.out, f"{member}-{step:07d}.pt")
            torch.save({k: v.detach().clone() for k, v in net.state_dict().items()}, snap)
            log("snap", step=step, file=os.path.basename(snap))
            if dist is not None and args.max_seconds > 0:  # the ranks stop together
                flag = torch.tensor([1.0 if time.time() - t_start > args.max_seconds else 0.0])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                if flag.item() > 0:
                    stop = True
                    break
        if done == args.warmup:
            t_warm = time.time()
        if args.pause_prob > 0 or args.slow_ms > 0:
            r, size = where()
            straggle(args, step, r, size, member)
        idx = torch.randint(len(x_train), (args.batch_size,))
        opt.zero_grad()
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        loss.backward()
        opt.step()
        if job is not None:
            job.report(loss)
        done += 1
    t_end = time.time()
    step_ms = 1000.0 * (t_end - t_warm) / (done - args.warmup) if t_warm and done > args.warmup \
        else None
    log("end", steps=done, step_ms=step_ms, stopped=stop)
    print(f"{member}: {done} steps, {step_ms if step_ms is None else round(step_ms, 3)} ms/step "
          "after the warm-up", flush=True)
    if job is not None:
        job.finish(evaluate)  # raises Stopped (exit 0) when the driver stopped the job
    elif dist is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
