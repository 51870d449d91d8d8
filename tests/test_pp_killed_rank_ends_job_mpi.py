"""Claim: a pipeline job whose rank is killed ends, and says where: under
`mpiexec -n 3 plexus train --pp 3 --timeout 1` (the tiny GPT), SIGKILL to
one rank's process in the middle of training (the middle stage's, then the
last stage's: a real kill from outside, at whatever action the schedule is
in) ends the whole job within the watchdog's 1 s (+ slack for a loaded
machine: Open MPI's tear-down takes about 1 s more) with a non-zero exit,
and a surviving rank's watchdog message names the pipeline step, the
stage, the micro-batch and the schedule's action it was waiting in
("pipeline step 1037: stage 2, micro-batch 2, RECV_ACT ... waiting on
ranks [1]"; at the optimizer step "pipeline step (gradient norm) 359:
stage -1, micro-batch -1, OPTIM_STEP", the tied embedding's all-reduce
included), or, when the kill falls between two steps (the survivors in
the stop-signal all-reduce), the step just done and the rank's stage
("pipeline step 169 done: stage 0, between steps, stop-signal check"): no
message says "no label set".  Should Open MPI end the job first (before
the watchdog's bound), its message naming the killed rank and signal 9 is
accepted instead.  (Open MPI notices a killed process by itself after
about 2 s here: the watchdog is set below that, so that its message is
what the test sees.)

Skipped (77) when plexus was built without MPI or mpiexec is missing.

If it fails: a dead stage leaves its neighbours blocked in a receive
forever (the job runs until the cluster's limit), or the message does not
say which stage and action waited."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import cli_util as cu

WATCHDOG = 1.0
SLACK = 13.0  # a loaded 2-core machine: MPI_Abort and mpiexec's clean-up
ACTION = re.compile(r"watchdog: \w+ \(pipeline (?:step|step loss|eval|step \(.*?\)) \d+: stage -?\d+, "
                    r"micro-batch -?\d+, (FORWARD|BACKWARD|SEND_ACT|RECV_ACT|SEND_GRAD|RECV_GRAD|OPTIM_STEP)\) "
                    r"did not complete within 1 s")
# Between two steps (the survivors in the stop-signal all-reduce): no action
# is pending, the message names the step just done and the rank's stage.
BETWEEN = re.compile(r"watchdog: \w+ \(pipeline step \d+ done: stage \d+, between steps, stop-signal check\) "
                     r"did not complete within 1 s")


def children_ranks(root):
    """{MPI rank: pid} of the plexus processes under the process `root`
    (ours only: other jobs on this machine are left alone)."""
    parent = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    out = {}
    for pid in parent:
        q, ours = pid, False
        while q in parent and q > 1:
            q = parent[q]
            if q == root:
                ours = True
                break
        if not ours:
            continue
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if not f.read().startswith(cu.PLEXUS.encode()):
                    continue
            with open("/proc/%d/environ" % pid, "rb") as f:
                for kv in f.read().split(b"\0"):
                    if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                        out[int(kv.split(b"=", 1)[1])] = pid
        except OSError:
            pass
    return out


def steps_logged(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if '"type": "step"' in line or '"type":"step"' in line)
    except OSError:
        return 0


def one(victim, tmp):
    jsonl = os.path.join(tmp, "metrics_%d.jsonl" % victim)
    # The tiny GPT (its tied head on the last stage) on a small text: the
    # data opens at once, so startup stays far inside the watchdog.
    cmd = [cu.mpiexec(), "-n", "3", "--oversubscribe", cu.PLEXUS, "train", "--model", "gpt", "--data", "text",
           "--data-path", os.path.join(tmp, "train.txt"), "--context", "16", "--n-layer", "2", "--n-head", "4",
           "--n-embd", "32", "--dropout", "0", "--steps", "1000000", "--batch-size", "8",
           "--micro-batches", "4", "--pp", "3", "--schedule-pp", "1f1b", "--log-every", "1", "--jsonl", jsonl,
           "--eval-every", "1000000", "--progress", "lines", "--timeout", str(int(WATCHDOG))]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cu.mpi_env())
    try:
        ranks = {}
        deadline = time.monotonic() + 60
        while len(ranks) < 3 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
            ranks = children_ranks(p.pid)
        if not cu.check(len(ranks) == 3, "kill rank %d: found ranks %s under mpiexec" % (victim, ranks)):
            return
        # Into training: 20 steps logged (rank 0 writes metrics.jsonl), then a
        # moment more, so the kill falls at whatever action the schedule is in.
        while steps_logged(jsonl) < 20 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        time.sleep(0.5)
        cu.check(p.poll() is None, "kill rank %d: the job ended before the kill" % victim)
        t0 = time.monotonic()
        os.kill(ranks[victim], signal.SIGKILL)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            cu.check(False, "kill rank %d: the job still runs 60 s after the kill" % victim)
            return
        took = time.monotonic() - t0
        lines = [ln for ln in err.splitlines() if "watchdog" in ln]
        named = [ln for ln in lines if ACTION.search(ln) or BETWEEN.search(ln)]
        print("--- SIGKILL to rank %d (stage %d): exit %d, the job ended %.2f s after the kill" %
              (victim, victim, p.returncode, took))
        for ln in lines or [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("-----")][:12]:
            print("    " + ln)
        cu.check(p.returncode != 0, "kill rank %d: the job exited 0" % victim)
        cu.check(took <= WATCHDOG + SLACK, "kill rank %d: the job took %.1f s to end (watchdog %g s)" %
                 (victim, took, WATCHDOG))
        mpi_first = not lines and took < WATCHDOG and \
            ("rank %d" % victim) in err and "signal 9" in err
        cu.check(not any("no label set" in ln for ln in lines), "kill rank %d: a watchdog message without a label:\n%s"
                 % (victim, "\n".join(lines)))
        cu.check(named or mpi_first, "kill rank %d: no message names the stage, micro-batch and action:\n%s" %
                 (victim, err[-3000:]))
        if named:
            # In a collective of a sub-group (the tied embedding's all-reduce
            # of the first and last stage) the ranks are the group's, with
            # the world's in brackets: "waiting on ranks [1] of this group of
            # 2 (world ranks [2])".
            cu.check(any("waiting on ranks [%d]" % victim in ln for ln in named) or
                     any("(world ranks [%d])" % victim in ln for ln in named) or
                     any("waiting on ranks: unknown" in ln for ln in named),
                     "kill rank %d: the watchdog names other ranks:\n%s" % (victim, "\n".join(named)))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def main():
    if not cu.mpiexec():
        print("test_pp_killed_rank_ends_job_mpi: skipped (plexus built without MPI, or no mpiexec)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="px_pp_kill_")
    try:
        cu.word_corpus(os.path.join(tmp, "train.txt"), 1, 400)
        one(1, tmp)  # the middle stage: both neighbours wait on it
        one(2, tmp)  # the last stage
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_pp_killed_rank_ends_job_mpi")


main()
