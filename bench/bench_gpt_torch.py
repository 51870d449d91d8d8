#!/usr/bin/python3
"""bench_gpt_torch.py — PyTorch's side of bench/bench_gpt.c.

    bench_gpt_torch.py [--threads T] [--ranks R] [--batch B] [--seconds S] [--warmup W]
                       [--vocab V] [--context T] [--layers L] [--heads H] [--embd C] [--blas-threads N]
                       [--zero 1]
    bench_gpt_torch.py --info

prints one line in the format of bench_gpt:

    torch gpt batch=8 threads=1 ranks=1 tokens_per_s=... gflops=... best_tokens_per_s=... steps=...
          seconds=... cpu_s=... loss=... params=... flops_per_token=...

The same GPT as plexus's zoo (tests/gpt2_torch.py: GPT-2's layers with
Hugging Face's layouts, causal softmax attention written with torch ops as
nanoGPT writes it for PyTorch 1.13, tanh GELU, the head tied to wte; dropout
0), the same shapes, random batches, cross-entropy, AdamW (lr 3e-4, weight
decay 0.1) and timing protocol as bench_gpt.c (see its header).

--ranks R > 1: DistributedDataParallel over R processes (gloo on
127.0.0.1), each with T threads and its own batch; rank 0 times two first
steps and broadcasts how many warm-up and timed steps all ranks run; cpu_s
sums all ranks.  --zero 1 (with --ranks R > 1): the optimizer is
torch.distributed.optim.ZeroRedundancyOptimizer over AdamW (ZeRO stage 1:
each rank keeps the state of 1/R of the parameters, steps them, and
broadcasts them), beside plexus's `bench_gpt --zero 1`.

Threads: as bench_train_torch.py, OPENBLAS_NUM_THREADS is set (default 1)
before torch loads, so PyTorch's own OpenMP pool of T threads does the
work and OpenBLAS's pthreads pool does not spin against it.
"""
import argparse
import json
import os
import sys
import time

N_BATCHES = 4
HERE = os.path.dirname(os.path.abspath(__file__))


def blas_info():
    import ctypes
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return "%s; kernels: %s" % (lib.openblas_get_config().decode(), lib.openblas_get_corename().decode())
    except (OSError, AttributeError):
        return "not OpenBLAS (or not found)"


def run(rank, a, port, out):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import gpt2_torch

    torch.set_num_interop_threads(1)
    torch.set_num_threads(a.threads)
    ddp = a.ranks > 1
    if ddp:
        import torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(42)
    model = gpt2_torch.GPT(a.vocab, a.context, a.layers, a.heads, a.embd)
    gpt2_torch.gpt2_init(model)
    params = sum(p.numel() for p in model.parameters())
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    model.train()
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-4,
                                      weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(7 + rank)
    xs = [torch.randint(0, a.vocab, (a.batch, a.context), generator=g) for _ in range(N_BATCHES)]
    ys = [torch.randint(0, a.vocab, (a.batch, a.context), generator=g) for _ in range(N_BATCHES)]
    last = [0.0]

    def step(k):
        opt.zero_grad()
        logits = model(xs[k])
        loss = F.cross_entropy(logits.view(-1, a.vocab), ys[k].view(-1))
        loss.backward()
        opt.step()
        last[0] = loss

    # Two steps, then rank 0 picks how many more warm-up and how many timed
    # steps everyone runs (DDP ranks must run the same steps).
    t0 = time.perf_counter()
    for k in range(2):
        step(k)
    per_step = (time.perf_counter() - t0) / 2
    plan = torch.tensor([int(a.warmup / per_step), max(3, int(a.seconds / per_step) + 1)])
    if ddp:
        torch.distributed.broadcast(plan, 0)
    for k in range(int(plan[0])):
        step(k % N_BATCHES)
    steps = plan[1]
    c0 = time.process_time()
    best = float("inf")
    t0 = time.perf_counter()
    for i in range(int(steps)):
        ts = time.perf_counter()
        step(i % N_BATCHES)
        best = min(best, time.perf_counter() - ts)
    elapsed = time.perf_counter() - t0
    cpu = torch.tensor([time.process_time() - c0], dtype=torch.float64)
    if ddp:
        torch.distributed.all_reduce(cpu)
    if rank == 0:
        out.update(elapsed=elapsed, best=best, cpu=float(cpu), steps=int(steps), loss=float(last[0]),
                   params=params, threads=torch.get_num_threads())
        if ddp:
            with open(out["path"], "w") as f:
                json.dump({k: v for k, v in out.items() if k != "path"}, f)
    if ddp:
        torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description="GPT training throughput of PyTorch (the reference for bench_gpt).")
    for name, default in (("threads", 1), ("ranks", 1), ("batch", 8), ("vocab", 8192), ("context", 128),
                          ("layers", 4), ("heads", 4), ("embd", 256), ("blas-threads", 1), ("zero", 0)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--info", action="store_true")
    a = ap.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.blas_threads)
    import torch
    if a.info:
        print("torch %s (%s); blas: %s; OPENBLAS_NUM_THREADS=%d" %
              (torch.__version__, torch.__file__, blas_info(), a.blas_threads))
        return 0
    if min(a.threads, a.ranks, a.batch) < 1 or a.seconds <= 0 or a.warmup < 0:
        ap.error("--threads, --ranks and --batch must be >= 1, --seconds > 0, --warmup >= 0")
    if a.zero not in (0, 1) or (a.zero and a.ranks < 2):
        ap.error("--zero: PyTorch's ZeroRedundancyOptimizer is stage 1 (--zero 1), over --ranks 2 or more")
    out = {}
    if a.ranks > 1:
        import socket
        import tempfile
        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.NamedTemporaryFile(prefix="bench_gpt_torch_", suffix=".txt", delete=False) as f:
            out["path"] = f.name
        mp.spawn(run, args=(a, port, out), nprocs=a.ranks, join=True)
        path = out["path"]
        with open(path) as f:
            out = json.load(f)
        os.unlink(path)
    else:
        run(0, a, 0, out)
    tokens = out["steps"] * a.batch * a.context * a.ranks
    fpt = 6.0 * out["params"] + 6.0 * a.layers * a.embd * a.context
    print(f"torch gpt batch={a.batch} threads={out['threads']} ranks={a.ranks} zero={a.zero} "
          f"tokens_per_s={tokens / out['elapsed']:.1f} gflops={tokens * fpt / out['elapsed'] * 1e-9:.2f} "
          f"best_tokens_per_s={a.batch * a.context * a.ranks / out['best']:.1f} steps={out['steps']} "
          f"seconds={out['elapsed']:.3f} cpu_s={out['cpu']:.3f} loss={out['loss']:.5g} params={out['params']} "
          f"flops_per_token={fpt:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
