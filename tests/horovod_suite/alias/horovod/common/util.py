"""horovod.common.util's names the suite uses."""

from packaging import version


def is_version_greater_equal_than(ver, target):
    return version.parse(ver) >= version.parse(target)


def gpu_available(ext_base_name, verbose=False):
    """mlsl_tf reduces on the host: no extension runs with a GPU."""
    from mlsl_tf import gpu_available as mlsl_gpu_available
    return mlsl_gpu_available(ext_base_name, verbose)


def num_rank_is_power_2(num_rank):
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0
