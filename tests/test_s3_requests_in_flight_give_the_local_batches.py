"""A loader worker sends the S3 reads of the batch it fills several at a
time (PX_S3_IN_FLIGHT), and the batches are byte for byte the local
copy's.  One worker reads token windows (ranged GETs) and PNG images
(whole-object GETs) through a proxy that holds each GET 30 ms (an object
store's latency) and counts how many it holds at once: with
PX_S3_IN_FLIGHT=1 never more than one, with 8 more than one (and never more
than 8); the batches of both equal the local ones.

Would fail if: the requests of a batch were still sent one at a time, more
than PX_S3_IN_FLIGHT went out at once, a response were given to the
wrong sample (other bytes than the local copy's), or a read were sent
twice (the dry run that collects a batch's requests sending any, or the
real pass not finding the answers): the proxy counts one GET per sample
read at 1 and at 8 in flight."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import s3_util as u  # noqa: E402

t0 = time.time()
srv = u.S3()
try:
    cases = [
        # GETs: 3 shard headers at open, then one per window of the 4
        # batches asked for, or 5 (the worker may fill one ahead first).
        ("tokens", os.path.join(srv.local, "shards", "*.bin"), "s3://%s/shards/" % u.BUCKET, "tok_", 4, ["64"],
         (3 + 4 * 32, 3 + 5 * 32)),
        # GETs: the first image at open, then the 8 of the one batch.
        ("images", os.path.join(srv.local, "imgs", "list.csv"), "s3://%s/imgs/list.csv" % u.BUCKET, "img_", 1, [],
         (1 + 8,)),
    ]
    for kind, local_path, url, match, n, extra, expect_gets in cases:
        rc, local, _, _ = u.batches(kind, local_path, srv.env(PX_BATCHES_WORKERS="1"), n, extra)
        u.check(rc == 0 and len(local) > 0, "%s: the local read gives batches" % kind)
        for inflight in (1, 8):
            proxy = u.CuttingProxy(srv.port, match, after=0, cuts=0, delay=0.03)
            t = time.time()
            rc, remote, out, err = u.batches(kind, url, srv.env(proxy.endpoint, PX_BATCHES_WORKERS="1",
                                                                PX_S3_IN_FLIGHT=str(inflight)), n, extra)
            took = time.time() - t
            proxy.close()
            u.check(rc == 0, "%s, %d in flight: the read succeeds" % (kind, inflight))
            u.check(remote == local, "%s, %d in flight: the batches equal the local copy's" % (kind, inflight))
            if inflight == 1:
                u.check(proxy.max_pending == 1, "%s, 1 in flight: one GET at a time (at most %d held at once)" %
                        (kind, proxy.max_pending))
            else:
                u.check(1 < proxy.max_pending <= inflight, "%s, %d in flight: several GETs at once, at most %d "
                        "(at most %d held at once)" % (kind, inflight, inflight, proxy.max_pending))
            u.check(proxy.gets in expect_gets, "%s, %d in flight: each read sent once, the dry run sending none "
                    "(%d GETs, expected one of %s)" % (kind, inflight, proxy.gets, expect_gets))
            print("%s, PX_S3_IN_FLIGHT=%d: %d GETs, at most %d at once, %.2f s" %
                  (kind, inflight, proxy.gets, proxy.max_pending, took), flush=True)
finally:
    srv.close()
print("took %.1f s" % (time.time() - t0))
if u.failures:
    print("test_s3_requests_in_flight_give_the_local_batches: %d check(s) failed" % u.failures)
    sys.exit(1)
print("test_s3_requests_in_flight_give_the_local_batches: ok")
