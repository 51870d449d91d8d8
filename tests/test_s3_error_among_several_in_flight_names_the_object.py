"""An S3 read that fails among several in flight ends the batch with the
message a one-at-a-time read gives, naming the object.  A listing of the
eight PNGs and one image that is not in the bucket (img_gone.png, last)
read with PX_S3_IN_FLIGHT=8 fails with NoSuchKey naming
s3://px-data/imgs/img_gone.png, word for word as with PX_S3_IN_FLIGHT=1;
and an image whose every transfer is cut (a proxy, PX_S3_ATTEMPTS=2) fails
"gave up after 2 attempts" naming s3://px-data/imgs/img_4.png, again as
with one request at a time.

Would fail if: an error among the requests in flight were lost (a batch
with a hole, exit 0), given to another sample or object, retried as though
a 4xx were transient, or worded otherwise than the sequential read's."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import s3_util as u  # noqa: E402  (first: without moto and boto3 it skips, exit 77, saying why)

import boto3  # noqa: E402


def last_line(err):
    lines = err.strip().splitlines()
    return lines[-1] if lines else ""


t0 = time.time()
srv = u.S3()
try:
    s3 = boto3.client("s3", endpoint_url=srv.endpoint, region_name="us-east-1", aws_access_key_id=srv.key_id,
                      aws_secret_access_key=srv.secret)
    rows = ["path,label"] + ["img_%d.png,%d" % (i, i % 3) for i in range(8)] + ["img_gone.png,0"]
    s3.put_object(Bucket=u.BUCKET, Key="imgs/gone.csv", Body=("\n".join(rows) + "\n").encode())
    gone = "s3://%s/imgs/gone.csv" % u.BUCKET
    msgs = {}
    for inflight in (1, 8):
        rc, _, out, err = u.batches("images", gone, srv.env(PX_BATCHES_WORKERS="1", PX_S3_IN_FLIGHT=str(inflight)))
        msgs[inflight] = last_line(err)
        u.check(rc == 1, "missing key, %d in flight: the read fails (exit %d)" % (inflight, rc))
        u.check("s3://px-data/imgs/img_gone.png" in msgs[inflight] and "NoSuchKey" in msgs[inflight] and
                "line 10" in msgs[inflight], "missing key, %d in flight: the message names the object, the store's "
                "code and the CSV line: %r" % (inflight, msgs[inflight]))
        u.check("attempt" not in err, "missing key, %d in flight: a 404 is not retried: %r" % (inflight, err))
    u.check(msgs[1] == msgs[8], "missing key: the same message in flight as one at a time: %r vs %r" %
            (msgs[1], msgs[8]))
    print("missing key ->", msgs[8], flush=True)

    csv = "s3://%s/imgs/list.csv" % u.BUCKET
    msgs = {}
    for inflight in (1, 8):
        delay = u.CuttingProxy(srv.port, "px-data/", after=0, cuts=0, delay=0.02)
        proxy = u.CuttingProxy(delay.port, "img_4.png", after=20, cuts=2)
        rc, _, out, err = u.batches("images", csv, srv.env(proxy.endpoint, PX_BATCHES_WORKERS="1",
                                                         PX_S3_IN_FLIGHT=str(inflight), PX_S3_ATTEMPTS="2"))
        msgs[inflight] = last_line(err)
        u.check(rc == 1, "cut twice, %d in flight: the read fails (exit %d)" % (inflight, rc))
        u.check(proxy.cut == 2, "cut twice, %d in flight: two transfers cut (%d)" % (inflight, proxy.cut))
        u.check("s3://px-data/imgs/img_4.png: gave up after 2 attempts" in msgs[inflight] and
                "received 20 bytes" in msgs[inflight],
                "cut twice, %d in flight: the message names the object and the bytes: %r" % (inflight, msgs[inflight]))
        if inflight > 1:
            u.check(delay.max_pending > 1, "cut twice: several GETs in flight (at most %d)" % delay.max_pending)
        proxy.close()
        delay.close()
    u.check(msgs[1] == msgs[8], "cut twice: the same message in flight as one at a time: %r vs %r" %
            (msgs[1], msgs[8]))
    print("cut twice ->", msgs[8], flush=True)
finally:
    srv.close()
print("took %.1f s" % (time.time() - t0))
if u.failures:
    print("test_s3_error_among_several_in_flight_names_the_object: %d check(s) failed" % u.failures)
    sys.exit(1)
print("test_s3_error_among_several_in_flight_names_the_object: ok")
