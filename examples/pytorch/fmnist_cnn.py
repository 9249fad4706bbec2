#!/usr/bin/python3
"""A small CNN on Fashion-MNIST (the IDX files of Debian's dataset-fashion-mnist), trained as a
wagma program: the agent launches it for a job that names it ({"program": {"name": "fmnist_cnn",
"args": ["--lr", "0.05"]}}); the job's algorithm, iterations and seed are the spec's."""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import wagma.torch


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(data_dir, split):
    x = load_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    y = load_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).sub_(0.2860).div_(0.3530)
    return x.unsqueeze(1), torch.from_numpy(y.astype(np.int64))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(x[i:i + 1000]) for i in range(0, len(x), 1000)])
    model.train()
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "t10k")

    job = wagma.torch.init(samples=len(x_train), batch_size=args.batch_size)
    torch.manual_seed(args.seed)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    opt = job.wrap(opt, model)
    t0 = time.time()
    for step in job.loop():
        idx = torch.randint(len(x_train), (args.batch_size,))
        opt.zero_grad()
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        loss.backward()
        opt.step()
        job.report(loss)
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    loss, accuracy = job.finish(lambda model: evaluate(model, x_test, y_test))
    print(f"test loss {loss:.4f} accuracy {accuracy:.4f} ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
