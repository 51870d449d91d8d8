"""Claim: a run stopped at step k (--stop-at-step, what a signal also does)
and resumed with --resume auto ends with
the same weights and optimizer state, byte for byte, as a run that never
stopped -- under mpiexec -n 2 and under the threads backend with 2 ranks.

The runs exercise everything a resume must restore: the CNN's dropout masks
(a counter of forward passes), Adam's moments and step count, a cosine
schedule with warm-up, gradient clipping, accumulation over 2 micro-batches,
the data order across an epoch boundary (the stop falls mid-epoch, the end
in the next epoch), and batch-norm running statistics.  The comparison is of
the SHA-256 of model.safetensors and optim.safetensors in the final
checkpoints.

If it fails, some state that shapes training is not saved or not put back
(position in the epoch, RNG counters, optimizer state, schedule step), or a
kernel is not deterministic from run to run."""

import os
import shutil
import tempfile

import cli_util as cu

COMMON = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
          "--train-subset", "1000", "--val-subset", "200", "--batch-size", "16", "--accum-steps", "2",
          "--optim", "adam", "--lr", "0.003", "--schedule", "cosine", "--warmup-steps", "5",
          "--clip-grad", "1.0", "--eval-every", "7", "--log-every", "5", "--seed", "3", "--workers", "2",
          "--progress", "lines", "--quiet"]
# 1000 samples / 2 ranks / batch 16 = 32 batches per rank = 16 steps per epoch.


def final_sums(out):
    ck = cu.checkpoints(os.path.join(out, "checkpoints"))
    if not ck:
        return None, None
    return os.path.basename(ck[-1]), cu.sha256sums(ck[-1])


def case(tmp, label, extra, mpi_ranks):
    straight = os.path.join(tmp, label + "_straight")
    stopped = os.path.join(tmp, label + "_stopped")
    p = cu.run(COMMON + extra + ["--steps", "24", "--ckpt-every", "12", "--out", straight], mpi_ranks=mpi_ranks)
    cu.check(p.returncode == 0, "%s: the straight run failed" % label)
    p = cu.run(COMMON + extra + ["--steps", "24", "--stop-at-step", "10", "--ckpt-every", "12", "--out", stopped],
               mpi_ranks=mpi_ranks)
    cu.check(p.returncode == 0, "%s: the first half failed" % label)
    p = cu.run(COMMON + extra + ["--steps", "24", "--ckpt-every", "12", "--resume", "auto", "--out", stopped],
               mpi_ranks=mpi_ranks)
    cu.check(p.returncode == 0, "%s: the resumed half failed" % label)
    a_name, a = final_sums(straight)
    b_name, b = final_sums(stopped)
    cu.check(a_name == "step_00000024" and b_name == "step_00000024",
             "%s: final checkpoints %s and %s, expected step_00000024" % (label, a_name, b_name))
    if a and b:
        for f in ("model.safetensors", "optim.safetensors"):
            cu.check(a.get(f) == b.get(f), "%s: %s differs after resume: %s vs %s" % (label, f, a.get(f), b.get(f)))
    # And a resume that was not bit-exact would show here: the first half
    # alone must differ from the straight run at the same step.
    if a:
        mid_a = cu.sha256sums(os.path.join(straight, "checkpoints", "step_00000012"))
        cu.check(mid_a["model.safetensors"] != a["model.safetensors"], "%s: training did not move the weights" % label)


tmp = tempfile.mkdtemp(prefix="px_cli_resume_")
try:
    if cu.mpiexec():
        case(tmp, "mpi", [], mpi_ranks=2)
    else:
        print("(plexus was built without MPI: the mpiexec case is skipped)")
    case(tmp, "threads", ["--threads", "2"], mpi_ranks=0)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_resume_is_bit_exact")
