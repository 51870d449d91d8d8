"""Claim: under MPI, a rank waiting for a late peer backs off instead of
burning its core, completes as soon as the peer arrives, and its watchdog
still ends a job whose peer never arrives within the bound.

px_comm's MPI waits poll MPI_Test without sleeping while a collective can be
moving (Open MPI moves it only inside MPI calls), and nap between polls once
it has waited SPIN_SECONDS (0.25 s) without completion.  tests/tools/
comm_stall has rank 1 of 2 sleep 3 s before an all-reduce (blocking, then
px_comm_iallreduce + px_request_wait); rank 0 reports the CPU seconds of its
waiting thread and of its whole process (getrusage: with the watchdog
thread that throttles a blocking call once it has stalled).

  - both all-reduces complete with the right sums (the tool checks);
  - rank 0 waited the stall (>= 2.5 s) and no more than 5 s past it;
  - its thread, and its whole process, spent < 1.0 s of CPU in each 3 s
    wait (polling without a pause would spend all 3: a generous bound for
    a loaded 2-core machine, where the spin's first 0.25 s may be
    stretched); the share of a core used after the first 0.25 s is printed;
  - with --timeout 2 and a 20 s stall, the watchdog ends the job in < 15 s
    naming the collective, the label and the timeout.
Both ways a blocking collective waits are checked: MPI's blocking call
under plexus's watchdog thread (the default), and the polling wait
(PX_COMM_MPI_WAIT=poll, also what every request wait uses).

If it failed, a rank of an oversubscribed node waiting for a slow peer would
take the CPU that peer needs (or a slow wait would hide a hang)."""
import os
import re
import shutil
import subprocess
import sys
import time

build = os.environ.get("PX_BUILD_DIR", "build")
tool = os.path.join(build, "tests", "comm_stall")
mpiexec = "/usr/bin/mpiexec" if os.path.exists("/usr/bin/mpiexec") else shutil.which("mpiexec")
name = "test_comm_mpi_wait_backs_off_when_peer_stalls"

if not mpiexec or not os.path.exists(tool):
    print(f"{name}: skipped (mpiexec {mpiexec}, {tool} exists: {os.path.exists(tool)})")
    sys.exit(0)
if subprocess.run([tool, "--has-mpi"]).returncode != 0:
    print(f"{name}: skipped (plexus was built without MPI)")
    sys.exit(0)
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1", ASAN_OPTIONS="detect_leaks=0")
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def run(args, limit, wait):
    cmd = [mpiexec, "-n", "2", "--oversubscribe", tool] + args
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, PX_COMM_MPI_WAIT=wait), timeout=limit)
    except subprocess.TimeoutExpired:
        check(False, f"{' '.join(args)}: the job did not end within {limit} s")
        return None, limit
    took = time.monotonic() - t0
    print(f"--- PX_COMM_MPI_WAIT={wait} {' '.join(args)}: exit {p.returncode} after {took:.1f} s\n{p.stdout}{p.stderr.strip()[:1500]}")
    return p, took


for wait in ("mpi", "poll"):
    p, took = run(["--stall", "3"], 60, wait)
    if p is not None:
        check(p.returncode == 0, f"the stalled all-reduces failed (exit {p.returncode})")
        waits = re.findall(r"comm_stall: (\w+) waited=([0-9.]+) cpu=([0-9.]+) proc=([0-9.]+)", p.stdout)
        check(len(waits) == 2, f"expected two waits reported, got {waits}")
        for how, waited, cpu, proc in waits:
            waited, cpu, proc = float(waited), float(cpu), float(proc)
            print(f"{wait} {how}: {cpu:.3f} CPU s (thread), {proc:.3f} (process) in {waited:.3f} s; "
                  f"after the first 0.25 s at most {100 * proc / max(waited - 0.25, 1e-9):.0f}% of a core")
            check(proc < 1.0, f"{wait} {how}: the process spent {proc:.3f} CPU s in a {waited:.3f} s wait")
            check(waited >= 2.5, f"{wait} {how}: waited only {waited:.3f} s for a peer 3 s late")
            check(waited < 8.0, f"{wait} {how}: waited {waited:.3f} s for a peer 3 s late")
            check(cpu < 1.0, f"{wait} {how}: the waiting thread spent {cpu:.3f} CPU s in a {waited:.3f} s wait")

    p, took = run(["--stall", "20", "--timeout", "2"], 60, wait)
    if p is not None:
        check(p.returncode != 0, f"{wait} watchdog: the job exited 0")
        check(took < 15, f"{wait} watchdog: the job took {took:.1f} s to end")
        for words in ("watchdog", "allreduce", "stall test", "did not complete within 2 s"):
            check(words in p.stderr, f"{wait} watchdog: stderr lacks {words!r}")

if failures:
    sys.exit(1)
print(f"{name}: ok")
