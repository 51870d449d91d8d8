"""A connection dropped under one of several requests in flight is retried
on its own, and the batches are the local copy's.  With
PX_S3_IN_FLIGHT=8 and one loader worker, a proxy holds each GET 20 ms (so
that several are out at once) and cuts one response after 20 bytes of
body: a token window of tok_000001.bin (a ranged GET, after the shard's
header and two windows went through) and a PNG image (a whole-object GET).
Each cut is one retry, logged on stderr with the object's name.

Would fail if: the cut transfer's short body were taken for the sample
(other bytes), the other transfers of the batch were disturbed by it, the
cut one were not retried (an error), or the retry were not counted and
logged with the object."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import s3_util as u  # noqa: E402

t0 = time.time()
srv = u.S3()
try:
    cases = [
        ("tokens", os.path.join(srv.local, "shards", "*.bin"), "s3://%s/shards/" % u.BUCKET, "tok_000001.bin", 3,
         "s3://px-data/shards/tok_000001.bin", 8, ["64"]),
        ("images", os.path.join(srv.local, "imgs", "list.csv"), "s3://%s/imgs/list.csv" % u.BUCKET, "img_5.png", 0,
         "s3://px-data/imgs/img_5.png", 1, []),
    ]
    for kind, local_path, url, match, skip, name, n, extra in cases:
        rc, local, _, _ = u.batches(kind, local_path, srv.env(PX_BATCHES_WORKERS="1"), n, extra)
        u.check(rc == 0 and len(local) > 0, "%s: the local read gives batches" % kind)
        # The delay on every GET of the bucket's files; the cut on `match`.
        delay = u.CuttingProxy(srv.port, "px-data/", after=0, cuts=0, delay=0.02)
        proxy = u.CuttingProxy(delay.port, match, after=20, cuts=1, skip=skip)
        rc, remote, out, err = u.batches(kind, url, srv.env(proxy.endpoint, PX_BATCHES_WORKERS="1",
                                                            PX_S3_IN_FLIGHT="8"), n, extra)
        u.check(rc == 0, "%s: the read succeeds" % kind)
        u.check(delay.max_pending > 1, "%s: several GETs in flight (at most %d at once)" % (kind, delay.max_pending))
        u.check(proxy.cut == 1, "%s: the proxy cut one response (cut %d)" % (kind, proxy.cut))
        u.check(remote == local, "%s: the batches equal the local copy's after the retry" % kind)
        u.check("retries 1" in out, "%s: one retry counted: %r" % (kind, out))
        u.check(("%s: attempt 1 of 5 failed" % name) in err and "received 20 bytes" in err,
                "%s: the retry is logged with the object and the bytes: %r" % (kind, err))
        print("%s: %d GETs, at most %d at once; %s | %s" % (kind, delay.gets, delay.max_pending, out.strip(),
                                                             err.strip()), flush=True)
        proxy.close()
        delay.close()
finally:
    srv.close()
print("took %.1f s" % (time.time() - t0))
if u.failures:
    print("test_s3_cut_request_among_several_in_flight_is_retried: %d check(s) failed" % u.failures)
    sys.exit(1)
print("test_s3_cut_request_among_several_in_flight_is_retried: ok")
