"""An s3:// data path gives the same batches as the local copy of the same
files: Fashion-MNIST's IDX files (gzip, found under an s3:// "directory"),
three token shards given as a prefix (listed page by page: max-keys 1, so
three pages and two continuation tokens; each window one ranged GET), and
a CSV listing with its PNGs.  The server is moto's S3 on 127.0.0.1 with IAM
authentication on, so every request's SigV4 signature is checked.  Then the
same through the local cache (PX_S3_CACHE): a first run fills it
with byte-identical copies, a second reads them and gives the same batches.

Would fail if: a request were signed wrongly (403), a listing page were
lost (fewer shards: other windows), a range were off by one (other
tokens), gzip or PNG bytes came back altered, or the cache kept other
bytes.  Last, `plexus train` on 2 ranks (threads) from s3://.../fmnist and
from the local directory, same seed: the same losses at every step."""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import s3_util as u  # noqa: E402

t0 = time.time()
srv = u.S3()
env = srv.env()
try:
    cases = [("mnist", os.path.join(srv.local, "fmnist"), "s3://%s/fmnist" % u.BUCKET, []),
             ("tokens", os.path.join(srv.local, "shards", "*.bin"), "s3://%s/shards/" % u.BUCKET, ["64"]),
             ("images", os.path.join(srv.local, "imgs", "list.csv"), "s3://%s/imgs/list.csv" % u.BUCKET, [])]
    for kind, local, remote, extra in cases:
        rc_l, local_bytes, out_l, _ = u.batches(kind, local, env, extra=extra)
        e = dict(env, PX_S3_LIST_MAX_KEYS="1")
        rc_r, remote_bytes, out_r, err_r = u.batches(kind, remote, e, extra=extra)
        u.check(rc_l == 0 and rc_r == 0, "%s: both reads succeed" % kind)
        u.check(len(local_bytes) > 0, "%s: the local read gives batches" % kind)
        u.check(local_bytes == remote_bytes, "%s: %s gives the same %d batch bytes as %s (got %d)" %
                (kind, remote, len(local_bytes), local, len(remote_bytes)))
        u.check(out_l.split()[:2] == out_r.split()[:2], "%s: same sample count: %r vs %r" % (kind, out_l, out_r))
        u.check("retries 0" in out_r and "retrying" not in err_r, "%s: no retry needed: %r %r" % (kind, out_r, err_r))
        print("%s: %d bytes of batches equal (%s)" % (kind, len(local_bytes), out_r.strip()), flush=True)

    # The token windows span all three shards: batches from the first shard
    # alone differ (so the listing's later pages were used).
    _, one_shard, _, _ = u.batches("tokens", os.path.join(srv.local, "shards", "tok_000000.bin"), env, extra=["64"])
    _, all_shards, _, _ = u.batches("tokens", os.path.join(srv.local, "shards", "*.bin"), env, extra=["64"])
    u.check(one_shard != all_shards, "tokens: three shards give other batches than the first alone")

    # Through the cache.
    cache = os.path.join(srv.local, "cache")
    e = dict(env, PX_S3_CACHE=cache)
    for kind, local, remote, extra in cases:
        _, local_bytes, _, _ = u.batches(kind, local, env, extra=extra)
        rc1, first, _, _ = u.batches(kind, remote, e, extra=extra)
        rc2, second, _, _ = u.batches(kind, remote, e, extra=extra)
        u.check(rc1 == 0 and rc2 == 0 and first == local_bytes and second == local_bytes,
                "%s: cached reads give the local batches (first run fills, second reads)" % kind)
    for sub in ("fmnist", "shards", "imgs"):
        for name in os.listdir(os.path.join(srv.local, sub)):
            want = os.path.join(srv.local, sub, name)
            got = os.path.join(cache, u.BUCKET, sub, name)
            if name.startswith("t10k"):
                continue  # px_data_batches reads the training split only
            u.check(os.path.exists(got) and open(got, "rb").read() == open(want, "rb").read(),
                    "cache holds %s byte for byte" % got)

    # plexus train from S3 and from the local copy: the same losses.
    def train(path, out):
        args = [u.PLEXUS, "train", "--threads", "2", "--model", "cnn", "--channels", "4", "--data", "mnist",
                "--data-path", path, "--train-subset", "512", "--val-subset", "64", "--batch-size", "16",
                "--steps", "6", "--log-every", "1", "--eval-every", "6", "--seed", "3", "--workers", "2",
                "--progress", "lines", "--quiet", "--out", out]
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            print("plexus train %s: exit %d\n%s%s" % (path, p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
            return None
        with open(os.path.join(out, "metrics.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        return [(r["type"], r.get("step"), r.get("loss")) for r in recs if r["type"] in ("step", "eval")]
    local_losses = train(os.path.join(srv.local, "fmnist"), os.path.join(srv.local, "run-local"))
    s3_losses = train("s3://%s/fmnist" % u.BUCKET, os.path.join(srv.local, "run-s3"))
    u.check(local_losses and len([r for r in local_losses if r[0] == "step"]) == 6,
            "plexus train: 6 steps logged from the local copy: %r" % local_losses)
    u.check(s3_losses == local_losses, "plexus train: the same losses from S3 as from the local copy:\n%r\n%r" %
            (s3_losses, local_losses))
    print("plexus train: losses", [r[2] for r in (s3_losses or [])], flush=True)
finally:
    srv.close()
print("took %.1f s" % (time.time() - t0))
if u.failures:
    print("test_s3_batches_equal_local_copy: %d check(s) failed" % u.failures)
    sys.exit(1)
print("test_s3_batches_equal_local_copy: ok")
