#!/usr/bin/python3
"""bench_comm_torch.py — PyTorch's side of bench/bench_comm.c: torch.distributed
over gloo on the CPU, 2 processes (started here, as torch.multiprocessing).

    bench_comm_torch.py [--ranks 2] [--ops allreduce,allgather,reduce_scatter,broadcast,sendrecv]
                        [--min BYTES] [--max BYTES] [--factor F] [--seconds S]
    bench_comm_torch.py --info

prints lines in bench_comm's format, impl=gloo:

    comm impl=gloo op=allreduce bytes=1048576 iters=230 us=512.3 algbw=2.047 busbw=2.047 ranks=2

with the same conventions (bench_comm.c's header, nccl-tests' busbw factors)
and the same timing: one warm-up, one timed call, then as many as fit S
seconds by the slowest rank, all between barriers; the time is the slowest
rank's.  An op gloo does not implement prints `unsupported` instead of
figures (reduce_scatter, in torch 1.13)."""
import argparse
import os
import socket
import sys
import time

OPS = ["allreduce", "allgather", "reduce_scatter", "broadcast", "sendrecv"]


def bus_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def worker(rank, a, port):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ranks)
    n = a.ranks
    big = torch.full((a.max // 4,), 1e-6, dtype=torch.float32)
    out = torch.full((a.max // 4,), 1e-6, dtype=torch.float32)

    def once(op, count):
        part = count // n
        if op == "allreduce":
            dist.all_reduce(big[:count])
        elif op == "allgather":
            dist.all_gather(list(out[:part * n].chunk(n)), big[:part])
        elif op == "reduce_scatter":
            dist.reduce_scatter(out[:part], list(big[:part * n].chunk(n)))
        elif op == "broadcast":
            dist.broadcast(big[:count], 0)
        elif op == "sendrecv":
            if rank == 0:
                dist.send(big[:count], 1, tag=7)
                dist.recv(out[:count], 1, tag=7)
            elif rank == 1:
                dist.recv(out[:count], 0, tag=7)
                dist.send(big[:count], 0, tag=7)

    def slowest(t):
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return float(v[0])

    size = a.min
    while size <= a.max:
        unit = 4 * n
        sz = size // unit * unit
        for op in a.ops:
            count = sz // 4
            try:
                once(op, count)
            except RuntimeError as e:  # gloo lacks it
                if rank == 0:
                    print(f"comm impl=gloo op={op} bytes={sz} unsupported ({str(e).splitlines()[0][:80]})", flush=True)
                dist.barrier()
                continue
            dist.barrier()
            t0 = time.perf_counter()
            once(op, count)
            one = slowest(time.perf_counter() - t0)
            iters = max(3, min(10000, int(a.seconds / one) if one > 0 else 10000))
            dist.barrier()
            t0 = prev = time.perf_counter()
            best = float("inf")
            for _ in range(iters):
                once(op, count)
                now = time.perf_counter()
                best, prev = min(best, now - prev), now
            took = slowest(prev - t0)
            best = slowest(best)  # the slowest rank's fastest iteration (bench_comm's us_min)
            if rank == 0:
                half = 2.0 if op == "sendrecv" else 1.0
                t = took / iters / half
                algbw = sz / t / 1e9
                print(f"comm impl=gloo op={op} bytes={sz} iters={iters} us={1e6 * t:.2f} algbw={algbw:.3f} "
                      f"busbw={algbw * bus_factor(op, n):.3f} ranks={n} us_min={1e6 * best / half:.2f}", flush=True)
        dist.barrier()
        size = int(size * a.factor)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description="torch.distributed (gloo) collectives, bench_comm's format")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--min", type=int, default=4096)
    ap.add_argument("--max", type=int, default=256 << 20)
    ap.add_argument("--factor", type=float, default=4)
    ap.add_argument("--seconds", type=float, default=0.25)
    ap.add_argument("--info", action="store_true")
    a = ap.parse_args()
    a.ops = a.ops.split(",")
    for op in a.ops:
        if op not in OPS:
            ap.error(f"unknown op {op}")
    if a.ranks < 2 or a.min < 16 or a.max < a.min or a.factor <= 1 or a.seconds <= 0:
        ap.error("need --ranks >= 2, 16 <= --min <= --max, --factor > 1, --seconds > 0")
    import torch
    if a.info:
        print(f"torch {torch.__version__}, gloo over TCP on 127.0.0.1")
        return 0
    import torch.multiprocessing as mp
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a, port), nprocs=a.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
