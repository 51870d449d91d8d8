"""Claim: bad ZeRO settings end `plexus train` with a non-zero exit and one
clear message that names what is wrong, never a crash, a hang or a silent
fallback to DDP:

  --zero 4 (and "zero": 4 in a JSON config): no such stage, the stages listed;
  --zero-unit without --zero 3;  --zero-unit with an empty name;
  --zero 3 --zero-unit NAME where NAME is no module (the model's top-level
  modules are listed);  a unit that holds no parameters (a ReLU: it cannot
  cover anything);  units that nest (one inside another).

And --help documents --zero, --zero-unit, --zero-prefetch, --zero-reshard
with their JSON keys."""

import json
import os
import shutil
import tempfile

import cli_util as cu

BASE = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "64", "--val-subset", "32", "--batch-size", "16", "--steps", "2", "--quiet",
        "--threads", "2"]


def expect_fail(args, *needles):
    p = cu.run(BASE + args, expect_ok=False, timeout=120)
    text = p.stdout + p.stderr
    label = " ".join(args)
    if not cu.check(0 < p.returncode < 128, "%s: exit %d, expected a clean non-zero exit\n%s" %
                    (label, p.returncode, text[-2000:])):
        return
    for n in needles:
        cu.check(n in text, "%s: message lacks %r:\n%s" % (label, n, text[-2000:]))
    cu.check("Segmentation" not in text and "AddressSanitizer" not in text, "%s: crashed:\n%s" % (label, text))
    cu.check("done:" not in text, "%s: trained anyway" % label)


tmp = tempfile.mkdtemp(prefix="px_cli_zero_bad_")
try:
    expect_fail(["--zero", "4"], "--zero (parallel.zero) 4", "no such ZeRO stage", "0 (DDP)", "3 (and the parameters)")
    cfg = os.path.join(tmp, "c.json")
    with open(cfg, "w") as f:
        json.dump({"parallel": {"zero": 4}}, f)
    expect_fail(["--config", cfg], "--zero (parallel.zero) 4", "no such ZeRO stage")
    expect_fail(["--zero", "2", "--zero-unit", "0"], "--zero-unit", "applies to --zero 3 only", "--zero 2")
    expect_fail(["--zero", "3", "--zero-unit", "0,,4"], "--zero-unit", "an empty module name")
    expect_fail(["--zero", "3", "--zero-unit", "0,nosuch"], "unit \"nosuch\" names no module",
                "top-level modules are", "\"0\" (Conv2d)")
    expect_fail(["--zero", "3", "--zero-unit", "2"], "unit \"2\"", "holds no parameters")

    h = cu.run(["train", "--help"])
    for flag, key in (("--zero", "parallel.zero"), ("--zero-unit", "parallel.zero_unit"),
                      ("--zero-prefetch", "parallel.zero_prefetch"), ("--zero-reshard", "parallel.zero_reshard")):
        cu.check(flag + " " in h.stdout and "[%s]" % key in h.stdout, "--help lacks %s [%s]" % (flag, key))

    # Nested units, on the GPT (its blocks live under "h").
    txt = os.path.join(tmp, "t.txt")
    with open(txt, "w") as f:
        f.write("a b c d e f g h\n" * 200)
    p = cu.run(["train", "--model", "gpt", "--data", "text", "--data-path", txt, "--context", "8", "--n-layer", "2",
                "--n-head", "2", "--n-embd", "16", "--batch-size", "4", "--steps", "1", "--quiet", "--threads", "2",
                "--zero", "3", "--zero-unit", "h,h.0"], expect_ok=False, timeout=120)
    text = p.stdout + p.stderr
    cu.check(0 < p.returncode < 128 and "units cannot nest" in text and "\"h.0\"" in text,
             "nested units: exit %d\n%s" % (p.returncode, text[-2000:]))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_zero_rejects_bad_input")
