"""Claim: with DDP running across 2 "hosts" of the rig (network namespaces,
Open MPI over TCP only, tests/rig/), host 2's link cut at a chosen point --
mid-backward (as rank 1 enters DDP step 5's bucket-0 all-reduce),
mid-all-reduce (just after rank 1 posted its share of it) and
mid-checkpoint (before the 3rd collective of step 4's save) -- ends the
whole job each time: rank 0's watchdog (--timeout 4) names the collective,
its label (DDP step and bucket, or "checkpoint of step 4"), rank 1 and host
2's name; mpiexec exits non-zero within the watchdog + 12 s of the cut with
no plexus process left in either host; every complete checkpoint left
verifies (mid-checkpoint: the newest is step 2's, step 4's save never
completed); and `--resume auto` continues to step 8 with the weights, byte
for byte, and the held-out loss of a run never interrupted.

How the cut lands at the point: PX_COMM_FAULT (src/comm/mpi.c, the hook
of tests/test_mpi_faults_name_the_rank_and_resume.py) makes rank 1 stop
itself (SIGSTOP) there; the test sees it stopped (/proc state T), sets host
2's veth down, and continues it (SIGCONT): from then on rank 1 runs, cut
off, from exactly that point.

Skipped (77, with the reason) where the rig cannot be made, as
test_rig_ddp_across_netns_hosts_equals_single_process is.

If it fails: a host cut off at one of these points leaves the job hanging,
ends it without naming the rank, host, collective and step, or leaves a
checkpoint that does not verify or a run that does not resume to the same
result."""

import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import cli_util as cu  # noqa: E402
import fault_util as fu  # noqa: E402
from rig_util import Rig  # noqa: E402

NAME = "test_rig_cut_link_at_fault_points_names_rank_and_resumes"


def state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
        return s[s.rfind(")") + 2:].split()[0]
    except OSError:
        return None


rig = Rig(NAME)
report = []
try:
    if not cu.check(rig.up(), "the rig did not come up"):
        cu.finish(NAME)
    host2 = rig.namespaces[1]

    ref = os.path.join(rig.tmp, "straight")
    p = cu.run(fu.ARGS + ["--out", ref], mpi_ranks=2, timeout=120)
    cu.check(p.returncode == 0, "the uninterrupted run failed")
    ref_name, ref_model = fu.model_sum(ref)
    ref_loss = fu.final_loss(p.stdout)
    cu.check(ref_name == "step_00000008" and ref_model and ref_loss is not None,
             "the uninterrupted run ended at %s (loss %s)" % (ref_name, ref_loss))

    for where, spec, label in fu.WHERE:
        case = "cut %s" % where
        out = os.path.join(rig.tmp, where)
        env = rig.env()
        env["PX_COMM_FAULT"] = "1:STOP:%s" % spec
        how = {}

        def cut_at_fault():
            # Rank 1 has said it stops itself: wait for it to be stopped,
            # cut its host off, let it go on.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                stopped = [pid for pid in rig.plexus_pids(2) if state(pid) == "T"]
                if stopped:
                    break
                time.sleep(0.01)
            rig.cut(2)
            how["stopped"] = stopped
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)

        rc, err, to_end, took = fu.run_fault(rig.mpiexec(2, [cu.PLEXUS] + fu.ARGS + ["--out", out],
                                                         export=["PX_COMM_FAULT"]),
                                             env, on_fault=cut_at_fault, limit=90)
        left = rig.plexus_left()
        cu.check(fu.FIRED in err, "%s: the fault never fired (%r):\n%s" % (case, spec, err[-3000:]))
        cu.check(how.get("stopped"), "%s: rank 1 was not seen stopped at the fault point" % case)
        cu.check(rc != 0, "%s: mpiexec exited 0" % case)
        cu.check(to_end is not None and to_end < fu.TIMEOUT + 12,
                 "%s: the job ended %s s after the cut (bound %d s)" % (case, to_end, fu.TIMEOUT + 12))
        cu.check(not left, "%s: plexus processes left in the hosts: %s" % (case, left))
        m = re.search(r"plexus: rank 0 \(host [^)]*\): watchdog: .*", err)
        msg = m.group(0) if m else ""
        cu.check(m is not None, "%s: no watchdog message from rank 0:\n%s" % (case, err[-3000:]))
        cu.check(label in msg and "did not complete within %d s" % fu.TIMEOUT in msg,
                 "%s: the watchdog does not name %s and the timeout: %s" % (case, label, msg))
        cu.check("waiting on ranks [1], which did not reach this collective" in msg and
                 "rank 1 on host %s sent no word" % host2 in msg,
                 "%s: the watchdog does not name rank 1 on host %s: %s" % (case, host2, msg))
        report.append("%-18s mpiexec ended %4.1f s after the cut (exit %d): %s" %
                      (case, to_end if to_end is not None else -1, rc, msg))

        # The next case needs the link: orted left behind in host 2 (its
        # mpiexec is gone) ends, the link comes back.
        for pid in subprocess.run(["ip", "netns", "pids", host2], capture_output=True, text=True).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "link", "set", "%sr2" % rig.tag, "up"], check=True)

        good, names = fu.complete_checkpoints(out)
        cu.check(good, "%s: no complete checkpoint left: %s" % (case, names))
        for n in good:
            cu.check(fu.verifies(os.path.join(out, "checkpoints", n)), "%s: %s does not verify" % (case, n))
        if where == "mid-checkpoint":
            cu.check(good and good[-1] == "step_00000002",
                     "%s: the newest complete checkpoint is %s, expected step_00000002" %
                     (case, good[-1] if good else None))
        p = cu.run(fu.ARGS + ["--out", out, "--resume", "auto"], mpi_ranks=2, timeout=120)
        name, model = fu.model_sum(out)
        cu.check(p.returncode == 0 and name == "step_00000008" and model == ref_model,
                 "%s: --resume auto exited %d at %s with model %s, the uninterrupted run %s" %
                 (case, p.returncode, name, model, ref_model))
        loss = fu.final_loss(p.stdout)
        cu.check(loss == ref_loss, "%s: final loss %s, the uninterrupted run's %s" % (case, loss, ref_loss))
    print("\n".join(report), flush=True)
finally:
    rig.cleanup()
cu.finish(NAME)
