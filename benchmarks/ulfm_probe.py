"""Does the MPI here let survivors of a dead rank shrink in place (ULFM)?  The probe behind
elastic training's design (docs/design.md, Elastic training).

    mpiexec -disable-auto-cleanup -n 3 .venv/bin/python benchmarks/ulfm_probe.py
    (add MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp for TCP instead of shared memory)

Rank 2 SIGKILLs itself during a loop of 256 KiB MPI_Allreduce calls on a communicator whose errors
return; the survivors print how long the failing call took to return an error, then try
MPIX_Comm_revoke, MPIX_Comm_shrink and an allreduce on the shrunk communicator.  Run it under a
timeout: survivors that never return are the answer too (measured with PyPI's MPICH 5: no error
within 40 s on shared memory or TCP, so no shrink)."""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # hydra's notice of a rank's end would end the survivors
comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
rank = comm.Get_rank()
buf = np.ones(1 << 16, np.float32)
out = np.empty_like(buf)
comm.Allreduce(buf, out)
if rank == 2:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
start = time.time()
try:
    for _ in range(1_000_000):
        comm.Allreduce(buf, out)
    print(rank, f"no error after {time.time() - start:.1f} s", flush=True)
except MPI.Exception as e:
    failed = time.time()
    print(rank, f"error after {failed - start:.3f} s: class {e.Get_error_class()}", flush=True)
    try:
        comm.Revoke()
        shrunk = comm.Shrink()
        shrunk.Allreduce(buf, out)
        print(rank, f"shrunk to {shrunk.Get_size()} ranks and reduced in {time.time() - failed:.3f} s", flush=True)
    except Exception as e2:  # noqa: BLE001 - the probe reports whatever the MPI does
        print(rank, f"revoke/shrink failed: {e2!r}", flush=True)
sys.stdout.flush()
os._exit(0)
