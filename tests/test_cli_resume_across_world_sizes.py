"""Claim: plexus train with --zero 1 on 4 ranks (under mpiexec -n 4 when
plexus is built with MPI: each rank a process writing its own slice),
stopped at step 5 and resumed on 2 ranks (mpiexec -n 2) and on 3 ranks
(threads) with the same global batch (4 x 12 = 2 x 24 = 3 x 16), ends with
parameters within 1e-6 relative of the 4-rank run that never stopped; the
resumed run says in its log that it resharded and that the global batch is
the same.  (An MLP: no batch norm, whose statistics depend on the per-rank
batch; Adam, cosine schedule, clipping.)

If it fails, a resume on another world size loses or misplaces the
optimizer state, the data position, the step or the schedule."""

import os
import shutil
import tempfile

import cli_util as cu
import pxst


def common(ranks, batch, mpi):
    args = ["train", "--model", "mlp", "--hidden", "24", "--depth", "2", "--data", "mnist",
            "--data-path", cu.FMNIST, "--train-subset", "480", "--val-subset", "64",
            "--batch-size", str(batch), "--optim", "adam", "--lr", "0.003", "--schedule", "cosine",
            "--warmup-steps", "3", "--clip-grad", "0.5", "--log-every", "4", "--seed", "9",
            "--workers", "1", "--steps", "12", "--ckpt-every", "5", "--progress", "lines",
            "--zero", "1"]
    return args if mpi else args + ["--threads", str(ranks)]


def final_model(out):
    ck = cu.checkpoints(os.path.join(out, "checkpoints"))
    cu.check(ck and os.path.basename(ck[-1]) == "step_00000012", "%s: final checkpoints %s" % (out, ck))
    return pxst.load(os.path.join(ck[-1], "model.safetensors")) if ck else {}


tmp = tempfile.mkdtemp(prefix="px_cli_resume_worlds_")
try:
    mpi = bool(cu.mpiexec())
    if not mpi:
        print("(plexus was built without MPI: the 4- and 2-rank runs use threads)")
    straight = os.path.join(tmp, "straight")
    stopped = os.path.join(tmp, "stopped")
    p = cu.run(common(4, 12, mpi) + ["--out", straight], mpi_ranks=4 if mpi else 0)
    cu.check(p.returncode == 0, "the straight 4-rank run failed")
    p = cu.run(common(4, 12, mpi) + ["--stop-at-step", "5", "--out", stopped], mpi_ranks=4 if mpi else 0)
    cu.check(p.returncode == 0, "the stopped 4-rank run failed")
    ref = final_model(straight)
    ck = os.path.join(stopped, "checkpoints", "step_00000005")
    for ranks, batch, use_mpi in ((2, 24, mpi), (3, 16, False)):
        out = os.path.join(tmp, "on%d" % ranks)
        p = cu.run(common(ranks, batch, use_mpi) + ["--resume", ck, "--out", out],
                   mpi_ranks=ranks if use_mpi else 0)
        text = p.stdout + p.stderr
        cu.check(p.returncode == 0, "resume on %d ranks failed" % ranks)
        cu.check("resharded" in text and "the same global batch (48)" in text,
                 "resume on %d ranks: the log does not say what it did:\n%s" % (ranks, text[-3000:]))
        got = final_model(out)
        cu.check(set(got) == set(ref), "resume on %d ranks: tensors %s vs %s" % (ranks, sorted(got), sorted(ref)))
        worst = 0.0
        for name in sorted(set(got) & set(ref)):
            a, b = got[name].flatten().tolist(), ref[name].flatten().tolist()
            scale = max(abs(v) for v in b) or 1.0
            worst = max(worst, max(abs(x - y) for x, y in zip(a, b)) / scale)
        print("4 ranks stopped at step 5, resumed on %d%s: %.3g relative from the unstopped run" %
              (ranks, " (mpiexec)" if use_mpi else " (threads)", worst))
        cu.check(worst <= 1e-6, "resume on %d ranks: %g relative from the unstopped run" % (ranks, worst))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_resume_across_world_sizes")
