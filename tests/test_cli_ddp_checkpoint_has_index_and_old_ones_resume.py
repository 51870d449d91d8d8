"""Claim: a DDP checkpoint (2 ranks, threads) has the index like a sharded
one: rank 0 writes metadata.json beside model.safetensors and
optim.safetensors, listing every model tensor and its Adam state, and
SHA256SUMS covers it; and a DDP checkpoint without the index (as plexus
wrote them before: metadata.json and its SHA256SUMS line removed) still
resumes, to the same bits as resuming from the indexed one.

If it failed, DDP checkpoints would lack issue 12's one metadata file, or
upgrading plexus would strand the DDP checkpoints written before it."""

import hashlib
import json
import os
import shutil
import tempfile

import cli_util as cu

ARGS = ["--model", "mlp", "--hidden", "4", "--depth", "1", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "64", "--val-subset", "16", "--batch-size", "8", "--optim", "adam", "--lr", "0.003",
        "--ckpt-every", "2", "--progress", "lines", "--workers", "1", "--threads", "2", "--zero", "0"]


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


tmp = tempfile.mkdtemp(prefix="px_ddp_index_")
try:
    out = os.path.join(tmp, "first")
    p = cu.run(["train"] + ARGS + ["--steps", "2", "--out", out])
    ck = cu.checkpoints(os.path.join(out, "checkpoints")) if p.returncode == 0 else []
    if cu.check(ck, "DDP training to step 2 wrote no checkpoint:\n%s" % (p.stdout + p.stderr)[-2000:]):
        ck = ck[-1]
        names = set(os.listdir(ck))
        cu.check({"model.safetensors", "optim.safetensors", "metadata.json", "state.json", "SHA256SUMS"} <= names,
                 "DDP checkpoint files: %s" % sorted(names))
        cu.check("metadata.json" in cu.sha256sums(ck), "SHA256SUMS does not cover metadata.json")
        ix = {}
        if "metadata.json" in names:
            with open(os.path.join(ck, "metadata.json")) as f:
                ix = json.load(f)
        listed = set(ix.get("tensors", {}))
        cu.check(ix.get("format") == "plexus-checkpoint-index" and listed and
                 any(k.startswith("exp_avg.") for k in listed) and any(k.startswith("exp_avg_sq.") for k in listed),
                 "the index lists %s" % sorted(listed))

        # The same checkpoint as an old plexus wrote it: no index.
        old = os.path.join(tmp, "old", os.path.basename(ck))
        shutil.copytree(ck, old)
        if os.path.exists(os.path.join(old, "metadata.json")):
            os.remove(os.path.join(old, "metadata.json"))
        with open(os.path.join(old, "SHA256SUMS")) as f:
            lines = [ln for ln in f if not ln.rstrip("\n").endswith("  metadata.json")]
        with open(os.path.join(old, "SHA256SUMS"), "w") as f:
            f.writelines(lines)

        finals = {}
        for label, src in (("indexed", ck), ("old", old)):
            o = os.path.join(tmp, "resumed_" + label)
            p = cu.run(["train"] + ARGS + ["--steps", "4", "--resume", src, "--out", o])
            got = cu.checkpoints(os.path.join(o, "checkpoints")) if p.returncode == 0 else []
            if cu.check(got and got[-1].endswith("step_00000004"),
                        "%s: resume failed:\n%s" % (label, (p.stdout + p.stderr)[-2000:])):
                finals[label] = (sha(os.path.join(got[-1], "model.safetensors")),
                                 sha(os.path.join(got[-1], "optim.safetensors")))
        if len(finals) == 2:
            cu.check(finals["indexed"] == finals["old"],
                     "resuming from the checkpoint without the index gives other bits: %s" % finals)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_ddp_checkpoint_has_index_and_old_ones_resume")
