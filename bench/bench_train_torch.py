#!/usr/bin/python3
"""bench_train_torch.py — PyTorch's side of bench/bench_train.c.

    bench_train_torch.py --model mlp|cnn|zoo_cnn|resnet_small|resnet18 --batch B --threads T
                         [--seconds S] [--warmup W] [--blas-threads N] [--ranks N]
    bench_train_torch.py --info     (torch version and the BLAS it calls, for the record)

prints one line in the format of bench_train:

    torch mlp batch=16 threads=1 samples_per_s=12345.6 steps=... seconds=... cpu_s=... loss=...

Same models, losses, optimizers, data shapes and timing loop as the C
benchmark (see its header); every timed iteration is a full training step:
zero_grad, forward, loss, backward, optimizer step.  Run it with Debian's
python3 (python3-torch); bench/run.sh runs both side by side.

--ranks N (bench/run_comm.sh's scaling table): N processes (started here)
train the model wrapped in DistributedDataParallel over gloo, each on its
own batch of B with T threads, as bench_train under mpiexec; samples_per_s
counts every rank's samples, and the line ends "ranks=N backend=gloo".

Threads: torch.set_num_threads(T) sizes PyTorch's OpenMP pool.  Debian's
PyTorch calls OpenBLAS's pthreads build for its GEMMs, which keeps a pool of
its own, sized from OPENBLAS_NUM_THREADS when the library loads (default:
every core).  With both pools, "T threads" would be 2T-1 busy threads on T
cores, spinning against each other: measured here at T=2, PyTorch ran the
MLP at batch 16 and the CNN 2-3x slower than with its BLAS single-threaded
(and the MLP at batch 1024 within +-10%).  So the script sets
OPENBLAS_NUM_THREADS=1 (--blas-threads) before it imports torch: each GEMM
runs on the calling thread, PyTorch uses exactly T threads, and the
comparison is with PyTorch's faster configuration.  OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE are left as the environment has them.
"""
import argparse
import ctypes
import os
import sys
import time

N_BATCHES = 4


def blas_info():
    """OpenBLAS's build line and chosen kernels, as plexus's px_blas_info."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")  # the copy torch already loaded
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return "%s; kernels: %s" % (lib.openblas_get_config().decode(), lib.openblas_get_corename().decode())
    except (OSError, AttributeError):
        return "not OpenBLAS (or not found)"


# Input (C, H, W) and classes of the image models, as bench_train.c.
INPUTS = {"cnn": (1, 28, 28, 10), "zoo_cnn": (1, 28, 28, 10), "resnet_small": (3, 32, 32, 10),
          "resnet18": (3, 224, 224, 1000)}


def build(torch, nn, model):
    if model == "zoo_cnn":  # px_zoo_cnn(1, 28, 28, 32, 10)
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))
    if model == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=1000)
    if model == "resnet_small":  # ResNet-20 with 1x1 projection shortcuts, px_zoo_resnet_small(3, 10, 3, 16)
        from torchvision.models.resnet import BasicBlock, conv1x1

        def stage(cin, cout, stride):
            down = nn.Sequential(conv1x1(cin, cout, stride), nn.BatchNorm2d(cout)) if stride != 1 or cin != cout \
                else None
            return nn.Sequential(BasicBlock(cin, cout, stride, down), BasicBlock(cout, cout), BasicBlock(cout, cout))
        return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                             stage(16, 16, 1), stage(16, 32, 2), stage(32, 64, 2),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    if model == "mlp":
        return nn.Sequential(
            nn.Linear(1, 256), nn.Tanh(),
            nn.Linear(256, 512), nn.Tanh(),
            nn.Linear(512, 256), nn.Tanh(),
            nn.Linear(256, 1))
    # (B,1,28,28) -> (B,8,28,28) -> pool (B,8,14,14) -> (B,16,14,14) -> pool (B,16,7,7) -> (B,784) -> (B,10)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10))


def main():
    ap = argparse.ArgumentParser(description="Training throughput of PyTorch (the reference for bench_train).")
    ap.add_argument("--model", choices=["mlp", "cnn", "zoo_cnn", "resnet_small", "resnet18"], default="mlp")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="OPENBLAS_NUM_THREADS for PyTorch's BLAS (default 1; see the header)")
    ap.add_argument("--ranks", type=int, default=1, help="data-parallel processes (DDP over gloo)")
    ap.add_argument("--info", action="store_true", help="print torch's version and BLAS, then exit")
    a = ap.parse_args()
    if a.batch < 1 or a.threads < 1 or a.blas_threads < 1 or a.ranks < 1 or a.seconds <= 0 or a.warmup < 0:
        ap.error("--batch, --threads, --blas-threads and --ranks must be >= 1, --seconds > 0, --warmup >= 0")

    os.environ["OPENBLAS_NUM_THREADS"] = str(a.blas_threads)
    import torch

    if a.info:
        print("torch %s (%s); blas: %s; OPENBLAS_NUM_THREADS=%d" %
              (torch.__version__, torch.__file__, blas_info(), a.blas_threads))
        return 0
    if a.ranks == 1:
        return train(0, a, 0)
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(train, args=(a, port), nprocs=a.ranks, join=True)
    return 0


def train(rank, a, port):
    import torch
    import torch.nn as nn
    dist = None
    if a.ranks > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ranks)

    # Before any parallel work, or PyTorch ignores the interop setting.
    torch.set_num_interop_threads(1)
    torch.set_num_threads(a.threads)
    torch.manual_seed(42)

    B = a.batch
    model = build(torch, nn, a.model)
    model.train()
    if dist:
        model = torch.nn.parallel.DistributedDataParallel(model)
        torch.manual_seed(1000 + rank)  # each rank its own samples
    if a.model == "mlp":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = nn.MSELoss()
        xs = [torch.rand(B, 1) * 2 - 1 for _ in range(N_BATCHES)]
        ys = [x * x for x in xs]
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        c, h, w, classes = INPUTS[a.model]
        xs = [torch.randn(B, c, h, w) for _ in range(N_BATCHES)]
        ys = [torch.randint(0, classes, (B,)) for _ in range(N_BATCHES)]

    last = [0.0]

    def step(k):
        opt.zero_grad()
        loss = loss_fn(model(xs[k]), ys[k])
        loss.backward()
        opt.step()
        last[0] = loss

    def slowest(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])

    def run_for(budget, min_steps):
        n = 0
        c0 = time.process_time()
        t0 = t = time.perf_counter()
        if dist:
            # Ranks must take the same number of steps (bench_train does the same).
            for n in range(min_steps):
                step(n % N_BATCHES)
            n = min_steps
            total = int(budget / slowest((time.perf_counter() - t0) / n))
            while n < total:
                step(n % N_BATCHES)
                n += 1
            return n, slowest(time.perf_counter() - t0), time.process_time() - c0
        while n < min_steps or t - t0 < budget:
            step(n % N_BATCHES)
            n += 1
            t = time.perf_counter()
        return n, t - t0, time.process_time() - c0

    run_for(a.warmup, 3)
    steps, elapsed, cpu = run_for(a.seconds, 5)
    if rank == 0:
        extra = f" ranks={a.ranks} backend=gloo" if dist else ""
        print(f"torch {a.model} batch={B} threads={torch.get_num_threads()} "
              f"samples_per_s={steps * B * a.ranks / elapsed:.1f} steps={steps} seconds={elapsed:.3f} "
              f"cpu_s={cpu:.3f} loss={float(last[0]):.6g}{extra}", flush=True)
    if dist:
        # Seen here: a rank of a DDP job hung for minutes in gloo's teardown
        # after its peer had exited.  Both are done: meet, then leave at once.
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
