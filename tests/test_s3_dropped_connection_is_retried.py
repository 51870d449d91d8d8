"""A connection dropped in the middle of an S3 object is retried, and the
batches are the same as from the local copy.  A TCP proxy between the
reader and moto's S3 server cuts the first GET of Fashion-MNIST's training
images after 100,000 bytes of body (a whole-object read), then the first
GET of a token shard's header (a ranged read at open) after 20 bytes, then
the first GET of one of its windows (a ranged read in a loader worker)
after 20 bytes; each cut is one retry, logged on stderr with the object's
name.

Would fail if: a short body were taken as the object (other batches, or a
gzip error), a dropped connection were not retried (an error), or the
retry were not counted and logged."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import s3_util as u  # noqa: E402

t0 = time.time()
srv = u.S3()
try:
    # Whole object: the training images (26 MB of gzip), cut once.
    proxy = u.CuttingProxy(srv.port, "train-images-idx3-ubyte.gz", after=100000, cuts=1)
    rc_l, local, _, _ = u.batches("mnist", os.path.join(srv.local, "fmnist"), srv.env())
    rc_r, remote, out, err = u.batches("mnist", "s3://%s/fmnist" % u.BUCKET, srv.env(proxy.endpoint))
    u.check(rc_l == 0 and rc_r == 0, "mnist: both reads succeed")
    u.check(proxy.cut == 1, "mnist: the proxy cut one response (cut %d)" % proxy.cut)
    u.check(local == remote and len(local) > 0, "mnist: the batches equal the local copy's after the retry")
    u.check("retries 1" in out, "mnist: one retry counted: %r" % out)
    u.check("s3://px-data/fmnist/train-images-idx3-ubyte.gz: attempt 1 of 5 failed" in err and
            "received 100000 bytes" in err, "mnist: the retry is logged with the object and the bytes: %r" % err)
    print("mnist:", out.strip(), "|", err.strip(), flush=True)
    proxy.close()

    # Ranged reads: a token shard's header at open, then one of its windows.
    rc_l, local, _, _ = u.batches("tokens", os.path.join(srv.local, "shards", "*.bin"), srv.env(), extra=["64"])
    u.check(rc_l == 0 and len(local) > 0, "tokens: the local read gives batches")
    for what, skip in (("header", 0), ("window", 1)):
        proxy = u.CuttingProxy(srv.port, "tok_000001.bin", after=20, cuts=1, skip=skip)
        rc_r, remote, out, err = u.batches("tokens", "s3://%s/shards/" % u.BUCKET, srv.env(proxy.endpoint),
                                           extra=["64"])
        u.check(rc_r == 0, "tokens, cut %s: the read succeeds" % what)
        u.check(proxy.cut == 1, "tokens, cut %s: the proxy cut one response (cut %d)" % (what, proxy.cut))
        u.check(local == remote, "tokens, cut %s: the batches equal the local copy's after the retry" % what)
        u.check("retries 1" in out, "tokens, cut %s: one retry counted: %r" % (what, out))
        u.check("s3://px-data/shards/tok_000001.bin: attempt 1 of 5 failed" in err and
                "received 20 bytes" in err, "tokens, cut %s: the retry is logged with the object: %r" % (what, err))
        print("tokens, cut %s:" % what, out.strip(), "|", err.strip(), flush=True)
        proxy.close()
finally:
    srv.close()
print("took %.1f s" % (time.time() - t0))
if u.failures:
    print("test_s3_dropped_connection_is_retried: %d check(s) failed" % u.failures)
    sys.exit(1)
print("test_s3_dropped_connection_is_retried: ok")
