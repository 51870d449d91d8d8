"""Claim: under mpiexec -n 2, the MPI backend (px_comm_init_mpi) leaves Open
MPI's shared-memory transport set to move large messages by copying them
through the shared segment (single_copy_mechanism "none") in fragments of
128 KiB (max_send_size 131072), as read back from Open MPI itself through
the MPI tool interface on both ranks; and when the user chose otherwise
(mpiexec --mca btl_vader_single_copy_mechanism cma, or the OMPI_MCA_
variables in the environment), the user's choice stands.

If it failed, every collective between the processes of a node would go
through process_vm_readv, which pins every page it reads: on this machine
1.6x slower for an all-reduce of 1 MiB and 3x for a send of 1 MiB; with
the default 32 KiB fragments DDP's buckets would move too little during
backward (src/comm/mpi.c, docs/PERFORMANCE.md "Figures behind code
comments"); or a user's own MPI tuning would be overridden.

Skipped (exit 77) without MPI or with an MPI other than Open MPI.
Time: two mpiexec starts of 2 processes, about 2 s."""

import os
import subprocess
import sys

import cli_util as cu

launcher = cu.mpiexec()
tool = os.path.join(cu.BUILD, "tests", "mpi_copy_mechanism")
if launcher is None or not os.path.exists(tool):
    print("plexus was built without MPI (or no mpiexec): nothing to test")
    sys.exit(77)


def mechanisms(extra_args, extra_env):
    """({rank: mechanism}, {rank: fragment bytes}, output)."""
    env = cu.mpi_env()
    for k in [k for k in env if k.endswith("single_copy_mechanism") or k.endswith("max_send_size")]:
        del env[k]
    env.update(extra_env)
    p = subprocess.run([launcher, "-n", "2"] + extra_args + [tool], capture_output=True, text=True, env=env,
                       timeout=120)
    if p.returncode == 77:
        print(p.stdout.strip())
        sys.exit(77)
    cu.check(p.returncode == 0, "mpi_copy_mechanism %s failed (rc %d):\n%s%s" %
             (" ".join(extra_args), p.returncode, p.stdout, p.stderr))
    values, frags = {}, {}
    for line in p.stdout.splitlines():
        if not line.startswith("rank "):
            continue
        rank = int(line.split(":")[0].split()[1])
        if "single_copy_mechanism=" in line:
            values[rank] = line.split("=", 1)[1].strip()
        elif "max_send_size=" in line:
            frags[rank] = int(line.split("=", 1)[1])
    cu.check(sorted(values) == [0, 1] and sorted(frags) == [0, 1],
             "expected both lines from ranks 0 and 1:\n%s" % p.stdout)
    return values, frags, p.stdout


got, frag, out = mechanisms([], {})
cu.check(all(v == "none" for v in got.values()), "by default: not the double copy on every rank:\n%s" % out)
cu.check(all(v == 131072 for v in frag.values()), "by default: fragments not of 128 KiB on every rank:\n%s" % out)
print("default:", got, frag)

got, frag, out = mechanisms(["--mca", "btl_vader_single_copy_mechanism", "cma",
                             "--mca", "btl_vader_max_send_size", "65536"], {})
cu.check(all(v == "cma" for v in got.values()), "mpiexec --mca ... cma was overridden:\n%s" % out)
cu.check(all(v == 65536 for v in frag.values()), "mpiexec --mca ...max_send_size 65536 was overridden:\n%s" % out)
print("--mca ... cma, --mca ...max_send_size 65536:", got, frag)

got, frag, out = mechanisms([], {"OMPI_MCA_btl_vader_single_copy_mechanism": "cma"})
cu.check(all(v == "cma" for v in got.values()), "OMPI_MCA_btl_vader_single_copy_mechanism=cma was overridden:\n%s" % out)
print("OMPI_MCA_...=cma:", got, frag)

cu.finish("test_mpi_backend_asks_open_mpi_for_the_double_copy_unless_told")
