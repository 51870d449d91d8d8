"""Claim: the console progress reads well wherever it goes.

- Under mpiexec with the output going to a file -- where Open MPI still
  gives every rank a pseudo-terminal -- the default is plain lines: the log
  holds the step lines and no carriage return or escape code.
- With stdout a file (no launcher) the same.
- On a terminal (a pseudo-terminal here) the bar redraws between the
  --log-every records: frames for steps that are not log steps appear, at
  most about 10 a second (counted against the run's duration), and the
  log steps' records are all shown.

If it fails, log files fill with \\r and escape codes, or the bar stands
still for --log-every steps."""

import os
import pty
import re
import select
import shutil
import subprocess
import tempfile
import time

import cli_util as cu

ARGS = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "1280", "--val-subset", "64", "--epochs", "1", "--batch-size", "16"]


def check_plain(text, label, steps):
    cu.check("\r" not in text and "\x1b" not in text, "%s: the log holds \\r or escape codes: %r" % (label, text[:300]))
    lines = re.findall(r"^step (\d+)/(\d+) epoch", text, re.M)
    cu.check([int(a) for a, _ in lines] == steps, "%s: step lines %s, expected %s" % (label, lines, steps))


def main():
    tmp = tempfile.mkdtemp(prefix="px_progress_")
    try:
        steps = list(range(10, 41, 10))  # 1280 / (2 ranks × 16) = 40 steps, one line every 10
        log = os.path.join(tmp, "file.log")
        with open(log, "w") as f:
            p = subprocess.run([cu.PLEXUS] + ARGS + ["--threads", "2", "--log-every", "10"], stdout=f,
                               stderr=subprocess.STDOUT, timeout=300)
        cu.check(p.returncode == 0, "a run with stdout a file failed")
        check_plain(open(log).read(), "stdout a file", steps)

        mpi = cu.mpiexec()
        if mpi:
            log = os.path.join(tmp, "mpi.log")
            with open(log, "w") as f:
                p = subprocess.run([mpi, "-n", "2", "--oversubscribe", cu.PLEXUS] + ARGS + ["--log-every", "10"],
                                   stdout=f, stderr=subprocess.STDOUT, env=cu.mpi_env(), timeout=300)
            cu.check(p.returncode == 0, "the run under mpiexec failed: %s" % open(log).read()[-2000:])
            check_plain(open(log).read(), "mpiexec, output to a file", steps)
        else:
            print("(plexus built without MPI: the mpiexec case is skipped)")

        # A terminal: the bar.  --log-every 20: records at steps 20 and 40 only.
        master, slave = pty.openpty()
        env = dict(os.environ, TERM="xterm")
        for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
            env.pop(v, None)
        t0 = time.time()
        proc = subprocess.Popen([cu.PLEXUS] + ARGS + ["--threads", "2", "--log-every", "20"], stdout=slave,
                                stderr=slave, env=env)
        os.close(slave)
        chunks = []
        while True:
            r, _, _ = select.select([master], [], [], 1.0)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        proc.wait(timeout=60)
        seconds = time.time() - t0
        os.close(master)
        out = b"".join(chunks).decode(errors="replace")
        cu.check(proc.returncode == 0, "the run on a terminal failed: %s" % out[-1000:])
        frames = [int(s) for s in re.findall(r"\r\[[#.]{20}\] (\d+)/40 ", out)]
        between = [s for s in frames if s % 20]
        print("terminal: %d frames in %.1f s, steps %s" % (len(frames), seconds, frames))
        cu.check(20 in frames and 40 in frames, "the log steps' records are not on the bar: %s" % frames)
        cu.check(len(between) >= 1, "the bar showed only the --log-every steps %s: it does not move every step" % frames)
        cu.check(len(between) <= 10 * seconds + 2, "%d frames between records in %.1f s: more than ~10 a second" %
                 (len(between), seconds))
        cu.check(frames == sorted(frames), "frames out of order: %s" % frames)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_cli_progress_is_plain_lines_under_mpiexec_and_a_bar_on_a_terminal")


main()
