"""Claim: plexus checkpoint consolidate CKPT --out FILE writes one
safetensors file of the whole model, with the model's state-dict names and
"format": "pt" (what PyTorch's safetensors loaders read), from a checkpoint
of any layout: ZeRO 3 on 3 ranks (no rank ever held the whole model: every
rank's model.rank* pieces) and DDP (model.safetensors).  Its tensors are
bitwise those that a plain-Python reader (zero_util.whole) puts together
from the checkpoint's files.  `plexus train --init CKPT` starts from
such a checkpoint (here ZeRO 3's, into a DDP run on 2 ranks).  A checkpoint with a rank's file missing is refused with a
message naming the file, and no output file appears.

If it failed, a sharded checkpoint could not leave plexus as one model
file, or would leave it with holes or another name for a tensor."""

import array
import os
import shutil
import tempfile

import cli_util as cu
import pxst
import zero_util as zu

ARGS = ["train", "--model", "mlp", "--hidden", "24", "--depth", "2", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "240", "--val-subset", "32", "--batch-size", "10", "--optim", "adam", "--lr", "0.003",
        "--seed", "3", "--workers", "1", "--steps", "4", "--progress", "lines", "--quiet", "--threads", "3"]

tmp = tempfile.mkdtemp(prefix="px_cli_consolidate_")
try:
    for stage in ("3", "0"):
        out = os.path.join(tmp, "z" + stage)
        p = cu.run(ARGS + ["--zero", stage, "--out", out])
        cu.check(p.returncode == 0, "zero %s: training failed" % stage)
        ck = cu.checkpoints(os.path.join(out, "checkpoints"))[-1]
        files = sorted(os.listdir(ck))
        if stage == "3":
            cu.check("model.safetensors" not in files and len([f for f in files if f.startswith("model.rank")]) == 3,
                     "zero 3: files %s" % files)
        dst = os.path.join(tmp, "model%s.safetensors" % stage)
        p = cu.run(["checkpoint", "consolidate", ck, "--out", dst])
        cu.check(p.returncode == 0 and os.path.exists(dst), "zero %s: consolidate failed" % stage)
        got, meta = pxst.load(dst, with_metadata=True)
        cu.check(meta.get("format") == "pt", "zero %s: metadata %s" % (stage, meta))
        want = zu.whole(ck, "model")
        cu.check(sorted(got) == sorted(want), "zero %s: names %s vs %s" % (stage, sorted(got), sorted(want)))
        for name in sorted(set(got) & set(want)):
            shape, vals = want[name]
            cu.check(tuple(got[name].shape) == shape, "zero %s: %s shape %s vs %s" % (stage, name, got[name].shape, shape))
            cu.check(got[name].astype("float32").tobytes() == array.array("f", vals).tobytes(),
                     "zero %s: %s differs from the checkpoint's pieces" % (stage, name))
        print("zero %s: %d tensors consolidated from %s" % (stage, len(got), ", ".join(files)))

    # --init from the ZeRO-3 checkpoint, into DDP on 2 ranks: one step at a
    # learning rate of 1e-12 leaves the weights where the checkpoint had them.
    ck = cu.checkpoints(os.path.join(tmp, "z3", "checkpoints"))[-1]
    init_out = os.path.join(tmp, "init")
    assert ARGS[-2:] == ["--threads", "3"] and ARGS[ARGS.index("--steps") + 1] == "4"
    args = ARGS[:-2] + ["--threads", "2"]
    args[args.index("--steps") + 1] = "1"
    args[args.index("--lr") + 1] = "1e-12"
    p = cu.run(args + ["--init", ck, "--out", init_out])
    cu.check(p.returncode == 0, "--init %s failed" % ck)
    if p.returncode == 0:
        after = zu.whole(cu.checkpoints(os.path.join(init_out, "checkpoints"))[-1], "model")
        before = zu.whole(ck, "model")
        worst = max(max(abs(x - y) for x, y in zip(after[k][1], before[k][1])) for k in before)
        cu.check(worst < 1e-6, "--init: the weights moved %g from the checkpoint's" % worst)

    # A rank's file missing: refused, naming it; no output.
    ck = cu.checkpoints(os.path.join(tmp, "z3", "checkpoints"))[-1]
    broken = os.path.join(tmp, "broken")
    shutil.copytree(ck, broken)
    victim = [f for f in os.listdir(broken) if f.startswith("model.rank00001")][0]
    os.unlink(os.path.join(broken, victim))
    dst = os.path.join(tmp, "never.safetensors")
    p = cu.run(["checkpoint", "consolidate", broken, "--out", dst], expect_ok=False)
    text = p.stdout + p.stderr
    cu.check(p.returncode != 0 and victim in text, "a missing %s: rc %d, message:\n%s" % (victim, p.returncode, text))
    cu.check(not os.path.exists(dst), "a refused consolidate wrote %s" % dst)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_checkpoint_consolidate_writes_the_whole_model")
