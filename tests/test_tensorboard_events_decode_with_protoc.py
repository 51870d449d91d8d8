"""The TensorBoard event files plexus writes are readable by other tools.

If this fails: the TFRecord framing (u64 LE length, masked CRC-32C of the
length, data, masked CRC-32C of the data) is wrong, so TensorBoard would drop
or reject records; or the hand-encoded Event/Summary protobuf does not decode
with protoc against TensorBoard's field numbers (tests/data/
tensorboard_event.proto); or tags/steps/values differ from what
tests/tools/px_tb_write.c logged (e.g. a NAN scalar was written).
The CRC-32C here is an independent bitwise Python implementation.
"""

import glob
import os
import re
import shutil
import subprocess
import tempfile
import time

import numpy as np

import cli_util as cu
import tb_util

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("PX_BUILD_DIR", "")
TOOL = os.path.join(BUILD, "tests", "px_tb_write")
PROTO_DIR = os.path.join(HERE, "data")
check = cu.check


def f32(x):
    return float(np.float32(x))


def parse_text(txt):
    """protoc text output of one Event -> (step, file_version, {tag: value})."""
    wt = re.search(r"^wall_time: ([0-9.e+]+)", txt, re.M)
    check(wt is not None and abs(float(wt.group(1)) - time.time()) < 3600, "wall_time missing or not now: %s" % txt[:80])
    step = re.search(r"^step: (-?\d+)", txt, re.M)
    fv = re.search(r'^file_version: "([^"]*)"', txt, re.M)
    vals = {}
    for m in re.finditer(r'value \{\s*tag: "([^"]*)"\s*simple_value: ([^\s}]+)\s*\}', txt):
        vals[m.group(1)] = float(m.group(2))
    return (int(step.group(1)) if step else 0), (fv.group(1) if fv else None), vals


def main():
    check(tb_util.crc32c(b"123456789") == 0xE3069283, "python crc32c check value")
    tmp = tempfile.mkdtemp(prefix="px_tb_")
    try:
        logdir = os.path.join(tmp, "runs", "x")
        r = subprocess.run([TOOL, logdir], capture_output=True, text=True)
        check(r.returncode == 0, "px_tb_write failed: %s" % r.stderr)
        files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
        check(len(files) == 1, "expected one event file, got %s" % files)
        if len(files) != 1:
            return
        name = os.path.basename(files[0])
        check(re.match(r"events\.out\.tfevents\.\d+\..+\.\d+$", name) is not None, "file name %s" % name)
        blob = open(files[0], "rb").read()

        records = tb_util.records(blob, check)
        # file_version + 3 steps + 1 eval + 1 scalar
        check(len(records) == 6, "expected 6 records, got %d" % len(records))

        decoded = []
        for i, rec in enumerate(records):
            p = subprocess.run(["protoc", "-I", PROTO_DIR, "--decode=tensorboard.Event",
                                "tensorboard_event.proto"], input=rec, capture_output=True)
            check(p.returncode == 0, "protoc --decode failed on record %d: %s" % (i, p.stderr))
            raw = subprocess.run(["protoc", "--decode_raw"], input=rec, capture_output=True)
            check(raw.returncode == 0, "protoc --decode_raw failed on record %d" % i)
            # decode_raw names fields by number: the schema-free view must agree.
            rt = raw.stdout.decode()
            check(re.search(r"^1: 0x[0-9a-f]+", rt, re.M) is not None, "record %d: no fixed64 field 1 (wall_time)" % i)
            decoded.append(parse_text(p.stdout.decode()))

        step0, fv, vals0 = decoded[0]
        check(fv == "brain.Event:2", "first record file_version %r" % fv)
        check(not vals0, "first record has values")
        for s in (1, 2, 3):
            step, fv, vals = decoded[s]
            check(step == s and fv is None, "record %d step %d" % (s, step))
            want = {"train/loss": 1.0 / s, "train/lr": 0.01 * s, "train/grad_norm": s + 0.5,
                    "train/samples_per_s": 100.0 * s}
            check(set(vals) == set(want), "record %d tags %s" % (s, sorted(vals)))
            for k, v in want.items():
                check(k in vals and abs(vals[k] - f32(v)) <= 1e-6 * max(1, abs(v)), "%s@%d = %s want %s" % (k, s, vals.get(k), v))
        step, _, vals = decoded[4]
        check(step == 3 and vals == {"eval/loss": 0.25, "eval/accuracy": 0.75}, "eval record %d %s" % (step, vals))
        step, _, vals = decoded[5]
        check(step == 7 and vals == {"custom/x": -2.5}, "scalar record %d %s" % (step, vals))

        try:
            from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        except Exception as e:  # noqa: BLE001 - any import failure means "not installed"
            print("tensorboard not importable (%s): skipped the EventFileLoader check" % e)
        else:
            evs = list(EventFileLoader(files[0]).Load())
            check(len(evs) == 6, "EventFileLoader read %d events" % len(evs))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_tensorboard_events_decode_with_protoc")


if __name__ == "__main__":
    main()
