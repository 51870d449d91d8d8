"""Claim: `plexus train --model gpt --tp N` trains the GPT that data
parallelism trains.  With the same seed and global batch (2 dp ranks x 8
sequences), dropout 0.1 and clipping at 0.5, every logged step's loss and
gradient norm and the held-out loss of dp 2 x tp 2 (dp inferred from 4
threads), of the same with --sequence-parallel, with --zero 1 over dp, and of
mpiexec -n 4 --tp 2 equal those of DDP on 2 ranks to 1e-5 relative: a
tensor-parallel GPT is the single-process model computed in pieces
(tests/tp_gpt_cases.h proves it for the library); so does tp 2 started
from a DDP checkpoint's weights (--init).  The mesh is printed at start-up.  Bad input gets one clear message each and no training: a tp that
does not divide the heads, a mesh whose product is not the world size
(threads and mpiexec), tp with a model that has no layers to split.
If this fails, px_train over a mesh shards the data over the wrong ranks
(the tp ranks of a group must read the same batches), the vocabulary-
parallel loss or clipping is not used, or the mesh's checks went missing."""

import os
import shutil
import tempfile

import cli_util as cu

TOL = 1e-5


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def train(tmp, name, extra, mpi_ranks=0, expect_ok=True):
    out = os.path.join(tmp, name)
    args = ["train", "--model", "gpt", "--data", "text", "--data-path", os.path.join(tmp, "train.txt"),
            "--val-path", os.path.join(tmp, "valid.txt"), "--context", "16", "--n-layer", "2", "--n-head", "4",
            "--n-embd", "32", "--dropout", "0.1", "--clip-grad", "0.5", "--optim", "adamw", "--lr", "0.003",
            "--steps", "12", "--batch-size", "8", "--log-every", "1", "--progress", "lines",
            "--jsonl", os.path.join(tmp, name + ".jsonl")] + extra
    p = cu.run(args, mpi_ranks=mpi_ranks, expect_ok=expect_ok)
    return p, out


def metrics(tmp, name):
    rows = cu.jsonl(os.path.join(tmp, name + ".jsonl"))
    steps = [(r["loss"], r["grad_norm"]) for r in rows if r.get("type") == "step"]
    evals = [r["loss"] for r in rows if r.get("type") == "eval"]
    return steps, evals


tmp = tempfile.mkdtemp(prefix="px_tp_cli_")
try:
    cu.word_corpus(os.path.join(tmp, "train.txt"), 1, 1500)
    cu.word_corpus(os.path.join(tmp, "valid.txt"), 2, 100)
    p, _ = train(tmp, "ddp", ["--threads", "2"])
    cu.check(p.returncode == 0, "DDP on 2 threads failed")
    ref_steps, ref_evals = metrics(tmp, "ddp")
    cu.check(len(ref_steps) == 12 and len(ref_evals) == 1, "DDP logged %d steps and %d evaluations, want 12 and 1" %
             (len(ref_steps), len(ref_evals)))
    cases = [("tp2", ["--threads", "4", "--tp", "2"], 0),
             ("tp2_sp", ["--threads", "4", "--tp", "2", "--sequence-parallel"], 0),
             ("tp2_zero1", ["--threads", "4", "--tp", "2", "--zero", "1"], 0)]
    if cu.mpiexec():
        cases.append(("tp2_mpi", ["--tp", "2"], 4))
    else:
        print("(plexus was built without MPI: the mpiexec case is skipped)")
    for name, extra, ranks in cases:
        p, _ = train(tmp, name, extra, mpi_ranks=ranks)
        if not cu.check(p.returncode == 0, "%s: training failed" % name):
            continue
        cu.check("mesh dp 2 × tp 2 × pp 1 (world 4)" in p.stdout, "%s: the mesh is not printed at start-up:\n%s" %
                 (name, p.stdout[-2000:]))
        steps, evals = metrics(tmp, name)
        cu.check(len(steps) == len(ref_steps) and len(evals) == len(ref_evals),
                 "%s: %d steps and %d evaluations logged, DDP %d and %d" % (name, len(steps), len(evals),
                                                                            len(ref_steps), len(ref_evals)))
        worst = 0.0
        for k, ((l, g), (rl, rg)) in enumerate(zip(steps, ref_steps)):
            worst = max(worst, rel(l, rl), rel(g, rg))
            cu.check(rel(l, rl) <= TOL and rel(g, rg) <= TOL, "%s step %d: loss %.8g grad norm %.8g; DDP %.8g %.8g" %
                     (name, k + 1, l, g, rl, rg))
        for e, re_ in zip(evals, ref_evals):
            worst = max(worst, rel(e, re_))
            cu.check(rel(e, re_) <= TOL, "%s: held-out loss %.8g, DDP %.8g" % (name, e, re_))
        print("%s: %d steps, worst relative difference from DDP %.1e" % (name, len(steps), worst))

    # --init: a checkpoint's weights into the tp model (every rank its boxes)
    # train as they do in DDP; the trained weights show in the first loss.
    p, _ = train(tmp, "init_src", ["--threads", "2", "--out", os.path.join(tmp, "init_src")])
    ck = os.path.join(tmp, "init_src", "checkpoints")
    p1, _ = train(tmp, "init_ddp", ["--threads", "2", "--seed", "5", "--init", ck])
    p2, _ = train(tmp, "init_tp", ["--threads", "4", "--tp", "2", "--seed", "5", "--init", ck])
    if cu.check(p.returncode == 0 and p1.returncode == 0 and p2.returncode == 0, "the --init runs failed"):
        a, _ = metrics(tmp, "init_ddp")
        b, _ = metrics(tmp, "init_tp")
        cu.check(len(a) == len(b) == 12 and all(rel(x[0], y[0]) <= TOL and rel(x[1], y[1]) <= TOL
                                                for x, y in zip(a, b)),
                 "--init: tp 2's steps %s differ from DDP's %s" % (b[:3], a[:3]))
        cu.check(a and a[0][0] < ref_steps[0][0] - 0.01, "--init: the first loss %s is not below a fresh run's %s" %
                 (a[0][0] if a else None, ref_steps[0][0]))
        print("--init: tp 2 from a DDP checkpoint trains as DDP does (first loss %.6f, fresh %.6f)" %
              (b[0][0], ref_steps[0][0]))

    # Bad input: one message each, nothing trained.
    bad = [(["--threads", "4", "--tp", "3"], 0, "--tp (parallel.tp) 3 does not divide --n-head 4"),
           (["--threads", "4", "--tp", "2", "--dp", "3"], 0,
            "mesh dp 3 × tp 2 × pp 1 = 6 ranks, but the world has 4"),
           (["--threads", "3", "--tp", "2"], 0, "--tp 2 does not divide the world size 3"),
           (["--threads", "2", "--tp", "2", "--model", "mlp"], 0, "tensor parallelism splits a GPT's layers")]
    if cu.mpiexec():
        bad.append((["--tp", "2"], 3, "cannot infer dp: tp 2 × pp 1 = 2 does not divide the world size 3"))
    for extra, ranks, want in bad:
        p, _ = train(tmp, "bad", extra, mpi_ranks=ranks, expect_ok=False)
        err = p.stderr
        cu.check(p.returncode != 0 and want in err, "%s: exit %d, stderr does not say %r:\n%s" %
                 (" ".join(extra), p.returncode, want, err[-1500:]))
        if ranks == 0:
            cu.check(err.count("plexus train:") == 1, "%s: more than one message:\n%s" % (" ".join(extra), err))
        cu.check("step 1/" not in p.stdout, "%s: trained anyway" % " ".join(extra))
        print("refused (%s): %s" % (" ".join(extra), [l for l in err.splitlines() if want in l][:1]))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_tp_cli_trains_like_ddp_and_rejects_bad_meshes")
