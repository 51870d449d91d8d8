"""Claim: a writer killed with SIGKILL in the middle of a checkpoint leaves
the previous checkpoint whole and findable: px_checkpoint_latest returns it,
it loads and verifies (with coreutils' `sha256sum -c` too), the interrupted
.partial directory is skipped with a note saying a writer was interrupted,
and the next successful write removes it.  The same holds when the killed
write was replacing an existing step: the old step directory stays complete.

tests/tools/ckpt_writer writes a large checkpoint (64 files of 4 MiB, each
fsynced); the test kills it once the .partial directory holds two files.
Then 20 replacements of a small step are killed at random moments (during
the writes, the renames or the removal of the old directory): the step must
be complete every time, with the old contents or the new.

If it failed, a crash or a pre-empted job during a checkpoint would lose the
run (no resumable checkpoint) or resume from a half-written one."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

build = os.environ.get("PX_BUILD_DIR", "build")
tool = os.path.join(build, "tests", "ckpt_writer")
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def run(*args):
    p = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    print(f"$ ckpt_writer {' '.join(args)}  -> exit {p.returncode}\n{p.stdout}{p.stderr}", end="")
    return p


def kill_mid_write(d, step):
    """Start a big write of step and SIGKILL it while its .partial directory
    fills; returns the partial directory left behind (None if the writer
    finished before it could be killed)."""
    p = subprocess.Popen([tool, "write", d, str(step), "64", "4", "0"], stdout=subprocess.DEVNULL)
    pattern = os.path.join(d, f".step_{step:08d}.partial.*")
    deadline = time.monotonic() + 60
    partial = None
    while time.monotonic() < deadline and p.poll() is None:
        found = glob.glob(pattern)
        if found and len(os.listdir(found[0])) >= 2:
            partial = found[0]
            os.kill(p.pid, signal.SIGKILL)
            break
        time.sleep(0.001)
    p.wait()
    if partial is None:
        check(False, f"step {step}: the writer ended (exit {p.returncode}) before it could be killed")
    else:
        check(p.returncode == -signal.SIGKILL, f"step {step}: writer exit {p.returncode}, expected SIGKILL")
        print(f"killed the writer of step {step} with {len(os.listdir(partial))} files in {os.path.basename(partial)}")
    return partial


def sha256sum_accepts(ckpt):
    p = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=ckpt, capture_output=True, text=True)
    print(p.stdout, end="")
    return p.returncode == 0


d = tempfile.mkdtemp(prefix="px_ckpt_kill_")
try:
    step1 = os.path.join(d, "step_00000001")
    check(run("write", d, "1", "2", "1", "0").returncode == 0, "writing step 1 failed")

    # ---- killed while writing a new step ----
    partial = kill_mid_write(d, 2)
    check(not os.path.exists(os.path.join(d, "step_00000002")), "step_00000002 exists after the writer was killed")
    p = run("check", d)
    check(p.returncode == 0, "the previous checkpoint does not load after the kill")
    check(f"latest {step1}\n" in p.stdout, "latest is not step 1")
    check("contents ok step 1 files 2" in p.stdout, "step 1's contents are wrong")
    if partial:
        check(f"note: skipped {partial}: incomplete: a writer was interrupted" in p.stdout,
              "the note does not report the interrupted partial directory")
    check(sha256sum_accepts(step1), "sha256sum -c rejects step 1")

    # The next write on this host removes the dead writer's directory.
    check(run("write", d, "3", "2", "1", "0").returncode == 0, "writing step 3 failed")
    check(partial is None or not os.path.exists(partial), "the partial directory survived the next write")
    p = run("check", d)
    check(f"latest {os.path.join(d, 'step_00000003')}\n" in p.stdout and "note:" not in p.stdout,
          "after the clean-up: latest is not step 3, or a note remains")

    # ---- killed while replacing an existing step ----
    partial = kill_mid_write(d, 3)
    p = run("check", d)
    check("contents ok step 3 files 2" in p.stdout, "the old step 3 was lost when its replacement was killed")
    check(sha256sum_accepts(os.path.join(d, "step_00000003")), "sha256sum -c rejects the old step 3")
    check(run("write", d, "4", "1", "1", "2").returncode == 0, "writing step 4 failed")
    check(partial is None or not os.path.exists(partial), "the partial directory of the killed replacement survived")
    left = sorted(os.listdir(d))
    check(left == ["step_00000003", "step_00000004"], f"with keep_last 2 the directory holds {left}")

    # ---- killed at random moments of a replacement (renames and removal
    # included): step 4 is always complete, old or new ----
    # Kill times spread over a whole write's duration (process start
    # included: slower in sanitizer builds), measured here first.
    t0 = time.monotonic()
    check(run("write", d, "4", "4", "1", "0").returncode == 0, "rewriting step 4 failed")
    whole = time.monotonic() - t0
    rng = __import__("random").Random(1234)
    outcomes = {}
    for i in range(20):
        files = 3 + i % 2  # alternate contents, so old and new differ
        p = subprocess.Popen([tool, "write", d, "4", str(files), "1", "0"], stdout=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, 1.2 * whole))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        c = subprocess.run([tool, "check", d], capture_output=True, text=True)
        ok = c.returncode == 0 and f"latest {os.path.join(d, 'step_00000004')}\n" in c.stdout
        check(ok, f"kill {i}: step 4 is not a complete checkpoint:\n{c.stdout}{c.stderr}")
        got = [ln for ln in c.stdout.splitlines() if ln.startswith("contents ok")]
        key = ("killed" if p.returncode == -signal.SIGKILL else "finished") + " / " + (got[0] if got else "?")
        outcomes[key] = outcomes.get(key, 0) + 1
    print("random kills:", outcomes)
finally:
    shutil.rmtree(d, ignore_errors=True)

if failures:
    print(f"test_checkpoint_survives_kill_mid_write: {failures} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("test_checkpoint_survives_kill_mid_write: ok")
