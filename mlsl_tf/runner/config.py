"""The values mlslrun works with: RunConfig, its parts and UsageError (data only, no I/O).

The runner's bottom floor: it imports no other module of the package.
"""

import dataclasses
from typing import Literal, Optional

LauncherChoice = Literal["auto", "mpi", "srun"]


class UsageError(ValueError):
    """A bad mlslrun command line; the message names the offending flag or value."""


@dataclasses.dataclass(frozen=True)
class HostSlots:
    """One host and how many ranks may run on it (slots >= 1)."""

    host: str
    slots: int


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """One ``-x`` flag: ``value`` None means pass the launching shell's value."""

    name: str
    value: Optional[str]


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """horovodrun's elastic flags: a job of min_np to max_np (None: every usable slot) workers over the hosts that
    ``discovery_script`` prints (None: the -H / --hostfile hosts), bare hosts with
    ``slots_per_host`` slots; ``cooldown_range`` (low, high) seconds a failed host stays out (None:
    for good); ``reset_limit`` resets at most (None: no limit); ``elastic_timeout`` seconds to wait
    for min_np slots."""

    min_np: int
    max_np: Optional[int]
    discovery_script: Optional[str] = None
    slots_per_host: int = 1
    elastic_timeout: float = 600.0
    reset_limit: Optional[int] = None
    cooldown_range: Optional[tuple[float, float]] = None
    network_interfaces: Optional[tuple[str, ...]] = None  # where the workers reach the driver (None: chosen)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What the user asked mlslrun for, validated (except the hostfile's contents).

    ``num_proc`` is None only when ``check_build`` or ``show_help`` is set.
    ``hosts`` is the parsed ``-H`` list; ``hostfile`` the path given to
    ``--hostfile`` (read by launch.py, parsed by hosts.parse_hostfile).
    ``flag_env`` holds (VAR, value) pairs produced by rank_env.ENV_FLAGS entries.
    ``tag_output``: prefix each line of a rank's output with ``[R]<stdout>:`` / ``[R]<stderr>:``.
    ``ssh_port`` / ``ssh_identity_file``: how ssh reaches the hosts (None: ssh's defaults);
    ``ssh_check``: check every remote host through ssh before launching (ssh_check.py).
    ``elastic``: the elastic flags (elastic_driver.py runs the job), None for a fixed job.
    ``oversubscribe``: allow more ranks on this host than OVERSUBSCRIBE_PER_CORE per core.
    """

    num_proc: Optional[int]
    command: tuple[str, ...]
    hosts: Optional[tuple[HostSlots, ...]] = None
    hostfile: Optional[str] = None
    env: tuple[EnvSpec, ...] = ()
    verbose: bool = False
    output_filename: Optional[str] = None
    start_timeout: Optional[float] = None
    launcher: LauncherChoice = "auto"
    check_build: bool = False
    show_help: bool = False
    mpi_args: tuple[str, ...] = ()
    flag_env: tuple[tuple[str, str], ...] = ()
    tag_output: bool = True
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    ssh_check: bool = True
    elastic: Optional[ElasticConfig] = None
    oversubscribe: bool = False
