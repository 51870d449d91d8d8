"""Claim: `plexus train --stage DIR --data-path s3://...` copies the objects
once per node and trains from the copy as from the local files.  Two ranks
(threads) on moto's S3 server (127.0.0.1, every request SigV4-checked),
through a proxy that counts the GETs of objects and cuts one of them
mid-object:

  - token shards given as a key prefix: exactly one stage line (local rank
    0's) saying it copied 3 of 3; the cut GET is retried; the staged files
    are the objects' bytes; the losses equal a run from the local files;
  - a second run copies 0 of 3 and sends no GET of an object (listing only);
  - a staged shard truncated between runs is fetched again (copied 1,
    damaged 1, one object GET) and the losses stay the local run's;
  - an object replaced by other bytes of the same size (a new ETag) is
    fetched again (copied 1, damaged 0);
  - the same shards as a glob (s3://.../tok_*.bin): its own set, 3 of 3,
    the local losses; a prefix ending in '/' is refused, saying what to give;
  - Fashion-MNIST's four IDX objects under s3://.../fmnist (beside a
    "folder" marker key fmnist/): 4 of 4, the CNN's losses equal the local
    directory's; a second run copies 0;
  - a text file as one object: 1 of 1, the local file's losses;
  - an HDF5 file (h5py) as one object: refused without --stage, saying to
    stage it; staged 1 of 1 with the local file's losses; again 0 of 1;
  - an image listing and its 8 PNGs (--data images): 9 of 9, the local
    listing's losses; again 0 of 9.

If it failed, both ranks would copy, later runs would download again, a
truncated or replaced copy would be trained on, or the staged bytes would
not be the objects'."""

import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import s3_util as u  # noqa: E402

import boto3  # noqa: E402

SHARDS = 3


def small_shards(d):
    """Three shards of a 64-token vocabulary (the GPT below is tiny)."""
    rng = random.Random(11)
    names = []
    for k in range(SHARDS):
        n = 3000 + 700 * k
        name = "tok_%06d.bin" % k
        u.write_shard(os.path.join(d, name), [rng.randrange(64) for _ in range(n)])
        names.append(name)
    return names


def train(kind, path, out, env, stage=None):
    if kind == "tokens":
        args = ["--model", "gpt", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--context", "16",
                "--vocab-size", "64", "--data", "tokens", "--batch-size", "4"]
    elif kind == "hdf5":
        args = ["--model", "cnn", "--channels", "4", "--data", "hdf5", "--h5-x", "images", "--h5-y", "labels",
                "--batch-size", "16"]
    elif kind == "images":
        args = ["--model", "cnn", "--channels", "4", "--data", "images", "--image-channels", "1", "--batch-size", "4"]
    elif kind == "text":
        args = ["--model", "gpt", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--context", "8", "--data",
                "text", "--batch-size", "4"]
    else:
        args = ["--model", "cnn", "--channels", "4", "--data", "mnist", "--train-subset", "256", "--val-subset", "32",
                "--batch-size", "16", "--eval-every", "4"]
    args = [u.PLEXUS, "train", "--threads", "2", "--data-path", path, "--steps", "4", "--log-every", "1", "--seed",
            "3", "--progress", "lines", "--out", out] + args
    if stage:
        args += ["--stage", stage]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    losses = None
    if p.returncode == 0:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        losses = [(r["type"], r.get("step"), r.get("loss")) for r in recs if r["type"] in ("step", "eval")]
    else:
        print("plexus train %s: exit %d\n%s%s" % (path, p.returncode, p.stdout[-3000:], p.stderr[-3000:]), flush=True)
    return p, losses


def check_stage(p, label, copied, files, damaged=0):
    """Exactly one stage line, rank 0's, with these counts; returns the set's directory."""
    lines = [l for l in (p.stdout + p.stderr).splitlines() if "plexus train: stage:" in l]
    if not u.check(len(lines) == 1, "%s: %d stage lines, expected exactly one (local rank 0's):\n%s" %
                   (label, len(lines), "\n".join(lines))):
        return None
    m = re.search(r"rank (\d+) \(local rank 0\): .*copied (\d+) of (\d+) files.*reused (\d+), damaged (\d+) .*"
                  r"into (\S+)", lines[0])
    if not u.check(m, "%s: unreadable stage line: %s" % (label, lines[0])):
        return None
    got = tuple(int(g) for g in m.groups()[:5])
    want = (0, copied, files, files - copied, damaged)
    u.check(got == want, "%s: stage line says rank %d copied %d of %d, reused %d, damaged %d; expected %s" %
            ((label,) + got + (want,)))
    print("%s: %s" % (label, lines[0]), flush=True)
    return m.group(6)


t0 = time.time()
srv = u.S3()
tmp = tempfile.mkdtemp(prefix="px_stage_s3_")
shm = tempfile.mkdtemp(prefix="px_stage_s3_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
try:
    local = os.path.join(tmp, "small")
    os.makedirs(local)
    names = small_shards(local)
    s3 = boto3.client("s3", endpoint_url=srv.endpoint, region_name="us-east-1", aws_access_key_id=srv.key_id,
                      aws_secret_access_key=srv.secret)
    for name in names:
        with open(os.path.join(local, name), "rb") as f:
            s3.put_object(Bucket=u.BUCKET, Key="small/" + name, Body=f.read())
    env = srv.env()
    stage = os.path.join(shm, "stage")

    _, ref = train("tokens", os.path.join(local, "tok_*.bin"), os.path.join(tmp, "ref"), env)
    u.check(ref and len([r for r in ref if r[0] == "step"]) == 4, "tokens: 4 steps from the local files: %r" % ref)

    # 1. A key prefix, through a proxy that cuts the second shard's GET after 100 bytes.
    proxy = u.CuttingProxy(srv.port, "/%s/small/tok_" % u.BUCKET, after=100, cuts=1, skip=1)
    penv = srv.env(proxy.endpoint)
    prefix = "s3://%s/small/tok_" % u.BUCKET
    p, l1 = train("tokens", prefix, os.path.join(tmp, "t1"), penv, stage)
    staged = check_stage(p, "prefix, first run", copied=SHARDS, files=SHARDS)
    u.check(l1 == ref, "prefix: losses from the stage %s differ from the local files' %s" % (l1, ref))
    u.check(proxy.cut == 1 and "attempt 1 of 5 failed" in p.stderr,
            "prefix: the proxy cut one GET (cut %d) and it was retried: %s" % (proxy.cut, p.stderr[-1500:]))
    u.check(proxy.gets == SHARDS + 1, "prefix, first run: %d GETs of objects, expected %d (one per shard, one retry)"
            % (proxy.gets, SHARDS + 1))
    for name in names:
        a = open(os.path.join(local, name), "rb").read()
        b = open(os.path.join(staged, name), "rb").read() if staged and os.path.exists(os.path.join(staged, name)) \
            else b""
        u.check(a == b, "prefix: the staged %s is not the object's bytes" % name)
    manifest = open(os.path.join(staged, "MANIFEST")).read() if staged else ""
    u.check(manifest.count(" etag:") == SHARDS and "etag: " not in manifest,
            "prefix: the MANIFEST records each object's ETag:\n%s" % manifest)

    # 2. Again: nothing copied, no object downloaded.
    before = proxy.gets
    p, l2 = train("tokens", prefix, os.path.join(tmp, "t2"), penv, stage)
    check_stage(p, "prefix, second run", copied=0, files=SHARDS)
    u.check(proxy.gets == before, "prefix, second run: %d GETs of objects, expected none" % (proxy.gets - before))
    u.check(l2 == ref, "prefix, reused stage: losses differ")

    # 3. A staged shard truncated: fetched again alone.
    victim = os.path.join(staged or tmp, names[1])
    if os.path.exists(victim):
        os.truncate(victim, os.path.getsize(victim) // 2)
    before = proxy.gets
    p, l3 = train("tokens", prefix, os.path.join(tmp, "t3"), penv, stage)
    check_stage(p, "prefix, truncated copy", copied=1, files=SHARDS, damaged=1)
    u.check(proxy.gets - before == 1, "prefix, truncated copy: %d GETs of objects, expected 1" % (proxy.gets - before))
    u.check(l3 == ref, "prefix, after re-fetching a truncated shard: losses differ")

    # 4. An object replaced at the same size: a new ETag, fetched again.
    data = bytearray(open(os.path.join(local, names[2]), "rb").read())
    data[-2:] = struct.pack("<H", (struct.unpack("<H", bytes(data[-2:]))[0] + 1) % 64)
    s3.put_object(Bucket=u.BUCKET, Key="small/" + names[2], Body=bytes(data))
    p, _ = train("tokens", prefix, os.path.join(tmp, "t4"), penv, stage)
    check_stage(p, "prefix, object replaced at the same size", copied=1, files=SHARDS, damaged=0)
    got = open(os.path.join(staged, names[2]), "rb").read() if staged else b""
    u.check(got == bytes(data), "prefix: the replaced object's new bytes are staged")
    with open(os.path.join(local, names[2]), "wb") as f:
        f.write(data)
    proxy.close()

    # 5. A glob: its own set, trained like the local files (now with the new shard).
    _, ref2 = train("tokens", os.path.join(local, "tok_*.bin"), os.path.join(tmp, "ref2"), env)
    p, l5 = train("tokens", "s3://%s/small/tok_*.bin" % u.BUCKET, os.path.join(tmp, "t5"), env, stage)
    check_stage(p, "glob, first run", copied=SHARDS, files=SHARDS)
    u.check(ref2 and l5 == ref2, "glob: losses from the stage %s differ from the local files' %s" % (l5, ref2))

    # A prefix ending in '/' is refused (SET/* would match the MANIFEST), saying what to give.
    p, _ = train("tokens", "s3://%s/small/" % u.BUCKET, os.path.join(tmp, "t6"), env, stage)
    u.check(p.returncode != 0 and "give the shards as a glob (s3://px-data/small/*.bin)" in p.stderr,
            "a '/'-ended prefix: exit %d, %s" % (p.returncode, p.stderr[-800:]))

    # 6. Fashion-MNIST's IDX objects (gzip) under a prefix that also has a
    # "folder" marker key (fmnist/, as the AWS console makes one).
    s3.put_object(Bucket=u.BUCKET, Key="fmnist/", Body=b"")
    _, mref = train("mnist", os.path.join(srv.local, "fmnist"), os.path.join(tmp, "mref"), env)
    u.check(mref and len([r for r in mref if r[0] == "step"]) == 4, "mnist: 4 steps from the local files: %r" % mref)
    p, m1 = train("mnist", "s3://%s/fmnist" % u.BUCKET, os.path.join(tmp, "m1"), env, stage)
    mstaged = check_stage(p, "mnist, first run", copied=4, files=4)
    for name in sorted(os.listdir(os.path.join(srv.local, "fmnist"))):  # train-images: 26 MB, two ranged GETs
        a = open(os.path.join(srv.local, "fmnist", name), "rb").read()
        b = open(os.path.join(mstaged, name), "rb").read() if mstaged and os.path.exists(os.path.join(mstaged, name)) \
            else b""
        u.check(a == b, "mnist: the staged %s is not the object's bytes" % name)
    u.check(m1 == mref, "mnist: losses from the stage %s differ from the local files' %s" % (m1, mref))
    p, m2 = train("mnist", "s3://%s/fmnist" % u.BUCKET, os.path.join(tmp, "m2"), env, stage)
    check_stage(p, "mnist, second run", copied=0, files=4)
    u.check(m2 == mref, "mnist, reused stage: losses differ")

    # 7. A text file as one object.
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        for i in range(300):
            f.write("the cat sat on the mat and the dog ran %d\n" % (i % 7))
    with open(corpus, "rb") as f:
        s3.put_object(Bucket=u.BUCKET, Key="text/corpus.txt", Body=f.read())
    _, tref = train("text", corpus, os.path.join(tmp, "tref"), env)
    p, t1 = train("text", "s3://%s/text/corpus.txt" % u.BUCKET, os.path.join(tmp, "x1"), env, stage)
    check_stage(p, "text, first run", copied=1, files=1)
    u.check(tref and t1 == tref, "text: losses from the stage %s differ from the local file's %s" % (t1, tref))

    # 8. An HDF5 file as one object: libhdf5 reads local files, so only staged.
    import h5py  # python3-h5py (scripts/dev TEST_PKGS)
    import numpy as np
    h5 = os.path.join(tmp, "train.h5")
    rng = np.random.default_rng(7)
    with h5py.File(h5, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, size=(96, 1, 8, 8), dtype=np.uint8), chunks=(32, 1, 8, 8),
                         compression="gzip")
        f.create_dataset("labels", data=rng.integers(0, 4, size=96).astype(np.int64))
    with open(h5, "rb") as f:
        s3.put_object(Bucket=u.BUCKET, Key="h5/train.h5", Body=f.read())
    h5url = "s3://%s/h5/train.h5" % u.BUCKET
    _, href = train("hdf5", h5, os.path.join(tmp, "href"), env)
    u.check(href and len([r for r in href if r[0] == "step"]) == 4, "hdf5: 4 steps from the local file: %r" % href)
    p, _ = train("hdf5", h5url, os.path.join(tmp, "h0"), env)
    u.check(p.returncode != 0 and h5url in p.stderr and "--stage" in p.stderr and "No such file" not in p.stderr,
            "hdf5 from S3 without --stage: exit %d, %s" % (p.returncode, p.stderr[-800:]))
    p, h1 = train("hdf5", h5url, os.path.join(tmp, "h1"), env, stage)
    hstaged = check_stage(p, "hdf5, first run", copied=1, files=1)
    u.check(href and h1 == href, "hdf5: losses from the stage %s differ from the local file's %s" % (h1, href))
    got = open(os.path.join(hstaged, "train.h5"), "rb").read() if hstaged else b""
    u.check(got == open(h5, "rb").read(), "hdf5: the staged train.h5 is not the object's bytes")
    p, h2 = train("hdf5", h5url, os.path.join(tmp, "h2"), env, stage)
    check_stage(p, "hdf5, second run", copied=0, files=1)
    u.check(href and h2 == href, "hdf5, reused stage: losses differ")

    # 9. An image listing and its PNGs (the fixture's imgs/): the root below
    # the listing listed once; 9 of 9, the local listing's losses; again 0.
    lcsv = os.path.join(srv.local, "imgs", "list.csv")
    _, iref = train("images", lcsv, os.path.join(tmp, "iref"), env)
    u.check(iref and len([r for r in iref if r[0] == "step"]) == 4, "images: 4 steps from the local files: %r" % iref)
    p, i1 = train("images", "s3://%s/imgs/list.csv" % u.BUCKET, os.path.join(tmp, "i1"), env, stage)
    istaged = check_stage(p, "images, first run", copied=9, files=9)
    u.check(iref and i1 == iref, "images: losses from the stage %s differ from the local files' %s" % (i1, iref))
    for name in sorted(os.listdir(os.path.join(srv.local, "imgs"))):
        a = open(os.path.join(srv.local, "imgs", name), "rb").read()
        b = open(os.path.join(istaged, name), "rb").read() if istaged and os.path.exists(os.path.join(istaged, name)) \
            else b""
        u.check(a == b, "images: the staged %s is not the object's bytes" % name)
    p, i2 = train("images", "s3://%s/imgs/list.csv" % u.BUCKET, os.path.join(tmp, "i2"), env, stage)
    check_stage(p, "images, second run", copied=0, files=9)
    u.check(iref and i2 == iref, "images, reused stage: losses differ")
    print("stage sets:", sorted(os.listdir(stage)) if os.path.isdir(stage) else None)
finally:
    srv.close()
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)
print("took %.1f s" % (time.time() - t0))
if u.failures:
    print("test_stage_s3_copies_once_and_trains_like_the_local_copy: %d check(s) failed" % u.failures)
    sys.exit(1)
print("test_stage_s3_copies_once_and_trains_like_the_local_copy: ok")
