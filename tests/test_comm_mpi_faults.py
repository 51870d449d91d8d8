"""Claim: under MPI a failing rank ends the whole job within bounded time.

  skip: rank 1 of 2 skips an all-reduce; rank 0's watchdog (2 s) prints
        which collective and label it was in and ends the job (MPI_Abort);
  exit: rank 1 returns 3 from its function mid-step; px_comm_run aborts the
        job so rank 0, waiting in the all-reduce, does not hang.

If it failed, one crashed or diverging rank would keep an mpirun job (and
its allocation) blocked until the cluster's wall-clock limit, with no hint
of where it stopped."""
import os
import shutil
import subprocess
import sys
import time

build = os.environ.get("PX_BUILD_DIR", "build")
tool = os.path.join(build, "tests", "comm_fault")
mpiexec = "/usr/bin/mpiexec" if os.path.exists("/usr/bin/mpiexec") else shutil.which("mpiexec")

if not mpiexec or not os.path.exists(tool):
    print(f"test_comm_mpi_faults: skipped (mpiexec {mpiexec}, {tool} exists: {os.path.exists(tool)})")
    sys.exit(0)
if subprocess.run([tool, "--has-mpi"]).returncode != 0:
    print("test_comm_mpi_faults: skipped (plexus was built without MPI)")
    sys.exit(0)
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def run(mode):
    cmd = [mpiexec, "-n", "2", "--oversubscribe", tool, "--mode", mode, "--timeout", "2"]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    except subprocess.TimeoutExpired as e:
        check(False, f"{mode}: the job did not end within 60 s: {e.stderr}")
        return None, 60.0
    took = time.monotonic() - t0
    print(f"--- {mode}: exit {p.returncode} after {took:.1f} s\n{p.stderr}")
    return p, took


p, took = run("skip")
if p is not None:
    check(p.returncode != 0, "skip: the job exited 0")
    check(took < 60, f"skip: took {took:.1f} s")
    check("watchdog" in p.stderr and "allreduce" in p.stderr, "skip: no watchdog message naming the allreduce")
    check("step 3, bucket 1" in p.stderr, "skip: the watchdog message lacks the label")
    check("did not complete within 2 s" in p.stderr, "skip: the watchdog message lacks the timeout")

p, took = run("exit")
if p is not None:
    check(p.returncode != 0, "exit: the job exited 0")
    check(took < 60, f"exit: took {took:.1f} s")
    check("returned 3" in p.stderr, "exit: no message saying rank 1 returned 3")

if failures:
    sys.exit(1)
print("test_comm_mpi_faults: ok")
