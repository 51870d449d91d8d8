"""bench_s3.py -- reading through s3:// on loopback against the local copy.

    PX_BUILD_DIR=build [BENCH_S3_DELAY_MS=10] /usr/bin/python3 bench/bench_s3.py [BATCHES]

Starts moto's S3 server on 127.0.0.1 (tests/s3_util.py: IAM authentication
on, so every request is signed and checked), uploads a 4,000,000-token
uint16 shard and Fashion-MNIST's training files, and times
tests/tools/px_data_batches (a loader with 2 workers, batches of 32):

  tokens T=1024  local shard | s3:// (one ranged GET per window) |
                 s3:// with PX_S3_CACHE, warm (the shard read from the cache)
  mnist          local directory | s3:// (two whole-object GETs, 26 MB)

and the requests in flight per loader worker (PX_S3_IN_FLIGHT, data/s3.h):

  tokens T=1024  s3:// straight to moto, 1 | 8 in flight;
                 s3:// through a proxy that holds every GET DELAY ms (an
                 object store's latency; loopback has none), 1 | 8 in flight

DELAY: BENCH_S3_DELAY_MS (default 10).  (`bench_s3.py serve ...`: the S3
server of bench/run_loader.sh's jpeg-s3 case, below.)  Each case runs 3 times, alternating, and the median is printed.  moto is a
Python server (werkzeug, a new connection per request): the s3:// figures
are a floor for what a real store on a fast network gives per worker, not
an estimate of it."""

import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import s3_util as u  # noqa: E402


def serve(jpeg_dir, count, env_file):
    """bench_s3.py serve JPEG_DIR COUNT ENV_FILE (for bench/run_loader.sh):
    moto on 127.0.0.1 with the first COUNT images of JPEG_DIR/list.csv under
    s3://px-data/jpegs/ (and their CSV); writes `export` lines for a reader
    (credentials, endpoint) to ENV_FILE, then serves until SIGTERM."""
    import boto3
    srv = u.S3()
    s3 = boto3.client("s3", endpoint_url=srv.endpoint, region_name="us-east-1", aws_access_key_id=srv.key_id,
                      aws_secret_access_key=srv.secret)
    with open(os.path.join(jpeg_dir, "list.csv")) as f:
        rows = f.read().splitlines()
    rows = rows[:1 + count]
    for row in rows[1:]:
        name = row.split(",")[0]
        with open(os.path.join(jpeg_dir, name), "rb") as f:
            s3.put_object(Bucket=u.BUCKET, Key="jpegs/" + name, Body=f.read())
    s3.put_object(Bucket=u.BUCKET, Key="jpegs/list.csv", Body=("\n".join(rows) + "\n").encode())
    env = srv.env()
    with open(env_file + ".tmp", "w") as f:
        for k in sorted(env):
            if k.startswith("AWS_") or k.startswith("PX_S3_") or k.lower() == "no_proxy":
                f.write("export %s='%s'\n" % (k, env[k]))
        f.write("export S3_JPEG_CSV='s3://%s/jpegs/list.csv'\n" % u.BUCKET)
    os.rename(env_file + ".tmp", env_file)
    signal.signal(signal.SIGTERM, lambda *a: (srv.close(), os._exit(0)))
    while True:
        time.sleep(3600)


if len(sys.argv) == 5 and sys.argv[1] == "serve":
    serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    sys.exit(0)

batches = int(sys.argv[1]) if len(sys.argv) > 1 else 16
srv = u.S3()
try:
    import boto3
    s3 = boto3.client("s3", endpoint_url=srv.endpoint, region_name="us-east-1", aws_access_key_id=srv.key_id,
                      aws_secret_access_key=srv.secret)
    shard = os.path.join(srv.local, "big", "big_000000.bin")
    os.makedirs(os.path.dirname(shard))
    u.write_shard(shard, [(i * 7919) % 50257 for i in range(4_000_000)])
    with open(shard, "rb") as f:
        s3.put_object(Bucket=u.BUCKET, Key="big/big_000000.bin", Body=f.read())
    cache = os.path.join(srv.local, "cache")
    delay_ms = float(os.environ.get("BENCH_S3_DELAY_MS", "10"))
    proxy = u.CuttingProxy(srv.port, "big_000000.bin", after=0, cuts=0, delay=delay_ms / 1000)
    big = "s3://%s/big/" % u.BUCKET
    cases = [
        ("tokens T=1024, local", "tokens", shard, srv.env(), ["1024"]),
        ("tokens T=1024, s3:// 1 in flight", "tokens", big, srv.env(PX_S3_IN_FLIGHT="1"), ["1024"]),
        ("tokens T=1024, s3:// 8 in flight", "tokens", big, srv.env(PX_S3_IN_FLIGHT="8"), ["1024"]),
        ("tokens T=1024, s3:// +%g ms, 1 in flight" % delay_ms, "tokens", big,
         srv.env(proxy.endpoint, PX_S3_IN_FLIGHT="1"), ["1024"]),
        ("tokens T=1024, s3:// +%g ms, 8 in flight" % delay_ms, "tokens", big,
         srv.env(proxy.endpoint, PX_S3_IN_FLIGHT="8"), ["1024"]),
        ("tokens T=1024, s3:// cache warm", "tokens", "s3://%s/big/" % u.BUCKET, srv.env(PX_S3_CACHE=cache), ["1024"]),
        ("mnist, local", "mnist", os.path.join(srv.local, "fmnist"), srv.env(), []),
        ("mnist, s3:// whole objects", "mnist", "s3://%s/fmnist" % u.BUCKET, srv.env(), []),
    ]
    u.batches("tokens", "s3://%s/big/" % u.BUCKET, srv.env(PX_S3_CACHE=cache), 1, ["1024"])  # fill the cache
    times = {c[0]: [] for c in cases}
    ref = {}
    for rep in range(3):
        for name, kind, path, env, extra in cases:
            t = time.perf_counter()
            rc, data, out, _ = u.batches(kind, path, env, batches, extra)
            times[name].append(time.perf_counter() - t)
            if rc != 0:
                sys.exit("bench_s3: %s failed" % name)
            ref.setdefault(kind, data)
            if data != ref[kind]:
                sys.exit("bench_s3: %s gave other batches than the local copy" % name)
    print("load average %.2f %.2f %.2f; %d batches of 32 per run, 2 workers; median of 3 (s)" %
          (os.getloadavg() + (batches,)))
    for name, _, _, _, _ in cases:
        m = statistics.median(times[name])
        extra = ""
        if name.startswith("tokens"):
            extra = "  %8.0f windows/s" % (batches * 32 / m)
        print("%-40s %7.3f s%s" % (name, m, extra))
finally:
    srv.close()
