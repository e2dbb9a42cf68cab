"""Where a rank runs: its rank and local rank from the launcher's environment, the CPUs its command gets.

The CPUs leave out the communication cores MLSL_TF_COMM_CORE reserves.  Standard library and
mlsl_tf.cpu_placement (standard library only when imported): the rank wrapper (task.py) loads it."""

import os
from typing import Mapping, Optional, Sequence

from mlsl_tf import cpu_placement

RANK_ENV_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMIX_RANK")
# MPICH/Intel MPI hydra, Open MPI, SLURM: this process's rank among the ranks of its host.
LOCAL_RANK_ENV_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
COMM_CORE_ENV = cpu_placement.COMM_CORE


def find_rank(environ: Mapping[str, str]) -> int:
    """This process's rank from the first of RANK_ENV_VARS that is set.

    Raises ValueError when none is set or the value is not an integer.
    """
    for name in RANK_ENV_VARS:
        if name in environ:
            try:
                return int(environ[name])
            except ValueError:
                raise ValueError(f"{name}={environ[name]!r} is not a rank number") from None
    raise ValueError("cannot find this process's rank: none of "
                     f"{', '.join(RANK_ENV_VARS)} is set (run it under mlslrun)")


def find_local_rank(environ: Mapping[str, str]) -> Optional[int]:
    """This process's rank on its host from the first of LOCAL_RANK_ENV_VARS that is set, or
    None.  Raises ValueError when the value is not an integer."""
    for name in LOCAL_RANK_ENV_VARS:
        if name in environ:
            try:
                return int(environ[name])
            except ValueError:
                raise ValueError(f"{name}={environ[name]!r} is not a local rank number") from None
    return None


def worker_cpus(allowed: set[int], comm_cores: Sequence[int], mine: int) -> tuple[Optional[set[int]], Optional[str]]:
    """(CPUs for the command, None) or (None, why the affinity is left alone).

    Leaves out every listed communication core it can (other local ranks' background threads
    run there too), else only this rank's; never leaves the command without a core."""
    if mine not in allowed:
        return None, (f"comm core {mine} is not among this rank's cores {_cpu_list(allowed)}; "
                      "the affinity is left as it is")
    rest = allowed - set(comm_cores)
    if not rest:
        rest = allowed - {mine}
    if not rest:
        return None, (f"only core {mine} is available, which is also the comm core; "
                      "TensorFlow's threads will share it with the background thread")
    return rest, None


def _cpu_list(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def affinity_plan(environ: Mapping[str, str], allowed: set[int]) -> tuple[Optional[set[int]], Optional[str]]:
    """What to do for MLSL_TF_COMM_CORE in ``environ``: (CPUs for the command or None, a
    warning or None).  No setting: (None, None)."""
    try:
        comm_cores = cpu_placement.parse_comm_cores(environ.get(COMM_CORE_ENV, ""))
        if not comm_cores:
            return None, None
        local_rank = find_local_rank(environ)
    except ValueError as e:
        return None, f"{e}; the affinity is left as it is"
    if not allowed:
        return None, "this platform does not report a CPU affinity; the affinity is left as it is"
    if local_rank is None:
        return None, (f"{COMM_CORE_ENV} is set but none of {', '.join(LOCAL_RANK_ENV_VARS)} is, so this "
                      "rank's comm core is unknown; the affinity is left as it is")
    return worker_cpus(allowed, comm_cores, cpu_placement.comm_core_for(comm_cores, local_rank))


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on; empty where the platform does not say (not Linux)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: no affinity to restrict
        return set()
