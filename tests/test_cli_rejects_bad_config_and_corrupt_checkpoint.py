"""Claim: bad input to the plexus command ends it with a non-zero exit and
one clear message that names what is wrong -- the key or option, the file --
and never a crash or a silent default:

  config file: unknown key (with a suggestion), unknown section, wrong type,
               invalid JSON (with the line), a number out of range;
  options:     unknown option (with a suggestion), missing value, a value
               not among the choices, nonsensical numbers;
  data:        a data path that does not exist;
  checkpoints: a corrupted model.safetensors (named, with both hashes) for
               eval and resume, a path that is not a checkpoint.

And the good paths around them: --help documents every option with its
default; the effective config saved as OUT/config.json loads back with
--config and gives the same config."""

import json
import os
import shutil
import subprocess
import tempfile

import cli_util as cu


def expect_fail(args, *needles, label=None):
    p = cu.run(args, expect_ok=False)
    label = label or " ".join(args[:4])
    text = p.stdout + p.stderr
    if not cu.check(p.returncode not in (0,) and p.returncode < 128 and p.returncode > 0,
                    "%s: exit %d, expected a clean non-zero exit\n%s" % (label, p.returncode, text)):
        return
    for n in needles:
        cu.check(n in text, "%s: message lacks %r:\n%s" % (label, n, text))
    cu.check("Segmentation" not in text and "AddressSanitizer" not in text, "%s: crashed:\n%s" % (label, text))


tmp = tempfile.mkdtemp(prefix="px_cli_bad_")
try:
    def cfg(obj, name="c.json"):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(obj if isinstance(obj, str) else json.dumps(obj))
        return path

    base = ["train", "--data-path", cu.FMNIST, "--train-subset", "64", "--steps", "1", "--quiet"]
    expect_fail(base + ["--config", cfg({"optim": {"lrr": 0.1}})], "unknown key", "optim.lrr", "optim.lr")
    expect_fail(base + ["--config", cfg({"optimizer": {"lr": 0.1}})], "unknown section", "optimizer")
    expect_fail(base + ["--config", cfg({"optim": {"lr": "fast"}})], "optim.lr", "expected a number")
    expect_fail(base + ["--config", cfg({"train": {"epochs": 2.5}})], "train.epochs", "integer")
    expect_fail(base + ["--config", cfg('{"optim": {"lr": 0.1,}\n}')], "not valid JSON", "line")
    expect_fail(base + ["--config", cfg({"data": {"batch_size": 0}})], "data.batch_size", "outside")
    expect_fail(base + ["--config", os.path.join(tmp, "missing.json")], "missing.json", "cannot open")
    expect_fail(base + ["--bach-size", "8"], "unknown option --bach-size", "--batch-size")
    expect_fail(base + ["--lr"], "--lr needs a value")
    expect_fail(base + ["--optim", "lion"], "--optim", "lion", "sgd|adam|adamw")
    expect_fail(base + ["--lr", "-1"], "--lr", "outside")
    expect_fail(base + ["--workers", "many"], "--workers", "expected an integer")
    expect_fail(base + ["--n-embd", "100", "--n-head", "3"], "not divisible")
    expect_fail(["train", "--data-path", "/nonexistent/fmnist", "--steps", "1"], "data.path",
                "/nonexistent/fmnist", "does not exist")
    expect_fail(["train", "--data-path", tmp, "--steps", "1", "--quiet"], tmp, label="empty data directory")
    expect_fail(["frobnicate"], "unknown command")

    # --help: every option with its default and its JSON key.
    h = cu.run(["train", "--help"])
    cu.check(h.returncode == 0, "train --help failed")
    for opt in ("--model", "--batch-size", "--lr", "--epochs", "--threads", "--ckpt-dir", "--resume",
                "--tensorboard", "--jsonl", "--accum-steps", "--clip-grad", "--bucket-mb"):
        cu.check(opt in h.stdout, "--help lacks %s" % opt)
    cu.check("(default 64)" in h.stdout and "[data.batch_size]" in h.stdout, "--help lacks defaults or keys")

    # A real run, whose saved config (OUT/config.json) loads back, and whose checkpoint we then corrupt.
    out = os.path.join(tmp, "run")
    p = cu.run(["train", "--model", "mlp", "--hidden", "16", "--data-path", cu.FMNIST, "--train-subset", "128",
                "--val-subset", "64", "--steps", "2", "--out", out, "--progress", "lines"])
    cu.check(p.returncode == 0, "the small run failed")
    with open(os.path.join(out, "config.json")) as f:
        printed = json.load(f)
    cu.check(printed["data"]["batch_size"] == 64 and printed["model"]["name"] == "mlp",
             "saved config: %s" % printed)
    again = cu.run(["train", "--config", cfg(printed, "printed.json"), "--steps", "1", "--out",
                    os.path.join(tmp, "again"), "--progress", "lines"])
    cu.check(again.returncode == 0, "the saved config does not load back with --config")
    with open(os.path.join(tmp, "again", "config.json")) as f:
        j2 = json.load(f)
    j2["run"]["out"] = printed["run"]["out"]
    j2["train"]["steps"] = printed["train"]["steps"]
    cu.check(j2 == printed, "the config saved by a run started from it differs")

    ck = cu.checkpoints(os.path.join(out, "checkpoints"))[-1]
    model = os.path.join(ck, "model.safetensors")
    data = bytearray(open(model, "rb").read())
    data[-5] ^= 0x40
    open(model, "wb").write(bytes(data))
    expect_fail(["eval", "--checkpoint", ck], "model.safetensors", "SHA-256")
    expect_fail(["train", "--model", "mlp", "--hidden", "16", "--data-path", cu.FMNIST, "--train-subset", "128",
                 "--steps", "4", "--resume", ck, "--quiet"], "model.safetensors")
    expect_fail(["eval", "--checkpoint", tmp], tmp, label="eval of a directory without checkpoints")
    expect_fail(["inspect", os.path.join(tmp, "c.json")], "c.json", label="inspect of a non-safetensors file")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_rejects_bad_config_and_corrupt_checkpoint")
