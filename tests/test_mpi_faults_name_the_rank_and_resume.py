"""Claim: under mpiexec -n 2, `plexus train` (DDP, a checkpoint every 2
steps, --timeout 4) with rank 1 killed (SIGKILL) or stopped (SIGSTOP)
mid-backward (as it enters a DDP bucket's all-reduce), mid-all-reduce (just
after it posted its share of that all-reduce) or mid-checkpoint (between
writing its files and the save's last collectives) always ends as a job,
within the watchdog's 4 s plus the launcher's teardown, with a message
naming the rank that failed and its host: for a stop, rank 0's watchdog
names rank 1 and its host, the collective, and its label (the DDP step and
bucket, or "checkpoint of step 4"); for a kill, Open MPI names the rank,
its host and the signal, and rank 0, ended by the launcher's SIGTERM while
it waits, prints the same naming of the collective, label and rank 1.  Afterwards every complete checkpoint left
verifies against its SHA256SUMS, and `--resume auto` (the same command)
continues from the newest one to step 8 with the same weights, byte for
byte, and the same final (held-out) loss as a run that was never
interrupted (resumed after each of the six faults).

The faults land at the same point every time through PX_COMM_FAULT
(src/comm/mpi.c: rank 1 sends itself the signal at the N-th collective
whose label contains a string).

If it fails, a dead or stopped rank leaves the job hanging, or ends it with
no word of which rank (the MPI watchdog used to say "waiting on ranks:
unknown under MPI"), or a fault during a save leaves a checkpoint that does
not verify or a run that does not resume to the same result.

Time: 13 short runs of 2 ranks, three of them waiting out the 4 s
watchdog: about 31 s on the 2-core machine at a load average of 2 (95 s
at 8)."""

import os
import re
import shutil
import socket
import sys
import tempfile
import time

import cli_util as cu
from fault_util import ARGS, TIMEOUT, WHERE, final_loss, model_sum, run_fault, verifies

HOST = socket.gethostname()
# Resumed: every case (each fault at each point).
RESUMED = {("STOP", "mid-backward"), ("STOP", "mid-all-reduce"), ("STOP", "mid-checkpoint"),
           ("KILL", "mid-backward"), ("KILL", "mid-all-reduce"), ("KILL", "mid-checkpoint")}


launcher = cu.mpiexec()
if launcher is None:
    print("plexus was built without MPI (or no mpiexec): nothing to test")
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="px_mpi_faults_")
report = []
try:
    ref = os.path.join(tmp, "straight")
    p = cu.run(ARGS + ["--out", ref], mpi_ranks=2, timeout=120)
    cu.check(p.returncode == 0, "the uninterrupted run failed")
    ref_name, ref_model = model_sum(ref)
    ref_loss = final_loss(p.stdout)
    cu.check(ref_name == "step_00000008" and ref_model, "the uninterrupted run's last checkpoint is %s" % ref_name)
    cu.check(ref_loss is not None, "the uninterrupted run printed no test loss")

    for sig in ("STOP", "KILL"):
        for where, spec, label in WHERE:
            case = "%s %s" % (sig, where)
            out = os.path.join(tmp, "%s_%s" % (sig, where))
            env = cu.mpi_env()
            env["PX_COMM_FAULT"] = "1:%s:%s" % (sig, spec)
            rc, err, to_end, took = run_fault([launcher, "-n", "2", "--oversubscribe", cu.PLEXUS] + ARGS +
                                               ["--out", out], env)
            cu.check(took < 90, "%s: the job did not end within 90 s" % case)
            fired = "PX_COMM_FAULT: signal" in err
            cu.check(fired, "%s: the fault never fired (no collective matched %r):\n%s" % (case, spec, err[-3000:]))
            cu.check(rc != 0, "%s: mpiexec exited 0" % case)
            if sig == "STOP":
                m = re.search(r"plexus: rank 0 \(host [^)]*\): watchdog: .*", err)
                msg = m.group(0) if m else ""
                cu.check(m is not None, "%s: no watchdog message from rank 0:\n%s" % (case, err[-3000:]))
                cu.check(label in msg and "did not complete within %d s" % TIMEOUT in msg,
                         "%s: the watchdog does not name %s and the timeout: %s" % (case, label, msg))
                cu.check("waiting on ranks [1], which did not reach this collective" in msg and
                         "rank 1 on host %s sent no word of waiting in a collective" % HOST in msg,
                         "%s: the watchdog does not name rank 1 and its host: %s" % (case, msg))
                # The watchdog's deadline and the launcher's teardown.
                cu.check(to_end is not None and to_end < TIMEOUT + 5,
                         "%s: the job ended %s s after the fault" % (case, to_end))
            else:
                m = re.search(r"process rank 1 with PID \d+ on node (\S+) exited on signal 9", err)
                cu.check(m is not None and m.group(1) == HOST,
                         "%s: no message from Open MPI naming rank 1, its host and SIGKILL:\n%s" % (case, err[-3000:]))
                # Rank 0, ended by the launcher while it waits, says where.
                t = re.search(r"plexus: rank 0 \(host [^)]*\): SIGTERM .*", err)
                msg = t.group(0) if t else ""
                cu.check(t is not None and label in msg and
                         "waiting on ranks [1], which did not reach this collective" in msg and
                         "rank 1 on host %s sent no word" % HOST in msg,
                         "%s: rank 0 does not say where it waited (%s) and for whom: %s" % (case, label, msg))
                # Open MPI ends the others at once (SIGTERM, then SIGKILL).
                cu.check(to_end is not None and to_end < 10,
                         "%s: the job ended %s s after the fault" % (case, to_end))
            report.append("%-20s ended %4.1f s after the fault: %s" % (case, to_end or -1, msg))

            ck = os.path.join(out, "checkpoints")
            names = os.listdir(ck) if os.path.isdir(ck) else []
            good = sorted(n for n in names if n.startswith("step_") and ".partial" not in n)
            cu.check(good, "%s: no complete checkpoint left: %s" % (case, names))
            for n in good:
                cu.check(verifies(os.path.join(ck, n)), "%s: %s does not verify" % (case, n))
            if where == "mid-checkpoint":
                cu.check(good and good[-1] == "step_00000002",
                         "%s: the newest complete checkpoint is %s, expected step_00000002 (step 4's save was "
                         "interrupted)" % (case, good[-1] if good else None))

            if (sig, where) not in RESUMED:
                continue
            t0 = time.monotonic()
            p = cu.run(ARGS + ["--out", out, "--resume", "auto"], mpi_ranks=2, timeout=120)
            took = time.monotonic() - t0
            cu.check(p.returncode == 0, "%s: --resume auto failed" % case)
            name, model = model_sum(out)
            cu.check(name == "step_00000008" and model == ref_model,
                     "%s: resumed to %s with model %s, the uninterrupted run %s" % (case, name, model, ref_model))
            loss = final_loss(p.stdout)
            cu.check(loss == ref_loss, "%s: final loss %s, the uninterrupted run's %s" % (case, loss, ref_loss))
            same = model == ref_model and loss == ref_loss
            report.append("%-20s --resume auto from %s: %s to %s in %.1f s, test loss %s (uninterrupted %s)" %
                          (case, good[-1] if good else None, "equal" if same else "DIFFERENT", name, took, loss,
                           ref_loss))
    print("\n".join(report))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_mpi_faults_name_the_rank_and_resume")
