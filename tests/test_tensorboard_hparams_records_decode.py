"""Claim: px_log_hparams writes TensorBoard's HParams plugin record, so the
HParams tab shows a run's hyperparameters: after the file_version record,
one TFRecord (both masked CRC-32Cs right) holding an Event whose Summary has
one Value with tag "_hparams_/session_start_info", a scalar DT_FLOAT tensor,
and metadata.plugin_data {plugin_name "hparams", content =
HParamsPluginData{session_start_info = SessionStartInfo{hparams map,
group_name, start_time_secs}}}, field numbers as
tensorboard/plugins/hparams/plugin_data.proto.  The map holds every scalar
of tests/tools/px_tb_write.c's JSON, nested keys joined with "." (numbers as
number_value, strings string_value, booleans bool_value, arrays their JSON
text, null left out).  Decoded here with a small protobuf wire-format
reader (no protobuf library); cross-checked with `protoc --decode_raw`
when protoc is installed."""

import glob
import os
import shutil
import struct
import subprocess
import tempfile
import time

import cli_util as cu
import tb_util

BUILD = os.environ.get("PX_BUILD_DIR", "")
TOOL = os.path.join(BUILD, "tests", "px_tb_write")
check = cu.check


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def fields(b):
    """[(field number, wire type, value)]: value an int (varint), bytes
    (length-delimited), or raw 8/4 bytes (fixed64/fixed32)."""
    out, i = [], 0
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 1:
            v, i = b[i:i + 8], i + 8
        elif w == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif w == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % w)
        out.append((f, w, v))
    if i != len(b):
        raise ValueError("message overruns its bytes")
    return out


def one(fs, num, wire):
    got = [v for f, w, v in fs if f == num]
    check(len(got) == 1, "field %d: expected once, found %d" % (num, len(got)))
    check(all(w == wire for f, w, v in fs if f == num), "field %d: wire type" % num)
    return got[0] if got else None


def pb_value(b):
    """google.protobuf.Value -> a Python value."""
    fs = fields(b)
    check(len(fs) == 1, "Value holds one kind: %r" % fs)
    f, w, v = fs[0]
    if f == 2 and w == 1:
        return struct.unpack("<d", v)[0]
    if f == 3 and w == 2:
        return v.decode()
    if f == 4 and w == 0:
        return bool(v)
    check(False, "Value field %d wire %d" % (f, w))
    return None


def main():
    tmp = tempfile.mkdtemp(prefix="px_tbhp_")
    try:
        r = subprocess.run([TOOL, tmp, "hparams"], capture_output=True, text=True)
        check(r.returncode == 0, "px_tb_write hparams: %s" % r.stderr)
        files = glob.glob(os.path.join(tmp, "events.out.tfevents.*"))
        if not check(len(files) == 1, "one event file: %s" % files):
            return
        blob = open(files[0], "rb").read()
        records = tb_util.records(blob, check)
        # file_version, then the hparams record; the refused array wrote nothing.
        if not check(len(records) == 2, "2 records (file_version, hparams), got %d" % len(records)):
            return
        ev = fields(records[1])
        wall = struct.unpack("<d", one(ev, 1, 1))[0]
        check(abs(wall - time.time()) < 3600, "wall_time now")
        check(one(ev, 2, 0) == 0, "step 0")
        summary = fields(one(ev, 5, 2))
        value = fields(one(summary, 1, 2))
        check(one(value, 1, 2) == b"_hparams_/session_start_info", "tag")
        tensor = fields(one(value, 8, 2))
        check(one(tensor, 1, 0) == 1, "tensor dtype DT_FLOAT")
        check(one(tensor, 2, 2) == b"", "scalar shape")
        meta = fields(one(value, 9, 2))
        pd = fields(one(meta, 1, 2))
        check(one(pd, 1, 2) == b"hparams", "plugin_name hparams")
        plugin = fields(one(pd, 2, 2))
        check(not [f for f, w, v in plugin if f == 1 and v != 0], "version 0")
        info = fields(one(plugin, 3, 2))
        hp = {}
        for f, w, v in info:
            if f == 1:
                entry = fields(v)
                hp[one(entry, 1, 2).decode()] = pb_value(one(entry, 2, 2))
        want = {"model.name": "cnn", "model.width": 32.0, "optim.lr": 0.002, "optim.nesterov": True,
                "data.mean": "[0.5,0.25]", "seed": -3.0}
        check(hp == want, "hparams map %r, expected %r" % (hp, want))
        check(one(info, 4, 2) == b"grp", "group_name")
        start = struct.unpack("<d", one(info, 5, 1))[0]
        check(abs(start - wall) < 1, "start_time_secs %r vs wall_time %r" % (start, wall))
        if shutil.which("protoc"):
            p = subprocess.run(["protoc", "--decode_raw"], input=records[1], capture_output=True)
            check(p.returncode == 0 and b"_hparams_/session_start_info" in p.stdout, "protoc --decode_raw")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    cu.finish("test_tensorboard_hparams_records_decode")
    print("test_tensorboard_hparams_records_decode: ok")
