#!/usr/bin/python3
"""Baseline for bench/train: PyTorch CPU training throughput of the same models.

Same work per step as bench_train: draw a minibatch from a per-epoch shuffled training set
(already standardized floats in memory), forward, softmax cross-entropy, backward, SGD step
(lr 0.02, momentum 0.9). One intra-op and one inter-op thread. Prints, per model:
  torch <model> batch <B> threads 1 steps <N> samples/s <X> loss <first> -> <last>
        params <P> cpu_samples/s <Y>
Needs Debian's python3-torch (run with /usr/bin/python3)."""
import argparse
import gzip
import os
import time

import numpy as np
import torch
from torch import nn

FASHION = "/usr/share/datasets/fashion-mnist"


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndims = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims).reshape(dims)


def dataset(kind):
    img = os.path.join(FASHION, "train-images-idx3-ubyte.gz")
    if kind == "fashion" and os.path.exists(img):
        x = load_idx(img).astype(np.float32) / 255.0
        y = load_idx(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")).astype(np.int64)
        x = (x - x.mean()) / x.std()
        return "fashion", torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)
    g = torch.Generator().manual_seed(1)
    return ("synthetic", torch.randn(10000, 1, 28, 28, generator=g),
            torch.randint(0, 10, (10000,), generator=g))


def model(name):
    if name == "lenet5":
        return nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    if name == "softmax":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    raise SystemExit(f"unknown model {name}")


def run(name, x, y, batch, steps, warmup):
    torch.manual_seed(1)
    net = model(name)
    opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    perm, pos = torch.randperm(len(x)), 0
    first = last = 0.0
    t0 = c0 = 0.0
    for t in range(warmup + steps):
        if t == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        if pos + batch > len(perm):
            perm, pos = torch.randperm(len(x)), 0
        idx = perm[pos:pos + batch]
        pos += batch
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
        if t == 0:
            first = loss.item()
        last = loss.item() if t == warmup + steps - 1 else last
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    params = sum(p.numel() for p in net.parameters())
    print(f"torch {name} batch {batch} threads {torch.get_num_threads()} steps {steps} "
          f"samples/s {steps * batch / secs:.0f} loss {first:.3f} -> {last:.3f} params {params} "
          f"cpu_samples/s {steps * batch / cpu:.0f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--data", default="fashion")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    kind, x, y = dataset(a.data)
    print(f"torch {torch.__version__} data {kind} train {len(x)}", flush=True)
    for name in a.model or ["lenet5"]:
        run(name, x, y, a.batch, a.steps, a.warmup)


if __name__ == "__main__":
    main()
