"""fault_util.py -- what the fault tests share: the short DDP run they
break (a checkpoint every 2 steps, the watchdog at TIMEOUT s), where they
break it (PX_COMM_FAULT specs for mid-backward, mid-all-reduce and
mid-checkpoint, with the label rank 0's watchdog must give), running the
job while reading its stderr (with a hook called when the fault fires),
and checking what is left: checkpoints that verify, the last model's
digest, the final held-out loss.  Used by
tests/test_mpi_faults_name_the_rank_and_resume.py (signals on one machine)
and tests/rig/test_rig_cut_link_at_fault_points_names_rank_and_resumes.py
(a cut link between hosts of the rig)."""

import hashlib
import os
import re
import subprocess
import threading
import time

import cli_util as cu

TIMEOUT = 4
ARGS = ["train", "--model", "mlp", "--hidden", "64", "--depth", "2", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "512", "--val-subset", "32", "--batch-size", "16", "--optim", "adam", "--lr", "0.001",
        "--ckpt-every", "2", "--keep-last", "3", "--steps", "8", "--workers", "1", "--progress", "lines",
        "--timeout", str(TIMEOUT), "--seed", "5"]

# name, PX_COMM_FAULT after "RANK:SIGNAL:", the label rank 0's watchdog must give
WHERE = [
    ("mid-backward", "before:1:DDP step 5, bucket 0", "allreduce (DDP step 5, bucket 0)"),
    ("mid-all-reduce", "after:1:DDP step 5, bucket 0", "allreduce (DDP step 5, bucket 0)"),
    ("mid-checkpoint", "before:3:checkpoint of step 4", "(checkpoint of step 4)"),
]
FIRED = "PX_COMM_FAULT: signal"


def verifies(ck):
    """Every file SHA256SUMS lists in checkpoint ck is there with its digest."""
    sums = os.path.join(ck, "SHA256SUMS")
    if not os.path.exists(sums):
        return False
    for line in open(sums):
        digest, name = line.rstrip("\n").split("  ", 1)
        path = os.path.join(ck, name)
        if not os.path.exists(path):
            return False
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digest:
                return False
    return True


def final_loss(stdout):
    """The held-out loss of the final weights ("plexus train: done: ... test loss 1.7675, ...")."""
    found = re.findall(r"test loss (\S+), accuracy", stdout)
    return found[-1] if found else None


def model_sum(out):
    """(name of the newest checkpoint in out, its model.safetensors' digest)."""
    ck = cu.checkpoints(os.path.join(out, "checkpoints"))
    if not ck:
        return None, None
    return os.path.basename(ck[-1]), cu.sha256sums(ck[-1]).get("model.safetensors")


def run_fault(cmd, env, on_fault=None, limit=90):
    """Runs the job; returns (rc, stderr, seconds from the fault firing --
    or from on_fault's return, when given -- to the job's end, total
    seconds), stderr read line by line as it comes.  on_fault() is called
    once (in the reading thread), when the faulting rank says it fires.
    The job's end is mpiexec's exit, not the end of its stderr: a daemon
    on a host cut off may outlive mpiexec holding the pipe open."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines, t_fault = [], []

    def read():
        for line in proc.stderr:
            lines.append(line)
            if not t_fault and FIRED in line:
                if on_fault is not None:
                    on_fault()
                t_fault.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    t_end = time.monotonic()
    reader.join(timeout=5)
    return (proc.returncode, "".join(lines), (t_end - t_fault[0]) if t_fault else None, t_end - t0)


def complete_checkpoints(out):
    ck = os.path.join(out, "checkpoints")
    names = os.listdir(ck) if os.path.isdir(ck) else []
    return sorted(n for n in names if n.startswith("step_") and ".partial" not in n), names
