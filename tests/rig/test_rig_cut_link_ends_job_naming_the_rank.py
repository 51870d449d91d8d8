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

import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import cli_util as cu  # noqa: E402
from fault_util import verifies  # noqa: E402
from rig_util import Rig  # noqa: E402

NAME = "test_rig_cut_link_ends_job_naming_the_rank"
TIMEOUT = 4
STEPS = 100
rig = Rig(NAME)

ARGS = ["train", "--model", "mlp", "--hidden", "64", "--depth", "2", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "512", "--val-subset", "32", "--batch-size", "16", "--optim", "adam", "--lr", "0.001",
        "--ckpt-every", "2", "--keep-last", "3", "--steps", str(STEPS), "--workers", "1", "--progress", "lines",
        "--timeout", str(TIMEOUT), "--seed", "5"]

try:
    if not cu.check(rig.up(), "the rig did not come up"):
        cu.finish(NAME)
    host2 = rig.namespaces[1]
    out = os.path.join(rig.tmp, "run")
    ck = os.path.join(out, "checkpoints")
    cmd = rig.mpiexec(2, [cu.PLEXUS] + ARGS + ["--out", out])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=rig.env())
    rig.procs.append(proc)
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
    rig.cut(2)
    try:
        proc.wait(timeout=TIMEOUT + 60)
    except subprocess.TimeoutExpired:
        pass
    took = time.monotonic() - t_cut
    ended = proc.poll() is not None
    reader.join(timeout=5)
    err = "".join(lines)
    left = rig.plexus_left()
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
    rig.down()

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
    rig.cleanup()
cu.finish(NAME)
