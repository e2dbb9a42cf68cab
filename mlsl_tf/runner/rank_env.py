"""The environment every rank gets: -x specs, flags that only set a variable, and resolving them.

Pure functions of their arguments: no file access, no subprocess, no reading of
``os.environ`` (callers pass the environment in).
"""

import dataclasses
import math
import re
from typing import Callable, Iterable, Mapping, Optional

from mlsl_tf import cpu_placement
from mlsl_tf.runner.config import EnvSpec, RunConfig, UsageError

START_TIMEOUT_ENV = "MLSL_TF_START_TIMEOUT"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class EnvFlag:
    """A flag whose only effect is one environment variable on every rank.

    ``convert`` turns the flag's text into the variable's value and raises
    ValueError on bad input.  ``default`` is the flag's text for the library's
    default (None: the variable is unset by default), shown in --help;
    tests/unit/test_settings_owner.py checks it against the library's table,
    which owns the default.  Adding such a flag is one entry in ENV_FLAGS.
    A ``switch`` takes no value: given, its text is ``"on"`` (``--autotune``).
    """

    option: str
    env_var: str
    convert: Callable[[str], str]
    help: str
    default: Optional[str] = None
    switch: bool = False

    @property
    def help_text(self) -> str:
        return self.help if self.default is None else f"{self.help} (default: {self.default})"


def _mb_to_bytes(text: str) -> str:
    value = float(text)
    if value < 0:
        raise ValueError(f"expected a size in MB >= 0, got {text!r}")
    return str(int(value * 1024 * 1024))


def _positive_mb_to_bytes(text: str) -> str:
    value = float(text)
    if not value > 0:
        raise ValueError(f"expected a size in MB > 0, got {text!r}")
    return str(max(1, int(value * 1024 * 1024)))


def _positive_int(text: str) -> str:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {text!r}")
    return str(value)


def _policy(text: str) -> str:
    if text not in ("priority", "fifo"):
        raise ValueError(f"expected 'priority' or 'fifo', got {text!r}")
    return text


def _core_list(text: str) -> str:
    if not cpu_placement.parse_comm_cores(text):  # ValueError for a bad entry
        raise ValueError(f"expected a core number or a comma-separated list of them, got {text!r}")
    return ",".join(str(c) for c in cpu_placement.parse_comm_cores(text))


def _binding(text: str) -> str:
    text = text.strip().lower()
    if text not in ("auto", "none"):
        raise ValueError(f"expected 'auto' or 'none', got {text!r}")
    return text


def _on_off(text: str) -> str:
    if text not in ("on", "off"):
        raise ValueError(f"expected 'on' or 'off', got {text!r}")
    return "1" if text == "on" else "0"


def _count(text: str) -> str:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected an integer >= 0, got {text!r}")
    return str(value)


def _path(text: str) -> str:
    if not text:
        raise ValueError("expected a file path")
    return text


# Flags that only set an environment variable on every rank (the settings of ops/core/settings.cc).
ENV_FLAGS: tuple[EnvFlag, ...] = (
    EnvFlag("--fusion-threshold-mb", "MLSL_TF_FUSION_THRESHOLD", _mb_to_bytes,
            "fuse small allreduces into buffers of up to this many MB (0 = off)", "1"),
    EnvFlag("--chunk-mb", "MLSL_TF_CHUNK_BYTES", _positive_mb_to_bytes,
            "cut allreduces into chunks of this many MB; the scheduler re-picks between chunks", "1"),
    EnvFlag("--inflight", "MLSL_TF_INFLIGHT", _positive_int, "chunks in flight at once", "4"),
    EnvFlag("--priority", "MLSL_TF_PRIORITY", _policy, "scheduling policy: priority or fifo", "priority"),
    EnvFlag("--comm-core", "MLSL_TF_COMM_CORE", _core_list,
            "pin each rank's background thread to this core (a list: local rank i gets the (i mod n)-th; "
            "default: not pinned)"),
    EnvFlag("--bind", "MLSL_TF_BIND", _binding,
            "auto: each rank's threads on its own block of the machine's cores unless the launcher "
            "bound them; none: leave them", "auto"),
    EnvFlag("--timeline-filename", "MLSL_TF_TIMELINE", _path,
            "write a Chrome-trace timeline (rank 0; '{rank}' in the name: every rank; default: none)"),
    EnvFlag("--autotune", "MLSL_TF_AUTOTUNE", _on_off,
            "in the first steps, time candidate in-flight windows and spin times (the settings that change "
            "no result bit) and keep the fastest, the same on every rank (docs/autotune.md)", "off", switch=True),
    EnvFlag("--autotune-log-file", "MLSL_TF_AUTOTUNE_LOG", _path,
            "autotune: rank 0 writes what it tried, the seconds per step of each, and what won to this CSV "
            "file (default: none)"),
    EnvFlag("--autotune-warmup-samples", "MLSL_TF_AUTOTUNE_WARMUP_SAMPLES", _count,
            "autotune: samples' worth of steps discarded before the first sample", "3"),
    EnvFlag("--autotune-steps-per-sample", "MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE", _positive_int,
            "autotune: training steps timed per sample", "10"),
)


def parse_env_spec(text: str) -> EnvSpec:
    """Parse one ``-x`` value: ``VAR`` (pass through) or ``VAR=VAL`` (VAL may be empty)."""
    name, sep, value = text.partition("=")
    if not _ENV_NAME.match(name):
        raise UsageError(f"-x {text!r}: {name!r} is not a valid environment variable name")
    return EnvSpec(name, value if sep else None)


def resolve_env(cfg: RunConfig, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The (VAR, value) pairs every rank gets explicitly, in a stable order.

    ``-x VAR`` takes its value from ``environ`` and is skipped when unset there
    (see missing_env).  Then ENV_FLAGS values, then MLSL_TF_START_TIMEOUT.
    A later pair for the same VAR replaces an earlier one.
    """
    pairs: dict[str, str] = {}
    for spec in cfg.env:
        if spec.value is not None:
            pairs[spec.name] = spec.value
        elif spec.name in environ:
            pairs[spec.name] = environ[spec.name]
    pairs.update(cfg.flag_env)
    if cfg.start_timeout is not None:
        pairs[START_TIMEOUT_ENV] = start_timeout_value(cfg.start_timeout)
    return tuple(pairs.items())


# What a launcher must not copy from mlslrun's environment to the ranks: MPI's, the launchers'
# and SLURM's per-job and per-host state (each rank gets its own), exported shell functions,
# the shell's own bookkeeping, and GPU assignment (Horovod's exclusions, plus the launchers').
_NOT_FORWARDED = re.compile(r"(OMPI_|PMIX_|PMI_|ORTE_|OPAL_|HYDRA_|MPIEXEC_|I_MPI_HYDRA_|SLURM_|BASH_FUNC_)"
                            r"|(PWD|OLDPWD|SHLVL|_|HOSTNAME|MPI_LOCALRANKID|MPI_LOCALNRANKS)\Z"
                            r"|.*CUDA_VISIBLE_DEVICES\Z")


def forwarded_names(names: Iterable[str]) -> tuple[str, ...]:
    """Of the environment's variable ``names``, those a launcher that does not forward the
    environment itself (Open MPI, to other hosts) is told to pass on, sorted."""
    return tuple(sorted(n for n in names if _ENV_NAME.match(n) and not _NOT_FORWARDED.match(n)))


def missing_env(cfg: RunConfig, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Names given as ``-x VAR`` (no value) that are not set in ``environ``."""
    return tuple(s.name for s in cfg.env if s.value is None and s.name not in environ)


def start_timeout_value(seconds: float) -> str:
    """MLSL_TF_START_TIMEOUT for --start-timeout: whole seconds, rounded up (the library's table
    declares an integer, and init() refuses any other value on every rank)."""
    return str(math.ceil(seconds))


def format_seconds(seconds: float) -> str:
    """``30`` for 30.0, ``2.5`` for 2.5: the shortest exact text of a duration."""
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))
