"""pxst.py -- a tiny safetensors reader and writer over numpy, for tests.

The file layout (https://github.com/huggingface/safetensors):

    u64 little-endian N | N bytes of JSON header | data
    header: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
             "__metadata__": {"key": "value"}}
    offsets are relative to the first byte after the header.

Debian's python3 has torch and numpy but not the `safetensors` package, and
the tests must not pip-install anything; this is the subset they need.
Tensors are written in the order given, each starting on an 8-byte boundary
(the header is space-padded to a multiple of 8, as the reference writer does),
so readers that map the file can view the data in place.
"""

import json
import struct

import numpy as np

# safetensors dtype name <-> numpy dtype (all little-endian).
_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def _name_of(dtype):
    dtype = np.dtype(dtype)
    for name, d in _DTYPES.items():
        if d.kind == dtype.kind and d.itemsize == dtype.itemsize:
            return name
    raise ValueError(f"pxst: no safetensors dtype for numpy {dtype}")


def save(path, tensors, metadata=None):
    """Write {name: numpy array} (in dict order) and optional {str: str}
    metadata to `path`."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        if name == "__metadata__":
            raise ValueError("pxst: '__metadata__' is not a tensor name")
        a = np.asarray(arr)
        dname = _name_of(a.dtype)
        data = np.ascontiguousarray(a, dtype=_DTYPES[dname]).tobytes()
        pad = (-offset) % 8
        if pad:
            blobs.append(b"\0" * pad)
            offset += pad
        header[name] = {"dtype": dname, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-(8 + len(text))) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path, with_metadata=False):
    """Read `path` into {name: numpy array} (file order; copies, writable).
    With with_metadata, return (tensors, metadata)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"pxst: {path}: shorter than the 8-byte header size")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"pxst: {path}: header size {n} runs past the end of the file ({len(raw)} bytes)")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    body = memoryview(raw)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dt = _DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"pxst: {path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= b <= e <= len(body)) or e - b != count * dt.itemsize:
            raise ValueError(f"pxst: {path}: tensor {name!r} offsets [{b}, {e}] do not fit "
                             f"shape {list(shape)} {info['dtype']} in a {len(body)}-byte body")
        out[name] = np.frombuffer(body[b:e], dtype=dt).reshape(shape).copy()
    return (out, metadata) if with_metadata else out
