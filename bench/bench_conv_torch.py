#!/usr/bin/python3
"""bench_conv_torch.py — PyTorch's side of bench/bench_conv.c.

    bench_conv_torch.py [--threads N] [--seconds S] [--batch B] [--case C,O,H,W,stride]...
                        [--blas-threads N]
    bench_conv_torch.py --info     (torch version, oneDNN and the BLAS it calls, for the record)

prints one line per case and pass in the format of bench_conv:

    torch conv C=16 O=16 H=32 W=32 stride=1 batch=64 threads=1 pass=forward ms=1.234 gflops=123.4 kernel=onednn

Same layers, shapes and statistic as the C benchmark (see its header): one
nn.Conv2d(C, O, 3, stride, 1, bias=False) on x of (B, C, H, W), x and dy
uniform in [-1, 1] (torch.manual_seed), each pass called once untimed,
then repeatedly for about S seconds (at least MIN_CALLS times); the line
reports the MEDIAN wall time of one call.

    forward:   y = conv(x) in autograd's normal mode, x.requires_grad=True
               (as in training: the graph for backward is recorded)
    backward:  torch.autograd.grad(y, (x, conv.weight), dy, retain_graph=True)
               on a y computed once: dx and dW, as bench_conv's backward

gflops counts as bench_conv: 2·B·C·O·9·Ho·Wo for forward, twice that for
backward.  kernel= is "onednn" when the forward ran aten::mkldnn_convolution
(PyTorch's oneDNN path; seen in a profiled call), "native" when it ran
another convolution (PyTorch's own im2col + BLAS), and, were the profiler
unable to tell, "onednn" when torch.backends.mkldnn is available and
enabled.

Threads: as bench/bench_train_torch.py (see its docstring):
torch.set_num_threads(T) sizes PyTorch's OpenMP pool, and the script sets
OPENBLAS_NUM_THREADS=1 (--blas-threads) before it imports torch, so that
OpenBLAS's own pool does not spin against it.  OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE are left as the environment has them.  Run it with
Debian's python3 (python3-torch); bench/run_conv.sh runs both side by side.
This is a benchmark, not a test: it never fails on speed.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

from bench_train_torch import blas_info  # the same report as bench_train_torch.py (no torch import)

MIN_CALLS = 5

# (C, O, H, W, stride), as bench_conv.c: ResNet-20's 3x3 layers (stride 1,
# then its stride-2 ones), then the zoo CNN's.
DEFAULT_CASES = [(16, 16, 32, 32, 1), (32, 32, 16, 16, 1), (64, 64, 8, 8, 1),
                 (16, 32, 32, 32, 2), (32, 64, 16, 16, 2),
                 (1, 32, 28, 28, 1), (32, 64, 14, 14, 1)]


def parse_case(s):
    """ "C,O,H,W,stride" -> a tuple of five ints >= 1 (argparse type)."""
    try:
        v = tuple(int(p) for p in s.split(","))
    except ValueError:
        v = ()
    if len(v) != 5 or min(v) < 1:
        raise argparse.ArgumentTypeError(
            "--case is C,O,H,W,stride: in and out channels, height, width, stride, "
            "five integers >= 1 (e.g. 16,16,32,32,1), not %r" % s)
    return v


def kernel_of(torch, conv, x):
    """Which convolution PyTorch runs for this layer and input: one forward, profiled."""
    try:
        with torch.autograd.profiler.profile() as prof:
            conv(x)
        names = {e.name for e in prof.function_events}
    except Exception:  # a profiler that cannot say: fall back on the build
        names = set()
    if "aten::mkldnn_convolution" in names:
        return "onednn"
    if any("conv" in n for n in names):
        return "native"
    return "onednn" if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled else "native"


def median_call(fn, seconds):
    """Median wall seconds of one call of fn, over about `seconds` (at least MIN_CALLS calls)."""
    times = []
    t0 = now = time.perf_counter()
    while len(times) < MIN_CALLS or now - t0 < seconds:
        s = time.perf_counter()
        fn()
        now = time.perf_counter()
        times.append(now - s)
    return statistics.median(times)


def bench_case(torch, a, case):
    C, O, H, W, stride = case
    B = a.batch
    Ho, Wo = (H - 1) // stride + 1, (W - 1) // stride + 1
    flops = 2.0 * B * C * O * 9 * Ho * Wo  # forward; backward twice that
    torch.manual_seed(11)
    conv = torch.nn.Conv2d(C, O, 3, stride, 1, bias=False)
    conv.train()
    x = (torch.rand(B, C, H, W) * 2 - 1).requires_grad_(True)  # (B, C, H, W)
    dy = torch.rand(B, O, Ho, Wo) * 2 - 1                       # (B, O, Ho, Wo)
    kernel = kernel_of(torch, conv, x)

    # Warm-up, as bench_conv: two whole steps.
    for _ in range(2):
        torch.autograd.grad(conv(x), (x, conv.weight), dy)

    tf = median_call(lambda: conv(x), a.seconds)
    y = conv(x)
    tb = median_call(lambda: torch.autograd.grad(y, (x, conv.weight), dy, retain_graph=True), a.seconds)

    for pas, t, f in (("forward", tf, flops), ("backward", tb, 2 * flops)):
        print(f"torch conv C={C} O={O} H={H} W={W} stride={stride} batch={B} threads={torch.get_num_threads()} "
              f"pass={pas} ms={1e3 * t:.3f} gflops={f / t * 1e-9:.1f} kernel={kernel}", flush=True)


def main():
    ap = argparse.ArgumentParser(description="One 3x3 convolution layer of PyTorch, forward and backward "
                                             "(the reference for bench_conv).")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0.5, help="timed seconds of each case and pass (default 0.5)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--case", type=parse_case, action="append", metavar="C,O,H,W,stride",
                    help="a layer; each replaces the default cases (ResNet-20's and the zoo CNN's)")
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="OPENBLAS_NUM_THREADS for PyTorch's BLAS (default 1; see bench_train_torch.py)")
    ap.add_argument("--info", action="store_true", help="print torch's version, oneDNN and BLAS, then exit")
    a = ap.parse_args()
    if a.threads < 1 or a.blas_threads < 1 or a.batch < 1 or not 0 < a.seconds <= 3600:
        ap.error("--threads, --blas-threads and --batch must be >= 1, --seconds > 0 and <= 3600")

    os.environ["OPENBLAS_NUM_THREADS"] = str(a.blas_threads)
    import torch

    if a.info:
        print("torch %s (%s); onednn: %s; blas: %s; OPENBLAS_NUM_THREADS=%d" %
              (torch.__version__, torch.__file__,
               "available" if torch.backends.mkldnn.is_available() else "not available",
               blas_info(), a.blas_threads))
        return 0
    # Before any parallel work, or PyTorch ignores the interop setting.
    torch.set_num_interop_threads(1)
    torch.set_num_threads(a.threads)
    for case in a.case or DEFAULT_CASES:
        bench_case(torch, a, case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
