"""Every way an s3:// read fails gives an error that names the object and
says what the store said: a wrong secret (SignatureDoesNotMatch) and an
unknown access key (InvalidAccessKeyId) from moto's IAM check, a missing
key (NoSuchKey), a missing bucket (NoSuchBucket), an empty prefix, no
credentials at all, a store that throttles every try (503 SlowDown) and an
object whose every transfer is cut short (Content-Length against bytes
received), both after their bounded retries, and temporary credentials
with a wrong session token (InvalidToken).  Credentials from a profile in a
shared credentials file work, and a wrong secret there names the file;
temporary credentials (AWS_SESSION_TOKEN, from STS) work.

Would fail if: an error lost the object's name or the store's code, a 4xx
were retried, a throttled or truncated read were retried forever or
accepted, or the profile's keys were not read."""

import http.server
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import s3_util as u  # noqa: E402

CSV = "s3://%s/imgs/list.csv" % u.BUCKET


def expect_error(what, kind, path, env, *needles, extra=()):
    rc, _, out, err = u.batches(kind, path, env, extra=list(extra))
    ok = u.check(rc == 1, "%s: the read fails (exit %d)" % (what, rc))
    for n in needles:
        ok = u.check(n in err, "%s: the message says %r: %r" % (what, n, err)) and ok
    if ok:
        print("%s -> %s" % (what, err.strip().splitlines()[-1]), flush=True)
    return err


class SlowDown(http.server.BaseHTTPRequestHandler):
    """A store that throttles every request."""
    count = 0

    def do_GET(self):
        SlowDown.count += 1
        body = b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


t0 = time.time()
srv = u.S3()
try:
    env = srv.env()
    expect_error("wrong secret", "images", CSV, srv.env(AWS_SECRET_ACCESS_KEY="not-the-secret"),
                 "csv %s: the store refused the credentials (HTTP 403 SignatureDoesNotMatch" % CSV,
                 "access key id %s from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" % srv.key_id)
    expect_error("unknown access key", "images", CSV, srv.env(AWS_ACCESS_KEY_ID="AKIANOSUCHKEY0000000"),
                 "csv %s: the store refused the credentials (HTTP 403 InvalidAccessKeyId" % CSV)
    # A wrong key found by the HEAD of an IDX file (a HEAD's error has no body).
    expect_error("wrong secret on a HEAD", "mnist", "s3://%s/fmnist" % u.BUCKET,
                 srv.env(AWS_SECRET_ACCESS_KEY="not-the-secret"),
                 "s3://px-data/fmnist/train-images-idx3-ubyte: the store refused the credentials (HTTP 403 "
                 "SignatureDoesNotMatch")
    expect_error("missing key", "images", "s3://%s/imgs/nope.csv" % u.BUCKET, env,
                 'csv s3://px-data/imgs/nope.csv: no object "imgs/nope.csv" in bucket "px-data" (HTTP 404 NoSuchKey')
    expect_error("missing bucket", "images", "s3://px-no-bucket/imgs/list.csv", env,
                 'csv s3://px-no-bucket/imgs/list.csv: no bucket "px-no-bucket" (HTTP 404 NoSuchBucket')
    expect_error("missing bucket of IDX files", "mnist", "s3://px-no-bucket/fmnist", env,
                 's3://px-no-bucket/fmnist/train-images-idx3-ubyte: no bucket "px-no-bucket" (HTTP 404 NoSuchBucket')
    expect_error("missing IDX files", "mnist", "s3://%s/nothing" % u.BUCKET, env,
                 "mnist s3://px-data/nothing: train-images-idx3-ubyte not found")
    expect_error("empty prefix", "tokens", "s3://%s/none/" % u.BUCKET, env,
                 'tokens s3://px-data/none/: no object in bucket "px-data" has a key starting with "none/"')
    e = srv.env()
    del e["AWS_ACCESS_KEY_ID"], e["AWS_SECRET_ACCESS_KEY"]
    expect_error("no credentials", "images", CSV, e, "csv %s: no AWS credentials" % CSV)

    # Throttled on every try: 3 attempts (PX_S3_ATTEMPTS), then the error.
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowDown)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    err = expect_error("throttled", "images", CSV,
                       srv.env("http://127.0.0.1:%d" % httpd.server_address[1], PX_S3_ATTEMPTS="3"),
                       "csv %s: gave up after 3 attempts; the last: HTTP 503 SlowDown" % CSV)
    u.check(SlowDown.count == 3 and err.count("retrying") == 2, "throttled: 3 requests, 2 retries logged (%d)" %
            SlowDown.count)
    httpd.shutdown()

    # Every transfer cut after 10 bytes of body: a truncated object.
    size = os.path.getsize(os.path.join(srv.local, "imgs", "list.csv"))
    proxy = u.CuttingProxy(srv.port, "list.csv", after=10, cuts=1000)
    expect_error("truncated", "images", CSV, srv.env(proxy.endpoint, PX_S3_ATTEMPTS="3"),
                 "csv %s: gave up after 3 attempts; the last:" % CSV,
                 "truncated object: Content-Length %d, received 10 bytes" % size)
    u.check(proxy.cut == 3, "truncated: 3 transfers cut (%d)" % proxy.cut)
    proxy.close()

    # Temporary credentials: the session token goes with every request.
    key_id, secret, token = srv.temporary_credentials()
    rc, got, _, _ = u.batches("images", CSV, srv.env(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret,
                                                     AWS_SESSION_TOKEN=token))
    _, want, _, _ = u.batches("images", os.path.join(srv.local, "imgs", "list.csv"), env)
    u.check(rc == 0 and got == want, "temporary credentials with AWS_SESSION_TOKEN read the listing")
    expect_error("wrong session token", "images", CSV,
                 srv.env(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret, AWS_SESSION_TOKEN="not-the-token"),
                 "csv %s: the store refused the credentials (HTTP 400 InvalidToken" % CSV)

    # A profile in the shared credentials file (and the region in the config file).
    creds = os.path.join(srv.local, "credentials")
    conf = os.path.join(srv.local, "config")
    with open(creds, "w") as f:
        f.write("[default]\naws_access_key_id = AKIAWRONGDEFAULT0000\naws_secret_access_key = x\n\n"
                "[px]\naws_access_key_id = %s\naws_secret_access_key = %s\n" % (srv.key_id, srv.secret))
    with open(conf, "w") as f:
        f.write("[profile px]\nregion = us-east-1\n")
    e = srv.env(AWS_PROFILE="px", AWS_SHARED_CREDENTIALS_FILE=creds, AWS_CONFIG_FILE=conf)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        del e[k]
    rc, got, _, _ = u.batches("images", CSV, e)
    _, want, _, _ = u.batches("images", os.path.join(srv.local, "imgs", "list.csv"), env)
    u.check(rc == 0 and got == want, "profile px from the credentials file reads the listing")
    with open(creds, "w") as f:
        f.write("[px]\naws_access_key_id = %s\naws_secret_access_key = wrong\n" % srv.key_id)
    expect_error("wrong secret in a profile", "images", CSV, e, "SignatureDoesNotMatch",
                 "from %s [px]" % creds)
finally:
    srv.close()
print("took %.1f s" % (time.time() - t0))
if u.failures:
    print("test_s3_errors_name_the_object: %d check(s) failed" % u.failures)
    sys.exit(1)
print("test_s3_errors_name_the_object: ok")
