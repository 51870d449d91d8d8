"""Claim: for each ZeRO stage (1, 2, 3) on 2 ranks (threads backend; stage 3
also under mpiexec -n 2, where each rank is a process that writes and reads
its own files), a run
stopped at step k (--stop-at-step) and resumed with --resume auto ends with
the same bytes in every file of its final checkpoint -- the model (whole, or
each rank's slice for stage 3) and each rank's slice of the optimizer
state -- as a run that never stopped; and resuming a ZeRO checkpoint into
another world size or another stage (or into DDP) loads it by intersecting
the saved pieces (issue 12: resharding), says so naming both layouts, and
trains on to the end.

The runs carry what resume must restore across a sharded layout: Adam's
moments in each rank's shard and its step count, the cosine schedule,
clipping by the global norm, accumulation, dropout's counter, the data
position (the stop falls mid-epoch).  If it fails, a rank reads another
rank's slice or none, a piece is lost between segments, or state that
shapes training is not restored."""

import os
import shutil
import tempfile

import cli_util as cu

COMMON = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
          "--train-subset", "512", "--val-subset", "64", "--batch-size", "16", "--accum-steps", "2",
          "--optim", "adam", "--lr", "0.003", "--schedule", "cosine", "--warmup-steps", "3",
          "--clip-grad", "0.5", "--eval-every", "6", "--log-every", "4", "--seed", "9", "--workers", "1",
          "--steps", "12", "--ckpt-every", "6", "--progress", "lines", "--quiet", "--threads", "2"]
assert COMMON[-2:] == ["--threads", "2"]
# 512 samples / 2 ranks / batch 16 = 16 batches per rank = 8 steps per epoch: the stop at 5 is mid-epoch,
# the end in the second epoch.


def final_sums(out):
    ck = cu.checkpoints(os.path.join(out, "checkpoints"))
    return (os.path.basename(ck[-1]), cu.sha256sums(ck[-1])) if ck else (None, None)


tmp = tempfile.mkdtemp(prefix="px_cli_zero_resume_")
try:
    cases = [(1, 0), (2, 0), (3, 0)]
    if cu.mpiexec():
        cases.append((3, 2))
    else:
        print("(plexus was built without MPI: the mpiexec case is skipped)")
    for stage, mpi_ranks in cases:
        z = ["--zero", str(stage)]
        args = COMMON if not mpi_ranks else COMMON[:-2]  # without the trailing --threads 2
        tag = "z%d%s" % (stage, "_mpi" if mpi_ranks else "")
        straight = os.path.join(tmp, tag + "_straight")
        stopped = os.path.join(tmp, tag + "_stopped")
        p = cu.run(args + z + ["--out", straight], mpi_ranks=mpi_ranks)
        cu.check(p.returncode == 0, "%s: the straight run failed" % tag)
        p = cu.run(args + z + ["--stop-at-step", "5", "--out", stopped], mpi_ranks=mpi_ranks)
        cu.check(p.returncode == 0, "%s: the first half failed" % tag)
        p = cu.run(args + z + ["--resume", "auto", "--out", stopped], mpi_ranks=mpi_ranks)
        cu.check(p.returncode == 0, "%s: the resumed half failed" % tag)
        a_name, a = final_sums(straight)
        b_name, b = final_sums(stopped)
        cu.check(a_name == "step_00000012" and b_name == "step_00000012",
                 "%s: final checkpoints %s and %s, expected step_00000012" % (tag, a_name, b_name))
        if a and b:
            cu.check(set(a) == set(b), "%s: files differ: %s vs %s" % (tag, sorted(a), sorted(b)))
            for f in sorted(set(a) & set(b)):
                if f == "state.json":
                    continue  # holds the config, which names the output directory
                cu.check(a[f] == b[f], "%s: %s differs after resume" % (tag, f))
            shards = [f for f in a if ".rank0000" in f]
            cu.check(len(shards) == (4 if stage == 3 else 2), "%s: rank files %s" % (tag, shards))
            mid = cu.sha256sums(os.path.join(straight, "checkpoints", "step_00000006"))
            moved = [f for f in shards if mid.get(f) != a.get(f)]
            cu.check(len(moved) == len(shards), "%s: training did not change %s" %
                     (tag, sorted(set(shards) - set(moved))))

    # Another layout: resharded, both layouts named, trained on to the end.
    ck = os.path.join(tmp, "z2_straight", "checkpoints", "step_00000006")
    for i, (extra, want_run) in enumerate(((["--zero", "1"], "ZeRO stage 1 (--zero 1) on 2 rank(s)"),
                                           (["--zero", "2", "--threads", "3"], "ZeRO stage 2 (--zero 2) on 3 rank(s)"),
                                           (["--zero", "0"], "DDP (--zero 0) on 2 rank(s)"))):
        out = os.path.join(tmp, "other%d" % i)
        # Without --quiet: the resume's log lines are the point.
        args = [a for a in COMMON if a != "--quiet"] + ["--resume", ck, "--out", out] + extra
        p = cu.run(args, expect_ok=False)
        text = p.stdout + p.stderr
        cu.check(p.returncode == 0, "resume %s into %s failed:\n%s" % (ck, extra, text[-2000:]))
        cu.check("saved by ZeRO stage 2 (--zero 2) on 2 rank(s)" in text and want_run in text and "resharded" in text,
                 "resume into %s: the log lacks the layouts:\n%s" % (extra, text[-2000:]))
        cu.check(os.path.isdir(os.path.join(out, "checkpoints", "step_00000012")),
                 "resume into %s: no final checkpoint step_00000012" % extra)
        cu.check("AddressSanitizer" not in text and "Segmentation" not in text, "resume into %s crashed" % extra)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_zero_resume_is_bit_exact")
