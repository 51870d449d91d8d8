"""zero_util.py -- what the ZeRO tests of the `plexus` command share: reading
a checkpoint's tensors whole, whether it is DDP's (model.safetensors,
optim.safetensors) or sharded (each rank's pieces of named tensors in
model.rank*-of-*.safetensors / optim.rank*-of-*.safetensors, put back
together here with Python alone, as a third-party reader would)."""

import array
import glob
import json
import os
import struct


def read_safetensors(path):
    """(metadata dict, {name: (shape, array of float32)}) of an F32 file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        b, e = t["data_offsets"]
        a = array.array("f")
        a.frombytes(body[b:e])
        out[name] = (tuple(t["shape"]), a)
    return meta, out


def whole(ckpt, what):
    """{key: (shape, list of floats)} of `what` ("model" or "optim") in the
    checkpoint: the whole file if there is one, else its pieces assembled;
    raises AssertionError when pieces overlap or leave a gap."""
    single = os.path.join(ckpt, what + ".safetensors")
    if os.path.exists(single):
        _, t = read_safetensors(single)
        return {k: (s, list(a)) for k, (s, a) in t.items()}
    files = sorted(glob.glob(os.path.join(ckpt, what + ".rank*-of-*.safetensors")))
    assert files, "%s: neither %s.safetensors nor %s.rank*.safetensors" % (ckpt, what, what)
    out, seen = {}, {}
    for path in files:
        meta, tensors = read_safetensors(path)
        assert meta.get("format") == "plexus-pieces", (path, meta.get("format"))
        for name, p in json.loads(meta["pieces"]).items():
            key, shape, off, cnt = p["key"], tuple(p["shape"]), p["offset"], p["count"]
            numel = 1
            for d in shape:
                numel *= d
            if key not in out:
                out[key] = (shape, [None] * numel)
            assert out[key][0] == shape, (path, key, shape, out[key][0])
            data = tensors[name][1]
            assert len(data) == cnt, (path, name, len(data), cnt)
            dst = out[key][1]
            for i in range(cnt):
                assert dst[off + i] is None, "%s: element %d of %s in two pieces" % (path, off + i, key)
                dst[off + i] = data[i]
            seen[key] = seen.get(key, 0) + cnt
    for key, (shape, vals) in out.items():
        assert None not in vals, "%s: %s has elements in no piece" % (ckpt, key)
    return out


def max_rel_diff(a, b):
    """Largest |a - b| over all tensors relative to the tensor's largest |a|;
    None when the key sets differ."""
    if set(a) != set(b):
        return None
    worst = 0.0
    for k in a:
        x, y = a[k][1], b[k][1]
        if a[k][0] != b[k][0]:
            return None
        scale = max(1e-30, max(abs(v) for v in x))
        worst = max(worst, max(abs(u - v) for u, v in zip(x, y)) / scale)
    return worst
