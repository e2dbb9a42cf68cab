"""horovod.common.util's one name the suite uses."""

from packaging import version


def is_version_greater_equal_than(ver, target):
    return version.parse(ver) >= version.parse(target)
