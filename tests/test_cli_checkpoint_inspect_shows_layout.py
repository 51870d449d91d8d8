"""Claim: `plexus inspect CKPT` shows the layout a checkpoint was written
with: the world size, the strategy (DDP or the ZeRO stage), the mesh when
state.json holds one, which files each rank wrote, and per file its count
of pieces and of tensors and a summary of its boxes -- all read from the
checkpoint, as these runs wrote it:

- ZeRO 2 on 3 ranks (threads): rank 0 wrote model.safetensors (whole),
  its optim.rank00000-of-00003.safetensors and state.json; ranks 1 and 2
  their optim.rank* file each; every file's piece and tensor counts are
  those its own safetensors header lists (read here in Python);
- DDP on 2 ranks: rank 0 wrote everything, rank 1 nothing;
- the ZeRO-2 checkpoint given a "mesh" {"dp": 1, "tp": 3, "pp": 1} in
  state.json and one more rank-1 file of version-2 pieces, one of them a
  sub-box (a tensor-parallel column block, "box_offset"/"box_size"), with
  SHA256SUMS updated: the mesh line, the sub-box [0:4, 3:6], and rank 1's
  two files.

If it fails, inspect misreads or leaves out who wrote what, the strategy,
the mesh, or the pieces and boxes of a file."""

import hashlib
import json
import os
import re
import shutil
import tempfile

import numpy as np

import cli_util as cu
import pxst

ARGS = ["train", "--model", "mlp", "--hidden", "24", "--depth", "2", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "240", "--val-subset", "32", "--batch-size", "10", "--optim", "adam", "--lr", "0.003",
        "--seed", "3", "--workers", "1", "--steps", "2", "--progress", "lines", "--quiet"]


def layout(text):
    """The lines of inspect's layout part (up to the per-file tensor lists)."""
    lines = text.splitlines()
    if "  layout (as written):" not in lines:
        return []
    start = lines.index("  layout (as written):")
    out = []
    for line in lines[start + 1:]:
        if not line.startswith("    ") and not line.startswith("  files,") and line != "  written by:":
            break
        out.append(line.strip())
    return out


def file_line(lines, name):
    hits = [ln for ln in lines if ln.split(" ", 1)[0] == name]
    return hits[0] if len(hits) == 1 else ""


def check_pieces_counts(ck, lines, label):
    """Each safetensors file's line states the counts its header lists."""
    for name in sorted(os.listdir(ck)):
        if not name.endswith(".safetensors"):
            continue
        tensors, meta = pxst.load(os.path.join(ck, name), with_metadata=True)
        line = file_line(lines, name)
        if meta.get("format") == "plexus-pieces":
            pieces = json.loads(meta["pieces"])
            keys = len({p["key"] for p in pieces.values()})
            elems = sum(int(p["count"]) for p in pieces.values())
            want = "pieces v%s: %d piece%s of %d tensor%s, %d elements" % (
                meta["version"], len(pieces), "" if len(pieces) == 1 else "s", keys, "" if keys == 1 else "s", elems)
        else:
            want = "whole tensors: %d, %d elements (a state dict)" % (
                len(tensors), sum(int(np.prod(t.shape)) for t in tensors.values()))
        cu.check(want in line, "%s: %s: expected %r in %r" % (label, name, want, line))


def inspect(ck, label):
    p = cu.run(["inspect", ck])
    cu.check(p.returncode == 0 and "verified" in p.stdout.splitlines()[0], "%s: inspect failed:\n%s" % (label, p.stdout))
    lines = layout(p.stdout)
    cu.check(lines, "%s: no layout part in:\n%s" % (label, p.stdout[:3000]))
    print("%s:\n    %s" % (label, "\n    ".join(lines)))
    return lines


tmp = tempfile.mkdtemp(prefix="px_cli_inspect_layout_")
try:
    # ZeRO 2, 3 ranks.
    out = os.path.join(tmp, "z2")
    cu.check(cu.run(ARGS + ["--threads", "3", "--zero", "2", "--out", out]).returncode == 0, "zero 2 run failed")
    ck = cu.checkpoints(os.path.join(out, "checkpoints"))[-1]
    lines = inspect(ck, "ZeRO 2, 3 ranks")
    cu.check("world size     3" in lines, "zero 2: no world size 3 line")
    cu.check(any(ln.startswith("strategy       ZeRO stage 2 ") for ln in lines), "zero 2: no strategy line")
    cu.check(not any(ln.startswith("mesh") for ln in lines), "zero 2: a mesh line, but state.json has no mesh")
    ranks = ["rank 1 wrote 1 file: optim.rank00001-of-00003.safetensors",
             "rank 2 wrote 1 file: optim.rank00002-of-00003.safetensors"]
    for r in ranks:
        cu.check(r in lines, "zero 2: no line %r" % r)
    r0 = [ln for ln in lines if ln.startswith("rank 0 wrote 4 files: ")]
    cu.check(len(r0) == 1 and set(r0[0].split(": ", 1)[1].split(", ")) ==
             {"model.safetensors", "optim.rank00000-of-00003.safetensors", "metadata.json", "state.json"},
             "zero 2: rank 0's files are not model, its optimizer shard, the index and state.json: %r" % r0)
    cu.check("the index (plexus-checkpoint-index v1): " in file_line(lines, "metadata.json"),
             "zero 2: metadata.json is not described as the index")
    cu.check("boxes: all whole tensors" in file_line(lines, "optim.rank00001-of-00003.safetensors"),
             "zero 2: ZeRO's pieces are flat ranges of whole tensors")
    check_pieces_counts(ck, lines, "zero 2")

    # DDP, 2 ranks.
    out0 = os.path.join(tmp, "ddp")
    cu.check(cu.run(ARGS + ["--threads", "2", "--zero", "0", "--out", out0]).returncode == 0, "DDP run failed")
    ck0 = cu.checkpoints(os.path.join(out0, "checkpoints"))[-1]
    lines0 = inspect(ck0, "DDP, 2 ranks")
    cu.check("world size     2" in lines0, "DDP: no world size 2 line")
    cu.check(any(ln.startswith("strategy       DDP ") for ln in lines0), "DDP: no strategy line")
    # Every training checkpoint has the index, DDP's too: rank 0 writes it.
    d0 = [ln for ln in lines0 if ln.startswith("rank 0 wrote 4 files: ")]
    cu.check(len(d0) == 1 and set(d0[0].split(": ", 1)[1].split(", ")) ==
             {"model.safetensors", "optim.safetensors", "metadata.json", "state.json"},
             "DDP: rank 0's files are not model, optimizer, the index and state.json: %r" % d0)
    cu.check("the index (plexus-checkpoint-index v1): " in file_line(lines0, "metadata.json"),
             "DDP: metadata.json is not described as the index")
    cu.check("rank 1 wrote nothing" in lines0, "DDP: rank 1 should have written nothing")
    check_pieces_counts(ck0, lines0, "DDP")

    # A mesh in state.json and a rank-1 file of version-2 pieces with a sub-box.
    ckm = os.path.join(tmp, "mesh")
    shutil.copytree(ck, ckm)
    with open(os.path.join(ckm, "state.json")) as f:
        state = json.load(f)
    state["mesh"] = {"dp": 1, "tp": 3, "pp": 1}
    with open(os.path.join(ckm, "state.json"), "w") as f:
        json.dump(state, f)
    extra = "tp.rank00001-of-00003.safetensors"
    pieces = {"w@0": {"key": "w", "dtype": "F32", "shape": [4, 6], "box_offset": [0, 3], "box_size": [4, 3],
                      "offset": 0, "count": 12},
              "b@0": {"key": "b", "dtype": "F32", "shape": [6], "offset": 2, "count": 4}}
    pxst.save(os.path.join(ckm, extra), {"w@0": np.arange(12, dtype=np.float32), "b@0": np.ones(4, np.float32)},
              {"format": "plexus-pieces", "version": "2", "pieces": json.dumps(pieces), "rank": "1"})
    with open(os.path.join(ckm, "SHA256SUMS")) as f:
        sums = [ln for ln in f.read().splitlines() if not ln.endswith("  state.json")]
    for name in ("state.json", extra):
        with open(os.path.join(ckm, name), "rb") as f:
            sums.append("%s  %s" % (hashlib.sha256(f.read()).hexdigest(), name))
    with open(os.path.join(ckm, "SHA256SUMS"), "w") as f:
        f.write("\n".join(sums) + "\n")
    linesm = inspect(ckm, "ZeRO 2, 3 ranks, with a mesh and a version-2 file")
    cu.check("mesh           dp 1, tp 3, pp 1" in linesm, "mesh: no mesh line")
    line = file_line(linesm, extra)
    cu.check(re.search(r"pieces v2: 2 pieces of 2 tensors, 16 elements; boxes: 1 whole tensor, 1 sub-box "
                       r"\(w\[0:4, 3:6\]\); ranges: 1 whole box, 1 part\b", line) is not None,
             "mesh: the version-2 file's line: %r" % line)
    cu.check("rank 1 wrote 2 files: optim.rank00001-of-00003.safetensors, %s" % extra in linesm,
             "mesh: rank 1's two files")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_checkpoint_inspect_shows_layout")
