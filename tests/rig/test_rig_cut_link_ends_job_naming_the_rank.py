"""Claim: with DDP running across 2 "hosts" of the rig (network namespaces
joined by veth links, Open MPI over TCP only, tests/rig/), cutting host 2's
link (`ip link set DEV down` on its veth) ends the whole job: rank 0's
watchdog (--timeout 4) names rank 1 and host 2's name, the collective and
its label (a DDP step and bucket, a step, or a checkpoint), every plexus
process is gone and mpiexec exits non-zero within the watchdog + 12 s of
the cut, with Open MPI's daemon keepalive set to notice a lost host in
~3 s (`--mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1
--mca oob_tcp_keepalive_probes 2`; its defaults, 300 + 9 x 20 s, keep
mpiexec waiting 8 minutes for the unreachable daemon after the ranks have
ended).  Every complete checkpoint left verifies, and `--resume auto` (2
ranks on this machine) continues from the newest to the last step.

Skipped (77, with the reason) where the rig cannot be made, as
test_rig_ddp_across_netns_hosts_equals_single_process is.

If it fails: a rank cut off from the others leaves the job hanging (the
watchdog does not fire, or the launcher never ends), or the message does
not say which rank and host were cut off."""

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import cli_util as cu  # noqa: E402

NAME = "test_rig_cut_link_ends_job_naming_the_rank"
RIG = os.path.join(HERE, "netns_hosts.sh")
AGENT = os.path.join(HERE, "netns-exec.sh")
TIMEOUT = 4
STEPS = 100


def skip(why):
    print("%s: SKIPPED: %s" % (NAME, why), flush=True)
    sys.exit(77)


chk = subprocess.run(["bash", RIG, "check"], capture_output=True, text=True)
if chk.returncode != 0:
    skip(chk.stderr.strip() or "netns_hosts.sh check exited %d" % chk.returncode)
if not cu.mpiexec():
    skip("plexus was built without MPI (or no mpiexec): the rig runs Open MPI across the hosts")

lock = open("/tmp/plexus-rig.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
tmp = tempfile.mkdtemp(prefix="px_rig_cut_")
rigdir = os.path.join(tmp, "rig")
proc = None


def down(*_):
    if proc is not None and proc.poll() is None:
        proc.kill()
    subprocess.run(["bash", RIG, "down", rigdir])


def on_term(signum, _frame):
    down()
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_term)


def verifies(ck):
    sums = os.path.join(ck, "SHA256SUMS")
    if not os.path.exists(sums):
        return False
    for line in open(sums):
        digest, name = line.rstrip("\n").split("  ", 1)
        path = os.path.join(ck, name)
        if not os.path.exists(path):
            return False
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digest:
                return False
    return True


ARGS = ["train", "--model", "mlp", "--hidden", "64", "--depth", "2", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "512", "--val-subset", "32", "--batch-size", "16", "--optim", "adam", "--lr", "0.001",
        "--ckpt-every", "2", "--keep-last", "3", "--steps", str(STEPS), "--workers", "1", "--progress", "lines",
        "--timeout", str(TIMEOUT), "--seed", "5"]

try:
    up = subprocess.run(["bash", RIG, "up", rigdir, "2", "1gbit", "0.1ms"], capture_output=True, text=True)
    print(up.stderr.strip(), flush=True)
    if not cu.check(up.returncode == 0, "the rig did not come up"):
        cu.finish(NAME)
    names = dict(l.split() for l in open(os.path.join(rigdir, "names")))
    host2 = [l.split()[1] for l in open(os.path.join(rigdir, "map"))][1]
    out = os.path.join(tmp, "run")
    ck = os.path.join(out, "checkpoints")
    env = cu.mpi_env()
    env["PX_RIG_MAP"] = os.path.join(rigdir, "map")
    cmd = [cu.mpiexec(), "-n", "2", "--hostfile", os.path.join(rigdir, "hostfile"),
           "--mca", "plm_rsh_agent", AGENT, "--mca", "btl", "tcp,self",
           "--mca", "btl_tcp_if_include", "10.77.0.0/24", "--mca", "oob_tcp_if_include", "10.77.0.0/24",
           "--mca", "oob_tcp_keepalive_time", "1", "--mca", "oob_tcp_keepalive_intvl", "1",
           "--mca", "oob_tcp_keepalive_probes", "2", cu.PLEXUS] + ARGS + ["--out", out]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    # Cut host 2's link once the first checkpoint is there.
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if os.path.isdir(ck) and any(n.startswith("step_") and ".partial" not in n for n in os.listdir(ck)):
            break
        time.sleep(0.02)
    running = proc.poll() is None
    cu.check(running, "the run ended (%s) before the cut" % proc.poll())
    t_cut = time.monotonic()
    subprocess.run(["ip", "link", "set", "%sr2" % names["tag"], "down"], check=True)
    try:
        proc.wait(timeout=TIMEOUT + 60)
    except subprocess.TimeoutExpired:
        pass
    took = time.monotonic() - t_cut
    ended = proc.poll() is not None
    reader.join(timeout=5)
    err = "".join(lines)
    left = []
    for i in (1, 2):
        ns = "%s-h%d" % (names["tag"], i)
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                if os.path.basename(os.readlink("/proc/%s/exe" % pid)) == "plexus":
                    left.append((ns, pid))
            except OSError:
                pass
    m = re.search(r"plexus: rank 0 \(host [^)]*\): watchdog: .*", err)
    msg = m.group(0) if m else ""
    print("cut host 2's link: mpiexec %s %.1f s after the cut (exit %s)\n%s" %
          ("ended" if ended else "still running", took, proc.poll(), msg), flush=True)
    cu.check(ended and took < TIMEOUT + 12, "mpiexec did not end within %d s of the cut (%.1f s)" %
             (TIMEOUT + 12, took))
    cu.check(ended and proc.returncode != 0, "mpiexec exited %s" % proc.returncode)
    cu.check(not left, "plexus processes left in the namespaces: %s" % left)
    cu.check(m is not None, "no watchdog message from rank 0:\n%s" % err[-3000:])
    cu.check("waiting on ranks [1], which did not reach this collective" in msg and
             "rank 1 on host %s sent no word" % host2 in msg,
             "the watchdog does not name rank 1 on host %s: %s" % (host2, msg))
    cu.check(re.search(r"watchdog: \w+ \((DDP step \d+, bucket \d+|step \d+, epoch|checkpoint of step \d+)", msg)
             is not None, "the watchdog does not give the collective and its step: %s" % msg)
    down()

    names_left = os.listdir(ck) if os.path.isdir(ck) else []
    good = sorted(n for n in names_left if n.startswith("step_") and ".partial" not in n)
    cu.check(good, "no complete checkpoint left: %s" % names_left)
    for n in good:
        cu.check(verifies(os.path.join(ck, n)), "%s does not verify" % n)
    p = cu.run(ARGS + ["--out", out, "--resume", "auto"], mpi_ranks=2, timeout=300)
    last = cu.checkpoints(ck)
    cu.check(p.returncode == 0 and last and os.path.basename(last[-1]) == "step_%08d" % STEPS,
             "--resume auto did not continue to step %d: %s" % (STEPS, last[-1:] if last else None))
    cu.check(last and verifies(last[-1]), "the resumed run's last checkpoint does not verify")
finally:
    down()
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish(NAME)
