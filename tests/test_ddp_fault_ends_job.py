"""Claim: a DDP job never hangs in silence.  When rank 1 of 2 leaves in the
middle of a training step (its function returns, or its process exits), or
stops taking part while the others wait in a bucket's all-reduce, the job
ends within bounded time (the watchdog lowered to 2 s here), with a non-zero
exit and a message that says what happened: which rank failed, or which
collective and which DDP step and bucket the watchdog gave up on, and
(under MPI too, from the side channel) which rank did not arrive and on
which host.  Checked
under the threads backend and under mpiexec -n 2.

If it failed, one crashed rank would keep the whole job (and its nodes)
blocked until the cluster's wall-clock limit."""
import os
import shutil
import subprocess
import sys
import time

build = os.environ.get("PX_BUILD_DIR", "build")
tool = os.path.join(build, "tests", "ddp_fault")
mpiexec = "/usr/bin/mpiexec" if os.path.exists("/usr/bin/mpiexec") else shutil.which("mpiexec")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1", ASAN_OPTIONS="detect_leaks=0")
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def run(label, cmd, expect):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=90)
    except subprocess.TimeoutExpired:
        check(False, f"{label}: the job did not end within 90 s")
        return
    took = time.monotonic() - t0
    print(f"--- {label}: exit {p.returncode} after {took:.1f} s\n{p.stderr.strip()[:1500]}")
    check(p.returncode != 0, f"{label}: exited 0")
    for words in expect:
        check(all(w in p.stderr for w in words), f"{label}: stderr lacks {words}")


run("threads exit", [tool, "--threads", "2", "--mode", "exit"], [("rank 1", "failed")])
run("threads hang", [tool, "--threads", "2", "--mode", "hang"],
    [("watchdog", "allreduce", "DDP step 4", "within 2 s", "1")])
if mpiexec:
    run("mpi exit", [mpiexec, "-n", "2", "--oversubscribe", tool, "--mode", "exit"], [])
    run("mpi hang", [mpiexec, "-n", "2", "--oversubscribe", tool, "--mode", "hang"],
        [("watchdog", "allreduce", "DDP step 4", "within 2 s"),
         ("waiting on ranks [1], which did not reach this collective", "rank 1 on host")])
else:
    print("mpiexec not found: MPI cases skipped")
sys.exit(1 if failures else 0)
