#!/usr/bin/python3
"""tta_torch.py — PyTorch's side of bench/run_tta.sh (time to accuracy).

    tta_torch.py --data DIR [--target 0.91] [--max-epochs 5] [--eval-every K] [--ranks 2]
                 [--threads 1] [--batch 64] [--lr 0.002] [--warmup-steps 100] [--seed 0]
    tta_torch.py watch --target A -- CMD...   (times a `plexus train` run, see below)
    tta_torch.py watch --target-loss L -- CMD...   (the same, to a loss: bench/run_tta_gpt.sh)

Trains the README demo's recipe in PyTorch DDP over gloo (R processes on
127.0.0.1): the zoo CNN (px_zoo_cnn(1, 28, 28, 32, 10): [conv 3x3 no bias -
BN - ReLU - maxpool 2] x 2 with 32 and 64 channels, Linear 3136-128, ReLU,
Dropout 0.25, Linear 128-10), PyTorch's default initialisation (as the zoo),
cross-entropy, Adam (lr 0.002, betas 0.9/0.999, eps 1e-8, no weight decay),
a linear warm-up of 100 steps then cosine to 0 over max_epochs epochs (the
formula of src/optim/schedule.c), batch 64 per rank, Fashion-MNIST
normalised with mean 0.2860 and std 0.3530 (plexus's defaults), and plexus's
data order policy: every epoch one shuffle of the 60,000 indices from
(seed, epoch), identical on every rank, rank r taking positions r, r+R, ...,
the tail padded by wrapping (DistributedSampler's rule, drop_last off), the
last batch of an epoch partial.  DDP broadcasts rank 0's batch-norm buffers
each forward (broadcast_buffers, as plexus's DDP does).

Evaluation on the 10,000 test images, split over the ranks as plexus does
(rank r takes r, r+R, ...; counts all-reduced), at the end of each epoch, or
every K steps with --eval-every K (plexus's --eval-every).  Training stops at
the first evaluation with accuracy >= target.  The clock starts when this
script starts (before the processes spawn, the data load and the model
build), as run_tta.sh's clock for plexus starts when plexus is launched; the
evaluations are inside the timed span on both sides.

Output, one line per evaluation and a final line:

    eval step 469 epoch 1 accuracy 0.8712 loss 0.3567 wall_s 21.43
    tta torch reached=1 accuracy=0.9103 steps=1876 epochs=4 wall_s=80.1 target=0.91

`watch` mode runs CMD (a plexus train command), stamps its "eval step ..."
lines with the wall time since launch, and stops it (SIGTERM to the process
it started) at the first one with accuracy >= target; it prints the same
lines with "tta plexus".  With --target-loss L instead (a language model,
whose eval lines carry a loss and no accuracy; lower is better), it stops
at the first one with loss <= L and prints

    eval step 20 epoch 1 loss 6.1234 wall_s 21.43
    tta plexus reached=1 loss=4.9876 steps=150 epochs=3 wall_s=118.2 target_loss=5.0

(bench/run_tta_gpt.sh; tta_gpt_torch.py prints the same for PyTorch).
"""
import argparse
import gzip
import math
import os
import re
import signal
import struct
import subprocess
import sys
import time

T0 = time.perf_counter()


def wall():
    return time.perf_counter() - T0


def watch(a, cmd):
    pat = re.compile(r"eval step (\d+) epoch (\d+) loss (-?(?:nan|inf)|[0-9.eE+-]+)(?: accuracy ([0-9.]+))?")
    by_loss = a.target_loss is not None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    best = None
    reached = False
    first = True
    for line in proc.stdout:
        m = pat.search(line)
        if first:
            print(f"ready (first line from plexus) wall_s {wall():.2f}", flush=True)
            first = False
        if not m or (not by_loss and m.group(4) is None):
            if a.verbose:
                sys.stdout.write("  | " + line)
            continue
        step, epoch, loss = int(m.group(1)), int(m.group(2)), float(m.group(3))
        t = wall()
        if by_loss:
            print(f"eval step {step} epoch {epoch} loss {loss:.4f} wall_s {t:.2f}", flush=True)
            best = (loss, step, epoch, t)
            if loss <= a.target_loss:
                reached = True
                proc.send_signal(signal.SIGTERM)
                break
            continue
        acc = float(m.group(4))
        print(f"eval step {step} epoch {epoch} accuracy {acc:.4f} loss {loss:.4f} wall_s {t:.2f}", flush=True)
        best = (acc, step, epoch, t)
        if acc >= a.target:
            reached = True
            proc.send_signal(signal.SIGTERM)
            break
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if best is None:
        print(f"tta plexus: no eval line from {' '.join(cmd)} (exit {proc.returncode})", file=sys.stderr)
        return 1
    value, step, epoch, t = best
    if by_loss:
        print(f"tta plexus reached={int(reached)} loss={value:.4f} steps={step} epochs={epoch} wall_s={t:.2f} "
              f"target_loss={a.target_loss}", flush=True)
    else:
        print(f"tta plexus reached={int(reached)} accuracy={value:.4f} steps={step} epochs={epoch} wall_s={t:.2f} "
              f"target={a.target}", flush=True)
    return 0


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return dims, data[4 + 4 * ndim:]


def load(torch, d, split, mean, std):
    prefix = "train" if split == "train" else "t10k"

    def find(kind):
        for name in (f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte", ):
            for ext in (".gz", ""):
                p = os.path.join(d, name + ext)
                if os.path.exists(p):
                    return p
        raise SystemExit(f"tta_torch: no {prefix} {kind} file in {d}")
    dims, raw = read_idx(find("images"))
    x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(dims[0], 1, dims[1], dims[2])
    x = (x.float() / 255.0 - mean) / std
    _, raw = read_idx(find("labels"))
    y = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    return x, y


def lr_at(a, step, total):
    if a.warmup_steps > 0 and step < a.warmup_steps:
        return (step + 1) / a.warmup_steps
    span = total - a.warmup_steps
    p = (step - a.warmup_steps) / span if span > 0 else 1.0
    p = min(max(p, 0.0), 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * p))  # a factor of base lr, min_lr 0


def train(rank, a, port, t0):
    # The clock of the launching process: a spawned worker imports this file
    # anew (resetting T0), and perf_counter is CLOCK_MONOTONIC, one clock for
    # all processes, so the start-up before the spawn counts too.
    global T0
    T0 = t0
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    torch.set_num_interop_threads(1)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ranks)
    R = a.ranks
    xtr, ytr = load(torch, a.data, "train", 0.2860, 0.3530)
    xte, yte = load(torch, a.data, "test", 0.2860, 0.3530)
    torch.manual_seed(a.seed)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))
    ddp = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
    torch.manual_seed(a.seed * 1000 + 17 + rank)  # dropout: each rank its own masks
    opt = torch.optim.Adam(ddp.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    n = xtr.shape[0]
    per_rank = (n + R - 1) // R
    per_epoch = (per_rank + a.batch - 1) // a.batch
    total = per_epoch * a.max_epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(a, s, total))
    loss_fn = nn.CrossEntropyLoss()
    te_idx = torch.arange(rank, xte.shape[0], R)
    if rank == 0:
        print(f"ready (processes, data, model) wall_s {wall():.2f}", flush=True)

    def evaluate():
        ddp.eval()
        correct = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for i in range(0, te_idx.numel(), a.batch):
                idx = te_idx[i:i + a.batch]
                out = model(xte[idx])
                correct[0] += float((out.argmax(1) == yte[idx]).sum())
                correct[1] += float(nn.functional.cross_entropy(out, yte[idx], reduction="sum"))
                correct[2] += idx.numel()
        dist.all_reduce(correct)
        ddp.train()
        return float(correct[0] / correct[2]), float(correct[1] / correct[2])

    step = 0
    reached = False
    acc = loss = 0.0
    epoch = 0
    for epoch in range(1, a.max_epochs + 1):
        g = torch.Generator()
        g.manual_seed(a.seed * 1000003 + epoch)
        order = torch.randperm(n, generator=g)
        order = torch.cat([order, order[:per_rank * R - n]])  # pad by wrapping
        mine = order[rank::R]
        for b in range(per_epoch):
            idx = mine[b * a.batch:(b + 1) * a.batch]
            opt.zero_grad(set_to_none=True)
            l_ = loss_fn(ddp(xtr[idx]), ytr[idx])
            l_.backward()
            opt.step()
            sched.step()
            step += 1
            if a.eval_every > 0 and step % a.eval_every == 0:
                acc, loss = evaluate()
                if rank == 0:
                    print(f"eval step {step} epoch {epoch} accuracy {acc:.4f} loss {loss:.4f} wall_s {wall():.2f}",
                          flush=True)
                if acc >= a.target:
                    reached = True
                    break
        if reached:
            break
        if a.eval_every == 0:
            acc, loss = evaluate()
            if rank == 0:
                print(f"eval step {step} epoch {epoch} accuracy {acc:.4f} loss {loss:.4f} wall_s {wall():.2f}",
                      flush=True)
            if acc >= a.target:
                reached = True
                break
    if rank == 0:
        print(f"tta torch reached={int(reached)} accuracy={acc:.4f} steps={step} epochs={epoch} "
              f"wall_s={wall():.2f} target={a.target}", flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown can hang after a peer left (bench_train_torch.py)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "watch":
        ap = argparse.ArgumentParser(prog="tta_torch.py watch")
        ap.add_argument("--target", type=float, default=0.91, help="stop at accuracy >= this")
        ap.add_argument("--target-loss", type=float, default=None,
                        help="stop at loss <= this instead (a language model: its eval lines have no accuracy)")
        ap.add_argument("--verbose", action="store_true")
        ap.add_argument("cmd", nargs=argparse.REMAINDER)
        a = ap.parse_args(sys.argv[2:])
        cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
        if not cmd:
            ap.error("watch needs a command after --")
        return watch(a, cmd)
    ap = argparse.ArgumentParser(description="Time to accuracy of the demo's recipe in PyTorch DDP (gloo).")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--target", type=float, default=0.91)
    ap.add_argument("--max-epochs", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every K steps (0: each epoch)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.ranks < 1 or a.threads < 1 or a.batch < 1 or a.max_epochs < 1 or a.eval_every < 0:
        ap.error("--ranks, --threads, --batch, --max-epochs must be >= 1 and --eval-every >= 0")
    spawn_ranks(train, a, T0)
    return 0


def spawn_ranks(fn, a, t0):
    """Runs fn(rank, a, port, t0) in a.ranks processes (fn joins the gloo group on
    127.0.0.1:port; t0 is the launching process's clock).  tta_gpt_torch.py uses it too."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # as bench_train_torch.py: no second BLAS pool spinning
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(fn, args=(a, port, t0), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    sys.exit(main())
