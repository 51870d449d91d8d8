"""Claim: under MPI a failing rank ends the whole job within bounded time,
and the watchdog names the rank that did not arrive (rank and host, from
the side channel, src/comm/mpi_side.c), the collective and its label.

  skip:  rank 1 of 2 skips an all-reduce; rank 0's watchdog (2 s) prints
         which collective and label it was in, names rank 1 and its host as
         having sent no word of waiting in a collective, and ends the job (MPI_Abort);
  stop:  rank 1 stops itself with SIGSTOP before the all-reduce: the same,
         within the watchdog's 2 s (plus the launcher's teardown);
  other: rank 1 waits in a barrier labelled "checkpoint of step 3" on
         another communicator (with 3 times the timeout, so rank 0's
         watchdog is the one that fires): rank 0's message says so (what
         rank 1 told it on the side channel when its own wait stalled);
  group: 4 ranks split into even and odd; world rank 3 skips the odd
         group's all-reduce: world rank 1 names group rank 1, world rank 3;
  exit:  rank 1 returns 3 from its function mid-step; px_comm_run aborts the
         job so rank 0, waiting in the all-reduce, does not hang.

If it failed, one crashed, stopped or diverging rank would keep an mpirun
job (and its allocation) blocked until the cluster's wall-clock limit, or
end it with "waiting on ranks: unknown": no hint of which rank to look at."""
import os
import shutil
import socket
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


host = socket.gethostname()


def run(mode, n=2):
    cmd = [mpiexec, "-n", str(n), "--oversubscribe", tool, "--mode", mode, "--timeout", "2"]
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
    check("waiting on ranks [1], which did not reach this collective" in p.stderr,
          "skip: the watchdog does not name rank 1")
    check(f"rank 1 on host {host} sent no word of waiting in a collective" in p.stderr,
          "skip: the watchdog does not give rank 1's host and state")
    check("unknown" not in p.stderr, "skip: the watchdog still says unknown")

p, took = run("stop")
if p is not None:
    check(p.returncode != 0, "stop: the job exited 0")
    check(took < 2 + 8, f"stop: took {took:.1f} s, more than the watchdog's 2 s and 8 s of teardown")
    check("rank 0 (host " + host + "): watchdog: allreduce (step 3, bucket 1) did not complete within 2 s"
          in p.stderr, "stop: no watchdog message from rank 0 naming the allreduce and label")
    check(f"waiting on ranks [1], which did not reach this collective" in p.stderr and
          f"rank 1 on host {host} sent no word of waiting in a collective (it is stopped" in p.stderr,
          "stop: the watchdog does not name the stopped rank 1 and its host")

p, took = run("other")
if p is not None:
    check(p.returncode != 0, "other: the job exited 0")
    check(took < 2 + 8, f"other: took {took:.1f} s")
    check(f"rank 1 on host {host} is waiting in barrier (checkpoint of step 3) on another communicator"
          in p.stderr, "other: rank 0's watchdog does not say where rank 1 waits")

p, took = run("group", n=4)
if p is not None:
    check(p.returncode != 0, "group: the job exited 0")
    # The time includes starting 4 oversubscribed processes on what may be
    # 2 busy cores (a fresh Debian under ctest -j2 took 12.4 s in all).
    check(took < 2 + 18, f"group: took {took:.1f} s")
    check("rank 1 (host " + host + "): watchdog: allreduce (step 3, bucket 1)" in p.stderr and
          "waiting on ranks [1] of this group of 2 (world ranks [3])" in p.stderr and
          f"world rank 3 on host {host} sent no word of waiting in a collective" in p.stderr,
          "group: world rank 1's watchdog does not name group rank 1 = world rank 3")

p, took = run("exit")
if p is not None:
    check(p.returncode != 0, "exit: the job exited 0")
    check(took < 60, f"exit: took {took:.1f} s")
    check("returned 3" in p.stderr, "exit: no message saying rank 1 returned 3")

if failures:
    sys.exit(1)
print("test_comm_mpi_faults: ok")
