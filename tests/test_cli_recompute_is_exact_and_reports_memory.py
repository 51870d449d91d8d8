"""Claim: `plexus train --recompute none|full|selective|every:K` (JSON key
train.recompute) trains the GPT and the ResNet to the same bytes as without
recomputation -- the GPT with dropout on 2 ranks of the threads backend
(DDP, and ZeRO stage 3 with the blocks as units), the ResNet with its batch
norms' running statistics -- and px_train's memory report
line shows the activations' arena high-water mark, smaller with full
recomputation than without.  A policy that does not exist, every:0 (as an
option and as a JSON key) and recomputation of a model without blocks end
the command with one clear message and a non-zero exit.

If it fails, the flag does not reach the model, recomputation changes the
training (masks, statistics), or a typo in the policy is silently ignored."""

import json
import os
import random
import re
import shutil
import tempfile

import cli_util as cu


def weights(out):
    """The bytes of the last checkpoint's model files (one, or one piece per
    rank under ZeRO), in name order."""
    d = os.path.join(out, "checkpoints")
    ck = os.path.join(d, sorted(os.listdir(d))[-1])
    data = b""
    for name in sorted(os.listdir(ck)):
        if name.startswith("model") and name.endswith(".safetensors"):
            with open(os.path.join(ck, name), "rb") as f:
                data += name.encode() + f.read()
    return data


def activations_mib(text):
    """Rank 0's activations (the arena's high-water mark) from px_train's
    memory line: "... activations 1.23 MiB / 1.25 MiB; peak RSS ..."."""
    m = re.search(r"activations ([0-9.]+) (B|KiB|MiB|GiB) /", text)
    if not m:
        return None
    return float(m.group(1)) * {"B": 1.0 / 1048576, "KiB": 1.0 / 1024, "MiB": 1.0, "GiB": 1024.0}[m.group(2)]


def expect_fail(args, *needles):
    p = cu.run(args, expect_ok=False)
    text = p.stdout + p.stderr
    if cu.check(0 < p.returncode < 128, "%s: exit %d, expected a clean failure\n%s" % (args, p.returncode, text)):
        for n in needles:
            cu.check(n in text, "%s: message lacks %r:\n%s" % (args, n, text))
        cu.check(text.count("plexus train:") == 1, "%s: expected one message:\n%s" % (args, text))


tmp = tempfile.mkdtemp(prefix="px_cli_recompute_")
try:
    rng = random.Random(3)
    words = ["w%d" % i for i in range(12)]
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        for _ in range(300):
            f.write(" ".join(rng.choice(words) for _ in range(16)) + "\n")
    gpt = ["train", "--model", "gpt", "--data", "text", "--data-path", corpus, "--n-layer", "3", "--n-embd", "32",
           "--n-head", "2", "--context", "16", "--batch-size", "4", "--steps", "6", "--dropout", "0.1",
           "--threads", "2", "--progress", "lines"]
    got = {}
    for policy in ["none", "full", "every:2", "selective"]:
        out = os.path.join(tmp, "gpt_" + policy.replace(":", "_"))
        p = cu.run(gpt + ["--recompute", policy, "--out", out])
        if not cu.check(p.returncode == 0, "gpt --recompute %s failed" % policy):
            continue
        got[policy] = (weights(out), activations_mib(p.stdout))
        cu.check(got[policy][1] is not None, "gpt --recompute %s: no memory line in\n%s" % (policy, p.stdout))
    if "none" in got:
        for policy, (w, mib) in got.items():
            cu.check(w == got["none"][0], "gpt --recompute %s: weights differ from --recompute none" % policy)
        if "full" in got and got["full"][1] is not None and got["none"][1] is not None:
            cu.check(got["full"][1] < got["none"][1], "activations: full %.2f MiB, none %.2f MiB" %
                     (got["full"][1], got["none"][1]))

    # ZeRO stage 3 with the blocks as units: the recompute uses each unit's
    # backward gather; the same weights as stage 3 without recomputation.
    zw = {}
    for policy in ["none", "full"]:
        out = os.path.join(tmp, "zero3_" + policy)
        p = cu.run(gpt + ["--zero", "3", "--zero-unit", "h.0,h.1,h.2", "--recompute", policy, "--out", out])
        if cu.check(p.returncode == 0, "gpt --zero 3 --recompute %s failed" % policy):
            zw[policy] = weights(out)
    cu.check(len(zw) == 2 and zw["none"] == zw["full"], "gpt --zero 3: weights differ with --recompute full")

    # The ResNet through the JSON key; batch norm's running statistics are in model.safetensors.
    res = ["train", "--model", "resnet", "--blocks", "1", "--width", "4", "--data-path", cu.FMNIST,
           "--train-subset", "64", "--val-subset", "32", "--batch-size", "16", "--steps", "3", "--quiet"]
    rw = {}
    for policy in ["none", "selective", "full"]:
        cfg = os.path.join(tmp, "r_%s.json" % policy)
        with open(cfg, "w") as f:
            json.dump({"train": {"recompute": policy}}, f)
        out = os.path.join(tmp, "res_" + policy)
        p = cu.run(res + ["--config", cfg, "--out", out])
        if cu.check(p.returncode == 0, "resnet train.recompute %s failed" % policy):
            rw[policy] = weights(out)
    for policy in rw:
        cu.check(rw[policy] == rw.get("none"), "resnet train.recompute %s: weights differ from none" % policy)

    expect_fail(gpt + ["--recompute", "fulll"], 'recompute policy "fulll" does not exist',
                "none, full, selective or every:K")
    expect_fail(gpt + ["--recompute", "every:0"], "--recompute", "every:0", ">= 1")
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        json.dump({"train": {"recompute": "every:0"}}, f)
    expect_fail(gpt + ["--config", bad], "train.recompute", "every:0")
    expect_fail(["train", "--model", "cnn", "--data-path", cu.FMNIST, "--steps", "1", "--recompute", "full"],
                "--model cnn has no blocks")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_recompute_is_exact_and_reports_memory")
