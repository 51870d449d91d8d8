"""Claim: `plexus train --dp A --tp B --pp C` (3D: pipeline × tensor × data
parallel) trains the GPT that data parallelism trains.  With the same seed
and global batch (2 replicas × 8 sequences), clipping at 0.5 and AdamW,
every logged step's loss and gradient norm of dp 2 × tp 2 × pp 2 (8
threads, 1F1B over 4 micro-batches), of dp 2 × pp 2 (dp inferred from 4
threads, GPipe over 2) and, under mpiexec -n 8, of dp 2 × tp 2 × pp 2
equal DDP's on 2 ranks to 1e-5 relative; tp 2 × pp 2 (--dp 1, interleaved)
equals one process.  --zero 1 and --zero 2 over dp with the pipeline give
the losses, norms and held-out loss of the same pipeline without ZeRO (DDP
over dp) to 1e-6.  The mesh and the stages are printed at start-up, and the
held-out loss is finite and near DDP's (the pipeline evaluates whole batches
only, so its samples differ).  Bad input gets one clear message each and no
training: dp × tp × pp not the world size (naming all four numbers), a tp ×
pp that does not divide the world, --zero 3 with --pp, tp with a model that
has no layers to split, --accum-steps and --sequence-parallel with --pp.
If this fails: the dp replicas read the same data or their gradients are
not averaged, the tied embedding's copies or the vocabulary-parallel loss
are wrong under the pipeline, ZeRO's slices lose elements, or the mesh's
checks went missing."""

import math
import os
import shutil
import tempfile

import cli_util as cu

TOL = 1e-5


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def train(tmp, name, extra, mpi_ranks=0, expect_ok=True):
    args = ["train", "--model", "gpt", "--data", "text", "--data-path", os.path.join(tmp, "train.txt"),
            "--val-path", os.path.join(tmp, "valid.txt"), "--context", "16", "--n-layer", "2", "--n-head", "4",
            "--n-embd", "32", "--dropout", "0", "--clip-grad", "0.5", "--optim", "adamw", "--lr", "0.003",
            "--steps", "12", "--batch-size", "8", "--log-every", "1", "--progress", "lines",
            "--jsonl", os.path.join(tmp, name + ".jsonl")] + extra
    return cu.run(args, mpi_ranks=mpi_ranks, expect_ok=expect_ok)


def metrics(tmp, name):
    rows = cu.jsonl(os.path.join(tmp, name + ".jsonl"))
    steps = [(r["loss"], r["grad_norm"]) for r in rows if r.get("type") == "step"]
    evals = [r["loss"] for r in rows if r.get("type") == "eval"]
    return steps, evals


def same_steps(name, a, b, tol):
    worst = max([max(rel(x[0], y[0]), rel(x[1], y[1])) for x, y in zip(a, b)] or [math.inf])
    cu.check(len(a) == len(b) == 12 and worst <= tol, "%s: steps %s differ from %s (worst %.2g > %.0g)" %
             (name, a[:3], b[:3], worst, tol))
    return worst


tmp = tempfile.mkdtemp(prefix="px_pp3d_cli_")
try:
    cu.word_corpus(os.path.join(tmp, "train.txt"), 1, 1500)
    cu.word_corpus(os.path.join(tmp, "valid.txt"), 2, 100)
    refs = {}
    for name, extra in [("ddp", ["--threads", "2"]), ("one", ["--threads", "1"])]:
        p = train(tmp, name, extra)
        cu.check(p.returncode == 0, "%s failed" % name)
        refs[name] = metrics(tmp, name)
    cases = [("dp2_tp2_pp2", ["--threads", "8", "--dp", "2", "--tp", "2", "--pp", "2", "--micro-batches", "4"], 0,
              "ddp"),
             ("dp2_pp2", ["--threads", "4", "--pp", "2", "--micro-batches", "2", "--schedule-pp", "gpipe"], 0, "ddp"),
             ("tp2_pp2", ["--threads", "4", "--dp", "1", "--tp", "2", "--pp", "2", "--micro-batches", "4",
                          "--schedule-pp", "interleaved"], 0, "one")]
    if cu.mpiexec():
        cases.append(("dp2_tp2_pp2_mpi", ["--dp", "2", "--tp", "2", "--pp", "2", "--micro-batches", "4"], 8, "ddp"))
    runs = {}
    for name, extra, ranks, ref in cases:
        p = train(tmp, name, extra, mpi_ranks=ranks)
        if not cu.check(p.returncode == 0, "%s failed" % name):
            continue
        if name == "dp2_tp2_pp2":
            cu.check("mesh dp 2 × tp 2 × pp 2 (world 8)" in p.stdout and "stage 1:" in p.stdout and
                     "2 replicas (a step is 16 samples)" in p.stdout,
                     "the mesh, stages and replicas are not printed at start-up:\n%s" % p.stdout[-2000:])
        steps, evals = metrics(tmp, name)
        runs[name] = (steps, evals)
        w = same_steps(name, steps, refs[ref][0], TOL)
        ok = len(evals) == 1 and math.isfinite(evals[0]) and refs[ref][1] and rel(evals[0], refs[ref][1][0]) < 0.01
        cu.check(ok, "%s: held-out loss %s, %s's %s" % (name, evals, ref, refs[ref][1]))
        print("  %s: 12 steps as %s's to %.1e (last loss %.6f); held-out %.6f (%s %.6f)" %
              (name, ref, w, steps[-1][0] if steps else math.nan, evals[0] if evals else math.nan, ref,
               refs[ref][1][0] if refs[ref][1] else math.nan))
    # ZeRO 1 and 2 over dp with the pipeline against DDP over dp with it.
    base = runs.get("dp2_pp2")
    for stage in ("1", "2"):
        name = "dp2_pp2_zero" + stage
        p = train(tmp, name, ["--threads", "4", "--pp", "2", "--micro-batches", "2", "--schedule-pp", "gpipe",
                              "--zero", stage])
        if not cu.check(p.returncode == 0 and base is not None, "%s failed" % name):
            continue
        steps, evals = metrics(tmp, name)
        w = same_steps(name, steps, base[0], 1e-6)
        cu.check(len(evals) == 1 and len(base[1]) == 1 and rel(evals[0], base[1][0]) <= 1e-6,
                 "%s: held-out %s, without ZeRO %s" % (name, evals, base[1]))
        print("  %s: as DDP over dp with pp to %.1e" % (name, w))

    # Bad input: one message each, nothing trained.
    bad = [(["--threads", "4", "--dp", "2", "--tp", "2", "--pp", "2"], 0,
            "mesh dp 2 × tp 2 × pp 2 = 8 ranks, but the world has 4"),
           (["--threads", "6", "--tp", "2", "--pp", "2"], 0, "--tp 2 × --pp 2 = 4 does not divide the world size 6"),
           (["--threads", "4", "--pp", "2", "--zero", "3"], 0, "--zero 3 with --pp 2"),
           (["--threads", "4", "--tp", "2", "--pp", "2", "--model", "mlp"], 0,
            "tensor parallelism splits a GPT's layers"),
           (["--threads", "4", "--pp", "2", "--accum-steps", "2"], 0, "use --micro-batches 2 (1 × 2)"),
           (["--threads", "4", "--tp", "2", "--pp", "2", "--sequence-parallel"], 0, "--sequence-parallel with --pp 2")]
    if cu.mpiexec():
        bad.append((["--dp", "2", "--tp", "2", "--pp", "2"], 4,
                    "dp 2 × tp 2 × pp 2"))
    for extra, ranks, want in bad:
        p = train(tmp, "bad", extra, mpi_ranks=ranks, expect_ok=False)
        err = p.stderr
        cu.check(p.returncode != 0 and want in err, "%s: exit %d, stderr does not say %r:\n%s" %
                 (" ".join(extra), p.returncode, want, err[-1500:]))
        if ranks == 0:
            cu.check(err.count("plexus train:") == 1, "%s: more than one message:\n%s" % (" ".join(extra), err))
        cu.check("step 1/" not in p.stdout, "%s: trained anyway" % " ".join(extra))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_pp_cli_3d_trains_like_ddp_and_rejects_bad_meshes")
