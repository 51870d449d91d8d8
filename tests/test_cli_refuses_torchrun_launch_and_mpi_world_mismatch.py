"""Claim: `plexus train` started the way torchrun starts processes
(WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR set, no MPI launcher) stops at
once, exit 1, with a message that names the variables and says how to
launch instead (mpirun -n N, srun --mpi=pmix, --threads N), and writes
nothing; torchrun's world of one (WORLD_SIZE=1) trains.  Under mpiexec -n 2
with WORLD_SIZE=3 in the environment the ranks agree to stop, naming both
sizes.

If it fails, a job started by torchrun trains as N copies of a world of one
without a word."""

import os
import shutil
import subprocess
import tempfile

import cli_util as cu

ARGS = ["train", "--model", "mlp", "--hidden", "8", "--data-path", cu.FMNIST, "--train-subset", "64",
        "--val-subset", "32", "--steps", "1", "--progress", "lines"]
TORCHRUN = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"}


def main():
    tmp = tempfile.mkdtemp(prefix="px_launch_")
    try:
        env = dict(os.environ, **TORCHRUN)
        out = os.path.join(tmp, "torchrun")
        p = cu.run(ARGS + ["--out", out], env=env, expect_ok=False)
        cu.check(p.returncode == 1, "torchrun's environment: exit %d, expected 1" % p.returncode)
        for want in ("WORLD_SIZE=2", "RANK=1", "MASTER_ADDR=10.0.0.7", "mpirun -n N", "srun --mpi=pmix", "--threads N"):
            cu.check(want in p.stderr, "the message lacks %r: %s" % (want, p.stderr))
        cu.check("step " not in p.stdout, "it trained anyway:\n%s" % p.stdout[:300])
        cu.check(not os.path.exists(os.path.join(out, "checkpoints")), "it wrote checkpoints")
        p = cu.run(ARGS, env=dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1"))
        cu.check(p.returncode == 0, "torchrun's world of one does not train")

        mpi = cu.mpiexec()
        if mpi:
            env = cu.mpi_env()
            cmd = [mpi, "-n", "2", "--oversubscribe", "-x", "WORLD_SIZE=3", cu.PLEXUS] + ARGS
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            cu.check(p.returncode != 0, "mpiexec -n 2 with WORLD_SIZE=3 was not refused")
            cu.check("WORLD_SIZE" in p.stderr and "3 processes" in p.stderr and "MPI's world has 2" in p.stderr,
                     "the mismatch message does not name both sizes: %s" % p.stderr[-800:])
            cu.check("step " not in p.stdout, "it trained anyway:\n%s" % p.stdout[:300])
            p = subprocess.run([mpi, "-n", "2", "--oversubscribe", "-x", "WORLD_SIZE=2", cu.PLEXUS] + ARGS,
                               capture_output=True, text=True, env=env, timeout=300)
            cu.check(p.returncode == 0 and "2 ranks (mpi backend)" in p.stdout,
                     "mpiexec -n 2 with a matching WORLD_SIZE=2 does not train: %s" % p.stderr[-500:])
        else:
            print("(plexus built without MPI: the mpiexec case is skipped)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_cli_refuses_torchrun_launch_and_mpi_world_mismatch")


main()
