"""s3_util.py -- what the tests of s3:// data paths share: moto's S3 server
on 127.0.0.1 with IAM authentication on (every request's SigV4 signature is
checked against the access key and secret of a user it knows), the
Fashion-MNIST files and token shards uploaded, a TCP proxy that can cut a
response mid-object, and the px_data_batches tool (tests/tools/).

moto and boto3 come from PyPI: scripts/dev installs them (PY_TEST_PKGS)."""

import json
import logging
import os
import socket
import struct
import subprocess
import tempfile
import threading
import time
import zlib

import sys

try:
    import boto3
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto import settings as moto_settings
    from moto.server import ThreadedMotoServer
except ImportError as e:
    # moto and boto3 come from PyPI (scripts/dev installs them).  A machine
    # that cannot reach PyPI has no S3 server to test against: the test is
    # skipped (exit 77, which ctest shows as skipped), saying why.
    print("SKIP: the s3:// tests need moto's S3 server: %s (pip install 'moto[server]')" % e, flush=True)
    sys.exit(77)

# The servers are on loopback: never through a proxy the environment names
# (libcurl and boto3 both read these).
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"

BUILD = os.environ.get("PX_BUILD_DIR", "")
PLEXUS = os.path.join(BUILD, "plexus")
TOOL = os.path.join(BUILD, "tests", "px_data_batches")
FMNIST = "/usr/share/datasets/fashion-mnist"
BUCKET = "px-data"
failures = 0


def check(cond, msg):
    global failures
    if not cond:
        print("FAIL:", msg, flush=True)
        failures += 1
    return cond


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def write_shard(path, tokens):
    """llm.c's uint16 shard: 256 int32 header (magic, version, count), tokens."""
    header = struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253))
    with open(path, "wb") as f:
        f.write(header + struct.pack("<%dH" % len(tokens), *tokens))


def write_png_gray(path, w, h, pixels):
    """An 8-bit grayscale PNG (no PIL needed)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes(pixels[r * w:(r + 1) * w]) for r in range(h))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


class S3:
    """moto on 127.0.0.1 with one IAM user allowed everything, a bucket with
    fmnist/ (Fashion-MNIST's four .gz files), shards/ (three token shards), imgs/ (eight
    PNGs and their CSV); the same files under self.local."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = "http://127.0.0.1:%d" % self.port
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.tmp = tempfile.TemporaryDirectory(prefix="px-s3-")
        self.local = self.tmp.name
        setup = dict(endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="setup",
                     aws_secret_access_key="setup")
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="trainer")
        iam.put_user_policy(UserName="trainer", PolicyName="all", PolicyDocument=(
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'))
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        s3 = boto3.client("s3", **setup)
        s3.create_bucket(Bucket=BUCKET)
        # Fashion-MNIST, as Debian installs it (gzip).
        os.makedirs(os.path.join(self.local, "fmnist"))
        for name in sorted(os.listdir(FMNIST)):
            with open(os.path.join(FMNIST, name), "rb") as f:
                data = f.read()
            with open(os.path.join(self.local, "fmnist", name), "wb") as f:
                f.write(data)
            s3.put_object(Bucket=BUCKET, Key="fmnist/" + name, Body=data)
        # Three token shards of different lengths (a listing of 3 pages at max-keys 1).
        os.makedirs(os.path.join(self.local, "shards"))
        for k, n in enumerate((5000, 3001, 7777)):
            name = "tok_%06d.bin" % k
            path = os.path.join(self.local, "shards", name)
            write_shard(path, [(i * 7919 + k * 31) % 50257 for i in range(n)])
            with open(path, "rb") as f:
                s3.put_object(Bucket=BUCKET, Key="shards/" + name, Body=f.read())
        # Eight 28x28 gray PNGs cut from Fashion-MNIST's training images, and a listing.
        os.makedirs(os.path.join(self.local, "imgs"))
        with open(os.path.join(FMNIST, "train-images-idx3-ubyte.gz"), "rb") as f:
            images = zlib.decompress(f.read(), 16 + zlib.MAX_WBITS)
        rows = ["path,label"]
        for i in range(8):
            name = "img_%d.png" % i
            path = os.path.join(self.local, "imgs", name)
            write_png_gray(path, 28, 28, images[16 + i * 784:16 + (i + 1) * 784])
            rows.append("%s,%d" % (name, i % 3))
        with open(os.path.join(self.local, "imgs", "list.csv"), "w") as f:
            f.write("\n".join(rows) + "\n")
        for name in os.listdir(os.path.join(self.local, "imgs")):
            with open(os.path.join(self.local, "imgs", name), "rb") as f:
                s3.put_object(Bucket=BUCKET, Key="imgs/" + name, Body=f.read())
        # From here on every request must be signed by a key moto knows.
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        ActionAuthenticatorMixin.request_count = 0

    def temporary_credentials(self):
        """(key id, secret, session token) of a role assumed through STS:
        moto checks the token on every request made with them."""
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
        setup = dict(endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="setup",
                     aws_secret_access_key="setup")
        iam = boto3.client("iam", **setup)
        iam.create_role(RoleName="reader", AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}))
        iam.put_role_policy(RoleName="reader", PolicyName="all", PolicyDocument=(
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'))
        c = boto3.client("sts", **setup).assume_role(RoleArn="arn:aws:iam::123456789012:role/reader",
                                                      RoleSessionName="px-test")["Credentials"]
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        ActionAuthenticatorMixin.request_count = 0
        return c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"]

    def env(self, endpoint=None, **extra):
        """The environment of a reader: credentials of the IAM user, the
        endpoint (moto or a proxy), quick retries; no ~/.aws files."""
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("AWS_") or k.startswith("PX_S3_"):
                del e[k]
        e.update({"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret,
                  "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint or self.endpoint,
                  "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self.local, "no-credentials"),
                  "AWS_CONFIG_FILE": os.path.join(self.local, "no-config"),
                  "PX_S3_BACKOFF_MS": "50"})
        e.update(extra)
        return e

    def close(self):
        self.server.stop()
        self.tmp.cleanup()


def batches(kind, path, env, n=4, extra=()):
    """Run px_data_batches; returns (returncode, batch bytes, stdout, stderr)."""
    fd, out = tempfile.mkstemp(prefix="px-batches-")
    os.close(fd)
    try:
        p = subprocess.run([TOOL, kind, path, out, str(n)] + list(extra), capture_output=True, text=True, env=env,
                           timeout=120)
        with open(out, "rb") as f:
            data = f.read()
    finally:
        os.unlink(out)
    if p.returncode != 0:
        print("px_data_batches %s %s: exit %d\n%s%s" % (kind, path, p.returncode, p.stdout, p.stderr), flush=True)
    return p.returncode, data, p.stdout, p.stderr


class CuttingProxy:
    """A TCP proxy to `port` on 127.0.0.1.  After `skip` of them, the next
    `cuts` responses to a GET whose request line contains `match` are cut after their headers and
    `after` bytes of body (the connection closed, as a dropped one is).
    Counts its cuts, and in `gets` every GET whose request line matches
    (cuts=0: a counting proxy).  delay > 0: each matching GET is held that
    many seconds before it goes on (an object store's latency);
    `max_pending` is then the most GETs held at once (requests in flight)."""

    def __init__(self, port, match, after, cuts=1, skip=0, delay=0.0):
        self.target, self.match, self.after, self.cuts_left, self.skip = port, match.encode(), after, cuts, skip
        self.delay = delay
        self.pending = self.max_pending = 0
        self.cut = 0
        self.gets = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.endpoint = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.target))
            state = {"budget": None}  # bytes of the current response still to pass, None: all
            threading.Thread(target=self._up, args=(c, s, state), daemon=True).start()
            threading.Thread(target=self._down, args=(s, c, state), daemon=True).start()

    def _up(self, c, s, state):
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                if data.startswith(b"GET ") and self.match in data.split(b"\r\n", 1)[0]:
                    with self.lock:
                        self.gets += 1
                        if self.skip > 0:
                            self.skip -= 1
                        elif self.cuts_left > 0:
                            self.cuts_left -= 1
                            state["budget"] = self.after
                        self.pending += 1
                        self.max_pending = max(self.max_pending, self.pending)
                    if self.delay > 0:
                        time.sleep(self.delay)
                    with self.lock:
                        self.pending -= 1
                s.sendall(data)
        except OSError:
            pass
        finally:
            for x in (c, s):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _down(self, s, c, state):
        head = None  # a response to cut: its bytes until the headers end
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                b = state["budget"]
                if b is None:
                    c.sendall(data)
                    continue
                if head is not None or "body" not in state:
                    head = (head or b"") + data
                    end = head.find(b"\r\n\r\n")
                    if end < 0:
                        continue
                    c.sendall(head[:end + 4])
                    data, head, state["body"] = head[end + 4:], None, True
                if len(data) >= b:
                    c.sendall(data[:b])
                    with self.lock:
                        self.cut += 1
                    break
                c.sendall(data)
                state["budget"] = b - len(data)
        except OSError:
            pass
        finally:
            for x in (c, s):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                    x.close()
                except OSError:
                    pass

    def close(self):
        self.sock.close()
