"""The runtime restarted with settings, for multi-rank tests that compare settings: every rank
shuts down and initialises again at the same point (a barrier on each side, so nobody shuts down
while a peer still has collectives in flight)."""

import contextlib
import os

from mpi4py import MPI

import mlsl_tf as hvd


def restart():
    MPI.COMM_WORLD.Barrier()
    hvd.shutdown()
    MPI.COMM_WORLD.Barrier()
    hvd.init()


@contextlib.contextmanager
def settings(env, variables):
    """The runtime re-initialised with `env` and none of the other `variables` set; the
    environment as it was and the runtime re-initialised again after."""
    saved = {k: os.environ.get(k) for k in variables}
    try:
        for k in variables:
            os.environ.pop(k, None)
        os.environ.update(env)
        restart()
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        restart()
