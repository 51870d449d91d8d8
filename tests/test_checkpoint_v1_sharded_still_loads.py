"""Claim: a sharded checkpoint in pieces format version 1, as plexus wrote
it before version 2 and the index (tests/data/ckpt_v1_zero3_mlp: ZeRO 3 on
3 ranks, an MLP 784-4-10, written by the `plexus` binary of main at commit
63d06d2 with `plexus train --model mlp --hidden 4 --depth 1 --data mnist
--train-subset 64 --val-subset 16 --batch-size 8 --optim adam --steps 2
--ckpt-every 2 --threads 3 --zero 3`), still loads: the migration path of
issue 12.

1. the fixture is what it claims: every rank file says "version": "1" and
   there is no metadata.json (so the loads below take the no-index path);
2. `plexus checkpoint consolidate` writes the model bitwise equal to the
   pieces put back together by tests/zero_util.py (plain Python);
3. `plexus train --resume` from it trains on to step 4 under ZeRO 1 on 2
   ranks and under DDP on 1 (other world sizes and stages: resharded), and
   the checkpoint it writes is version 2 with an index (ZeRO) that loads
   again (`consolidate`).

If it failed, upgrading plexus would strand every checkpoint written
before it."""

import json
import os
import shutil
import tempfile

import cli_util as cu
import zero_util as zu

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "data", "ckpt_v1_zero3_mlp", "step_00000002")
ARGS = ["--model", "mlp", "--hidden", "4", "--depth", "1", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "64", "--val-subset", "16", "--batch-size", "8", "--optim", "adam", "--lr", "0.003",
        "--steps", "4", "--ckpt-every", "2", "--progress", "lines", "--workers", "1"]

tmp = tempfile.mkdtemp(prefix="px_ckpt_v1_")
try:
    # 1. Version 1, no index.
    names = sorted(os.listdir(FIXTURE))
    cu.check("metadata.json" not in names, "the fixture has an index: %s" % names)
    for n in names:
        if n.endswith(".safetensors"):
            meta, _ = zu.read_safetensors(os.path.join(FIXTURE, n))
            cu.check(meta.get("format") == "plexus-pieces" and meta.get("version") == "1",
                     "%s: format %s version %s" % (n, meta.get("format"), meta.get("version")))

    # 2. Consolidated, bitwise what the pieces hold.
    dst = os.path.join(tmp, "model.safetensors")
    p = cu.run(["checkpoint", "consolidate", FIXTURE, "--out", dst])
    if cu.check(p.returncode == 0 and os.path.exists(dst), "consolidate of the v1 checkpoint failed"):
        _, got = zu.read_safetensors(dst)
        want = zu.whole(FIXTURE, "model")
        cu.check(set(got) == set(want), "tensors: %s vs %s" % (sorted(got), sorted(want)))
        for k in want:
            if k in got:
                cu.check(got[k][0] == want[k][0] and list(got[k][1]) == want[k][1], "%s differs" % k)

    # 3. Resumed under ZeRO 1 on 2 ranks and DDP on 1, to step 4.
    for label, extra in (("zero1 x2", ["--threads", "2", "--zero", "1"]), ("ddp x1", ["--threads", "1"])):
        out = os.path.join(tmp, label.replace(" ", "_"))
        p = cu.run(["train"] + ARGS + extra + ["--resume", FIXTURE, "--out", out])
        if not cu.check(p.returncode == 0, "%s: resume from the v1 checkpoint failed" % label):
            continue
        cu.check("resharded" in p.stdout + p.stderr, "%s: the log does not say it resharded:\n%s" %
                 (label, (p.stdout + p.stderr)[-2000:]))
        ck = cu.checkpoints(os.path.join(out, "checkpoints"))
        if not cu.check(ck and ck[-1].endswith("step_00000004"), "%s: checkpoints %s" % (label, ck)):
            continue
        names = os.listdir(ck[-1])
        if "zero" in label:
            cu.check("metadata.json" in names, "%s: no index in %s" % (label, names))
            with open(os.path.join(ck[-1], "metadata.json")) as f:
                ix = json.load(f)
            keys = set(zu.whole(ck[-1], "model"))
            listed = set(ix.get("tensors", {}))
            cu.check(ix.get("format") == "plexus-checkpoint-index" and ix.get("version") == 1 and keys and
                     all(k in listed and "exp_avg." + k in listed and "exp_avg_sq." + k in listed for k in keys),
                     "%s: the index lists %s" % (label, sorted(listed)))
            for n in names:
                if n.startswith("optim.rank"):
                    meta, _ = zu.read_safetensors(os.path.join(ck[-1], n))
                    cu.check(meta.get("version") == "2", "%s: %s is version %s" % (label, n, meta.get("version")))
        again = os.path.join(tmp, label.replace(" ", "_") + ".safetensors")
        p = cu.run(["checkpoint", "consolidate", ck[-1], "--out", again])
        cu.check(p.returncode == 0, "%s: the new checkpoint does not consolidate" % label)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_checkpoint_v1_sharded_still_loads")
