"""Collectives when the ranks sit on different hosts: MPICH is told to treat every rank as
remote (MPIR_CVAR_NOLOCAL, TCP over loopback), so cross_size() == size() and the runtime takes
its across-hosts paths (built-in MPI reductions, ops/core/mpi_communicator.cc). Four ranks, so
MPICH's reduce-scatter + allgather algorithm (power of two) is the one that runs."""

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

PROGRAM = r"""
import numpy as np
import tensorflow as tf
import mlsl_tf as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
assert hvd.cross_size() == n and hvd.local_size() == 1, (hvd.cross_size(), hvd.local_size())
checks = 0
for dtype in (tf.float32, tf.float64, tf.int32, tf.int64, tf.uint8, tf.int16, tf.float16, tf.bfloat16):
    for count in (3, 5000, 300000):  # below MPICH's short-message size, above it, several chunks
        x = (np.arange(count) % 7 + r + 1).astype(dtype.as_numpy_dtype)
        ranks = [(np.arange(count) % 7 + q + 1) for q in range(n)]
        want = {hvd.Sum: sum(ranks), hvd.Min: np.minimum.reduce(ranks), hvd.Max: np.maximum.reduce(ranks)}
        for op, expect in want.items():
            got = hvd.allreduce(tf.constant(x), op=op, name=f"{dtype.name}.{count}.{op}").numpy()
            np.testing.assert_array_equal(got.astype(np.float64), np.asarray(expect, np.float64) if dtype != tf.uint8
                                          else np.asarray(expect, np.float64) % 256, err_msg=f"{dtype.name} {count} {op}")
            checks += 1
        avg = hvd.allreduce(tf.constant(x), op=hvd.Average, name=f"avg.{dtype.name}.{count}")
        if dtype.is_floating:
            np.testing.assert_allclose(avg.numpy().astype(np.float64), sum(ranks) / n, rtol=1e-2)
            checks += 1
prod = hvd.allreduce(tf.fill([1000], float(r + 2)), op=hvd.Product, name="prod").numpy()
np.testing.assert_allclose(prod, np.prod([q + 2.0 for q in range(n)]))
rs = hvd.reducescatter(tf.fill([8, 3], float(r)), op=hvd.Sum, name="rs").numpy()
np.testing.assert_array_equal(rs, np.full([2, 3], sum(range(n)), np.float32))
every = hvd.allgather(tf.constant([checks + 2]), name="checks").numpy().tolist()
if r == 0:
    print("CHECKS", " ".join(map(str, every)), flush=True)
"""


def test_collectives_across_hosts_four_ranks():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "PMI_", "HYD"))}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", MPIR_CVAR_NOLOCAL="1",
               MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    out = subprocess.run([mpiexec, "-n", "4", sys.executable, "-c", PROGRAM], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    counts = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("CHECKS")]
    assert counts == [[str(8 * 3 * 3 + 4 * 3 + 2)] * 4], out.stdout  # every check ran on every rank
