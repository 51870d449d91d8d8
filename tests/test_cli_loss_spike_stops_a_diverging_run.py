"""Claim: `plexus train --optim adam --lr 1e6 --loss-spike-factor 5` (an
MLP on Fashion-MNIST, 2 ranks as threads, and 2 processes under mpiexec
where plexus has MPI) stops with a non-zero exit at step 2, where the loss
jumps from 2.3 to 5e22: every rank prints "loss spike at step 2" against
"the mean of the 1 step before it", and the run never finishes ("done:").
Without the guard the same run trains on to its last step and exits 0 (the
silent divergence the guard is for, kept as the default), and with the
guard at a healthy rate (1e-3) it is not stopped, warm-up included.

Before the fix the guard watched nothing in its 10 warm-up steps, and the
step-2 jump, inside the running mean, hid every later step: the diverging
run exited 0 (also at lr 10 and 100).

If it fails, a diverging run trains on (exit 0), stops at another step or
on only some ranks, or the guard stops a healthy run."""

import os
import re
import shutil
import tempfile

import cli_util as cu

NAME = "test_cli_loss_spike_stops_a_diverging_run"
BASE = ["train", "--model", "mlp", "--hidden", "64", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "2048", "--val-subset", "64", "--batch-size", "32", "--optim", "adam", "--steps", "30",
        "--workers", "1", "--progress", "lines", "--seed", "1"]
GUARD = ["--loss-spike-factor", "5"]

tmp = tempfile.mkdtemp(prefix="px_loss_spike_")
try:
    runs = [("threads", ["--threads", "2"], 0)]
    if cu.mpiexec():
        runs.append(("mpiexec -n 2", [], 2))
    for how, extra, ranks in runs:
        label = "lr 1e6, guard on, %s" % how
        p = cu.run(BASE + ["--lr", "1e6", "--out", os.path.join(tmp, "diverge_%d" % ranks)] + GUARD + extra,
                   mpi_ranks=ranks, expect_ok=False, timeout=300)
        out = p.stdout + p.stderr
        cu.check(p.returncode != 0, "%s: exit 0 (output: %s)" % (label, out[-800:]))
        msgs = re.findall(r"rank (\d): train: loss spike at step (\d+) .*", out)
        cu.check(sorted(r for r, _ in msgs) == ["0", "1"],
                 "%s: not every rank names the loss spike: %s" % (label, out[-1500:]))
        cu.check(all(s == "2" for _, s in msgs), "%s: stopped at steps %s, expected 2" % (label, msgs))
        cu.check("the mean of the 1 step before it" in out and "--loss-spike-factor" in out,
                 "%s: the message does not give the mean it compared with and the option: %s" % (label, out[-1500:]))
        cu.check("done:" not in out, "%s: the run finished: %s" % (label, out[-800:]))
        m = re.search(r"rank 0: (train: loss spike .*)", out)
        print("%s: exit %d after %s" % (label, p.returncode, m.group(1) if m else out[-400:]))

    p = cu.run(BASE + ["--lr", "1e6", "--threads", "2", "--out", os.path.join(tmp, "unguarded")], timeout=300)
    cu.check(p.returncode == 0 and "done:" in p.stdout + p.stderr,
             "lr 1e6, guard off: exit %d: it should train on (the default)" % p.returncode)
    p = cu.run(BASE + ["--lr", "1e-3", "--threads", "2", "--out", os.path.join(tmp, "healthy")] + GUARD,
               timeout=300)
    cu.check(p.returncode == 0 and "loss spike" not in p.stdout + p.stderr,
             "lr 1e-3, guard on: exit %d: a healthy run was stopped: %s" % (p.returncode, (p.stdout + p.stderr)[-800:]))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish(NAME)
