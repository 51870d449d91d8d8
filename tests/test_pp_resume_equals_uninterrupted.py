"""Claim: `plexus train --pp 2` (1F1B, 4 micro-batches of 8) stopped at step
10 of 20 (--stop-at-step, what a stop signal also does) and resumed with
--resume ends with parameters and optimizer state within 1e-6 relative of
the pp = 2 run that never stopped, when it resumes
  - at pp = 2 (the same layout; under mpiexec -n 2 when plexus has MPI),
  - at pp = 4 (another split; under mpiexec -n 4 when plexus has MPI),
  - at pp = 2 with the interleaved schedule (4 stages of the 8 units),
  - without a pipeline: one process with --batch-size 8 --accum-steps 4
    (what a pipeline step computes), reading the pipeline's pieces;
and a one-process run (--batch-size 8 --accum-steps 4) stopped at step 10
resumes at pp = 2 to the same end.  The data crosses an epoch boundary
(15 batches an epoch), the schedule is cosine with warm-up and clipping,
Adam's step count and moments carry over.  `plexus inspect` names the
pipeline layout of the checkpoint (mesh pp 2, schedule, each file's
stages), and --resume auto in a directory with no checkpoint starts fresh.
The zoo's CNN (4-D convolution weights, batch-norm statistics: buffers,
dropout: the masks of the resumed step count) stopped at step 3 of 6 and
resumed at pp 2 ends bit-for-bit where the unstopped pp 2 run does.

If it fails: a rank's stages are not saved or not loaded (parameters or
Adam's moments differ from the first resumed step), the data position is
not restored (the resumed run reads other batches), the learning-rate
schedule or the optimizer's step count restarts, or the pipeline and
one-process checkpoints disagree on names or positions."""

import os
import shutil
import tempfile

import cli_util as cu
import zero_util as zu

COMMON = ["train", "--model", "mlp", "--hidden", "24", "--depth", "3", "--data", "mnist",
          "--data-path", cu.FMNIST, "--train-subset", "480", "--val-subset", "64",
          "--optim", "adam", "--lr", "0.003", "--schedule", "cosine", "--warmup-steps", "3",
          "--clip-grad", "0.5", "--log-every", "5", "--seed", "9", "--workers", "1", "--steps", "20",
          "--ckpt-every", "5", "--progress", "lines", "--num-threads", "1"]


def pp(p, mpi=False, schedule="1f1b"):
    args = ["--pp", str(p), "--schedule-pp", schedule, "--micro-batches", "4", "--batch-size", "32"]
    return args if mpi else args + ["--threads", str(p)]


ONE = ["--batch-size", "8", "--accum-steps", "4"]


def final(out, step=20):
    d = os.path.join(out, "checkpoints")
    ck = cu.checkpoints(d)
    want = "step_%08d" % step
    if not cu.check(ck and os.path.basename(ck[-1]) == want, "%s: checkpoints %s, want %s last" % (out, ck, want)):
        return None
    return {"model": zu.whole(ck[-1], "model"), "optim": zu.whole(ck[-1], "optim")}


def compare(name, got, ref):
    if got is None or ref is None:
        return
    for what in ("model", "optim"):
        d = zu.max_rel_diff(got[what], ref[what])
        cu.check(d is not None, "%s: %s tensors differ: %s against %s" %
                 (name, what, sorted(got[what])[:5], sorted(ref[what])[:5]))
        if d is not None:
            print("  %-52s %s %.2g relative from the unstopped run" % (name, what, d))
            cu.check(d <= 1e-6, "%s: %s %g relative from the unstopped pp 2 run" % (name, what, d))


def main():
    tmp = tempfile.mkdtemp(prefix="px_pp_resume_")
    mpi = bool(cu.mpiexec())
    try:
        straight, stopped = os.path.join(tmp, "straight"), os.path.join(tmp, "stopped")
        p = cu.run(COMMON + pp(2) + ["--out", straight])
        cu.check(p.returncode == 0, "the unstopped pp 2 run failed:\n%s" % p.stderr[-2000:])
        ref = final(straight)
        p = cu.run(COMMON + pp(2) + ["--stop-at-step", "10", "--out", stopped])
        cu.check(p.returncode == 0, "the stopped pp 2 run failed:\n%s" % p.stderr[-2000:])
        ck = os.path.join(stopped, "checkpoints", "step_00000010")
        cu.check(os.path.isdir(ck), "no checkpoint at step 10 in %s" % cu.checkpoints(os.path.join(stopped, "checkpoints")))
        # The layout, as inspect shows it.
        p = cu.run(["inspect", ck])
        text = p.stdout
        cu.check(p.returncode == 0 and "pp 2 (schedule 1f1b, 4 micro-batches" in text and
                 "pipeline stages 0" in text and "pipeline stages 1" in text and "pipeline parallel" in text,
                 "inspect does not show the pipeline layout:\n%s" % text[:3000])
        cases = [("pp 2%s" % (" (mpiexec -n 2)" if mpi else " (threads)"), pp(2, mpi), 2 if mpi else 0),
                 ("pp 4%s" % (" (mpiexec -n 4)" if mpi else " (threads)"), pp(4, mpi), 4 if mpi else 0),
                 ("pp 2 interleaved (threads)", pp(2, schedule="interleaved"), 0),
                 ("one process, --batch-size 8 --accum-steps 4", ONE, 0)]
        for name, args, ranks in cases:
            out = os.path.join(tmp, name.split(" (")[0].replace(" ", "_").replace(",", ""))
            p = cu.run(COMMON + args + ["--resume", ck, "--out", out], mpi_ranks=ranks)
            if not cu.check(p.returncode == 0, "resume at %s failed:\n%s" % (name, (p.stdout + p.stderr)[-3000:])):
                continue
            cu.check("resumed from %s: step 10" % ck in p.stdout + p.stderr,
                     "resume at %s does not say where it resumed:\n%s" % (name, p.stdout[-2000:]))
            compare("pp 2 stopped at 10, resumed at " + name, final(out), ref)
        # A one-process checkpoint resumes in a pipeline.
        one_stopped, one_resumed = os.path.join(tmp, "one_stopped"), os.path.join(tmp, "one_resumed")
        p = cu.run(COMMON + ONE + ["--stop-at-step", "10", "--out", one_stopped])
        cu.check(p.returncode == 0, "the stopped one-process run failed")
        p = cu.run(COMMON + pp(2) + ["--resume", os.path.join(one_stopped, "checkpoints"), "--out", one_resumed])
        cu.check(p.returncode == 0, "pp 2 resuming the one-process checkpoint failed:\n%s" % p.stderr[-2000:])
        compare("one process stopped at 10, resumed at pp 2", final(one_resumed), ref)
        # The CNN: 4-D weights, buffers, dropout.
        cnn = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
               "--train-subset", "256", "--val-subset", "32", "--steps", "6", "--log-every", "1", "--lr", "0.01",
               "--num-threads", "1", "--progress", "lines", "--seed", "4"] + pp(2)
        runs = {}
        for name, extra in (("straight", []), ("stopped", ["--stop-at-step", "3"])):
            runs[name] = os.path.join(tmp, "cnn_" + name)
            p = cu.run(cnn + extra + ["--out", runs[name]])
            cu.check(p.returncode == 0, "cnn %s failed" % name)
        resumed = os.path.join(tmp, "cnn_resumed")
        p = cu.run(cnn + ["--resume", os.path.join(runs["stopped"], "checkpoints"), "--out", resumed])
        cu.check(p.returncode == 0, "cnn resume failed")
        got, want = final(resumed, 6), final(runs["straight"], 6)
        cu.check(got is None or "1.running_mean" in got["model"] or any("running_mean" in k for k in got["model"]),
                 "the CNN's checkpoint has no batch-norm statistics: %s" % (sorted(got["model"]) if got else ""))
        if got and want:
            for what in ("model", "optim"):
                d = zu.max_rel_diff(got[what], want[what])
                print("  %-52s %s %s relative" % ("cnn pp 2 stopped at 3, resumed at pp 2", what, d))
                cu.check(d == 0.0, "cnn: %s differs by %s from the unstopped run" % (what, d))
        # --resume auto with nothing to resume: a fresh start.
        fresh = os.path.join(tmp, "fresh")
        p = cu.run(COMMON + pp(2) + ["--resume", "auto", "--out", fresh, "--steps", "2"])
        cu.check(p.returncode == 0 and "no checkpoint in" in p.stdout + p.stderr,
                 "--resume auto without a checkpoint:\n%s" % (p.stdout + p.stderr)[-2000:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_pp_resume_equals_uninterrupted")


main()
