"""horovod.runner.common.util.env's one name the suite uses: this process's rank and the world
size as the launcher's environment gives them, before init()."""

import os

# (rank variable, size variable) of each launcher, in Horovod's order of preference
_PAIRS = (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
          ("PMI_RANK", "PMI_SIZE"), ("PMIX_RANK", "PMIX_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))


def get_env_rank_and_size():
    """(rank, size) from the launcher's variables, or None outside a launcher."""
    for rank, size in _PAIRS:
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None
