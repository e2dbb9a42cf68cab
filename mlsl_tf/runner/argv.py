"""mlslrun's command line and the launcher command lines it builds.

Everything here is a pure function of its arguments: no file access, no
subprocess, no reading of ``os.environ`` (callers pass the environment in).
launch.py does the I/O and calls these; tests call them directly without MPI.

Every launcher command is an argv list, never a shell string.
"""

import argparse
import dataclasses
import re
import shlex
from typing import Callable, Iterable, Literal, Mapping, Optional, Sequence

# MPI flavours mlslrun can drive; "slurm" means srun, whatever MPI is inside.
Flavour = Literal["mpich", "openmpi", "intel", "slurm"]
LauncherChoice = Literal["auto", "mpi", "srun"]

START_TIMEOUT_ENV = "MLSL_TF_START_TIMEOUT"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HOST_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]]+\Z")


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
class EnvFlag:
    """A flag whose only effect is one environment variable on every rank.

    ``convert`` turns the flag's text into the variable's value and raises
    ValueError on bad input.  Adding such a flag is one entry in ENV_FLAGS.
    """

    option: str
    env_var: str
    convert: Callable[[str], str]
    help: str


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
    cores = [c for c in text.split(",") if c]
    if not cores or not all(c.isdigit() for c in cores):
        raise ValueError(f"expected a core number or a comma-separated list of them, got {text!r}")
    return ",".join(cores)


def _path(text: str) -> str:
    if not text:
        raise ValueError("expected a file path")
    return text


# Flags that only set an environment variable on every rank (the settings of ops/core/settings.cc).
ENV_FLAGS: tuple[EnvFlag, ...] = (
    EnvFlag("--fusion-threshold-mb", "MLSL_TF_FUSION_THRESHOLD", _mb_to_bytes,
            "fuse small allreduces into buffers of up to this many MB (0 = off)"),
    EnvFlag("--chunk-mb", "MLSL_TF_CHUNK_BYTES", _positive_mb_to_bytes,
            "cut allreduces into chunks of this many MB; the scheduler re-picks between chunks"),
    EnvFlag("--inflight", "MLSL_TF_INFLIGHT", _positive_int, "chunks in flight at once"),
    EnvFlag("--priority", "MLSL_TF_PRIORITY", _policy, "scheduling policy: priority (default) or fifo"),
    EnvFlag("--comm-core", "MLSL_TF_COMM_CORE", _core_list,
            "pin each rank's background thread to this core (a list: local rank i gets the (i mod n)-th)"),
    EnvFlag("--timeline-filename", "MLSL_TF_TIMELINE", _path,
            "write a Chrome-trace timeline (rank 0; '{rank}' in the name: every rank)"),
)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What the user asked mlslrun for, validated (except the hostfile's contents).

    ``num_proc`` is None only when ``check_build`` or ``show_help`` is set.
    ``hosts`` is the parsed ``-H`` list; ``hostfile`` the path given to
    ``--hostfile`` (read by launch.py, parsed by parse_hostfile).
    ``flag_env`` holds (VAR, value) pairs produced by ENV_FLAGS entries.
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


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything a flavour's builder needs; independent of the flavour.

    ``hosts`` is an exact allocation (sum of slots == num_proc) or None for
    "let the launcher decide" (local run or the SLURM allocation).
    ``rank_command`` is what every rank runs (task.py wrapping the user command).
    """

    program: str
    num_proc: int
    hosts: Optional[tuple[HostSlots, ...]]
    env: tuple[tuple[str, str], ...]
    mpi_args: tuple[str, ...]
    rank_command: tuple[str, ...]


# ---------------------------------------------------------------------------
# Parsing the mlslrun command line.


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing and exiting."""

    def error(self, message: str):  # noqa: D401 - argparse hook
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The mlslrun argument parser (no -h handling side effects: see show_help)."""
    p = _Parser(
        prog="mlslrun",
        add_help=False,
        allow_abbrev=False,
        description="Launch a training script on N ranks with MPI or srun "
        "(horovodrun-compatible flags).",
        epilog="Example: mlslrun -np 4 -H a:2,b:2 -x PATH python train.py",
    )
    p.add_argument("-h", "--help", action="store_true", dest="show_help",
                   help="show this help and exit")
    p.add_argument("-np", "--num-proc", type=int, dest="num_proc", metavar="N",
                   help="number of ranks (required)")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...",
                       help="hosts and slots, e.g. a:2,b:2 (default: this machine)")
    hosts.add_argument("--hostfile", dest="hostfile", metavar="FILE",
                       help="file with one 'host slots=N' (or 'host:N') per line")
    p.add_argument("-x", dest="env", action="append", default=[], metavar="VAR[=VAL]",
                   help="set VAR on every rank: to VAL, or to its value here")
    p.add_argument("--verbose", action="store_true", help="print the command mlslrun runs")
    p.add_argument("--output-filename", dest="output_filename", metavar="DIR",
                   help="also write each rank's output to DIR/rank.R/{stdout,stderr}")
    p.add_argument("--start-timeout", dest="start_timeout", type=float, metavar="S",
                   help="fail if some rank has not started after S seconds "
                   "(checked only when all hosts see this machine's temp dir); "
                   f"also sets {START_TIMEOUT_ENV} on every rank")
    p.add_argument("--launcher", choices=("auto", "mpi", "srun"), default="auto",
                   help="auto: srun inside a SLURM job if srun exists, else mpiexec")
    p.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                   help="show the frameworks, controllers and tensor ops available")
    p.add_argument("--mpi-args", dest="mpi_args", metavar='"ARGS"',
                   help="extra arguments (shell-quoted) appended to the mpiexec/srun command")
    for flag in ENV_FLAGS:
        p.add_argument(flag.option, dest=_flag_dest(flag), metavar="VALUE", help=flag.help)
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the program every rank runs, e.g. python train.py")
    return p


def _flag_dest(flag: EnvFlag) -> str:
    return "envflag_" + flag.option.lstrip("-").replace("-", "_")


# Options that take a value (the next word unless written --opt=value).
_VALUE_OPTIONS = frozenset({"-np", "--num-proc", "-H", "--hosts", "--hostfile", "-x",
                            "--output-filename", "--start-timeout", "--launcher",
                            "--mpi-args"} | {f.option for f in ENV_FLAGS})


def _join_option_values(argv: Sequence[str], options: Iterable[str]) -> list[str]:
    """Turn ``--opt VALUE`` into ``--opt=VALUE`` for ``options``, whose VALUE may
    start with '-' (argparse would take it for a flag).  Stops at the user's
    command (the first word that is neither an option nor an option's value)."""
    options = set(options)
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-"):
            break
        if word in _VALUE_OPTIONS and i + 1 < len(argv):
            value = argv[i + 1]
            out += [f"{word}={value}"] if word in options else [word, value]
            i += 2
        else:
            out.append(word)
            i += 1
    return out + list(argv[i:])


def parse_args(argv: Sequence[str]) -> RunConfig:
    """Parse mlslrun's arguments (without the program name) into a RunConfig.

    Raises UsageError (a ValueError) naming the problem: unknown flag, missing
    -np or command, bad -H or -x syntax, -np larger than the -H slots, ...
    The hostfile is not read here; see parse_hostfile and check_slots.
    """
    ns = build_parser().parse_args(_join_option_values(argv, ["--mpi-args"]))
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    cfg = RunConfig(
        num_proc=ns.num_proc,
        command=tuple(command),
        hosts=parse_hosts(ns.hosts) if ns.hosts is not None else None,
        hostfile=ns.hostfile,
        env=tuple(parse_env_spec(s) for s in ns.env),
        verbose=ns.verbose,
        output_filename=ns.output_filename,
        start_timeout=ns.start_timeout,
        launcher=ns.launcher,
        check_build=ns.check_build,
        show_help=ns.show_help,
        mpi_args=tuple(_split_mpi_args(ns.mpi_args)),
        flag_env=tuple(_flag_env(ns)),
    )
    _validate(cfg)
    return cfg


def _split_mpi_args(text: Optional[str]) -> list[str]:
    if text is None:
        return []
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--mpi-args {text!r}: {e}") from None


def _flag_env(ns: argparse.Namespace) -> list[tuple[str, str]]:
    pairs = []
    for flag in ENV_FLAGS:
        text = getattr(ns, _flag_dest(flag))
        if text is None:
            continue
        try:
            pairs.append((flag.env_var, flag.convert(text)))
        except ValueError as e:
            raise UsageError(f"{flag.option} {text!r}: {e}") from None
    return pairs


def _validate(cfg: RunConfig) -> None:
    """Raise UsageError for a RunConfig that cannot be launched."""
    if cfg.show_help or cfg.check_build:
        return
    if cfg.num_proc is None:
        raise UsageError("-np N is required (the number of ranks to start)")
    if cfg.num_proc < 1:
        raise UsageError(f"-np must be at least 1, got {cfg.num_proc}")
    if not cfg.command:
        raise UsageError("missing the command to run, e.g.: mlslrun -np 2 python train.py")
    if cfg.start_timeout is not None and not cfg.start_timeout > 0:
        raise UsageError(f"--start-timeout must be > 0 seconds, got {cfg.start_timeout}")
    if cfg.output_filename is not None and not cfg.output_filename:
        raise UsageError("--output-filename needs a directory name")
    if cfg.hosts is not None:
        check_slots(cfg.num_proc, cfg.hosts, "-H")


# ---------------------------------------------------------------------------
# Hosts.


def _host_slots(host: str, slots_text: str, where: str) -> HostSlots:
    if not host or not _HOST_NAME.match(host):
        raise UsageError(f"{where}: bad host name {host!r}")
    try:
        slots = int(slots_text)
    except ValueError:
        raise UsageError(f"{where}: slots for host {host!r} must be an integer, "
                         f"got {slots_text!r}") from None
    if slots < 1:
        raise UsageError(f"{where}: slots for host {host!r} must be >= 1, got {slots}")
    return HostSlots(host, slots)


def _no_duplicates(hosts: Sequence[HostSlots], where: str) -> tuple[HostSlots, ...]:
    seen: set[str] = set()
    for h in hosts:
        if h.host in seen:
            raise UsageError(f"{where}: host {h.host!r} is listed more than once")
        seen.add(h.host)
    return tuple(hosts)


def parse_hosts(text: str) -> tuple[HostSlots, ...]:
    """Parse ``-H`` text ``host[:slots],host[:slots],...``; a bare host has 1 slot.

    Raises UsageError naming the bad item (empty item, bad slots, duplicate host).
    """
    hosts = []
    for item in text.split(","):
        where = f"-H {text!r}"
        if not item.strip():
            raise UsageError(f"{where}: empty host entry")
        name, sep, slots = item.strip().partition(":")
        hosts.append(_host_slots(name, slots if sep else "1", where))
    return _no_duplicates(hosts, f"-H {text!r}")


def parse_hostfile(text: str, source: str = "hostfile") -> tuple[HostSlots, ...]:
    """Parse a hostfile: per line ``host slots=N``, ``host:N`` or ``host`` (1 slot).

    '#' starts a comment; blank lines are skipped.  ``source`` (the file name)
    is used in errors, which also give the line number.  An empty file is an error.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {number} ({raw.strip()!r})"
        words = line.split()
        if len(words) == 1:
            name, sep, slots = words[0].partition(":")
            hosts.append(_host_slots(name, slots if sep else "1", where))
        elif len(words) == 2 and words[1].startswith("slots="):
            hosts.append(_host_slots(words[0], words[1][len("slots="):], where))
        else:
            raise UsageError(f"{where}: expected 'host slots=N' or 'host:N'")
    if not hosts:
        raise UsageError(f"{source}: no hosts found")
    return _no_duplicates(hosts, source)


def check_slots(num_proc: int, hosts: Sequence[HostSlots], source: str) -> None:
    """Raise UsageError if ``num_proc`` ranks do not fit in ``hosts``' slots.

    Fewer ranks than slots is allowed: hosts are filled in order (see allocate).
    """
    total = sum(h.slots for h in hosts)
    if num_proc > total:
        raise UsageError(f"-np {num_proc} is more than the {total} slots given by "
                         f"{source} ({format_hosts(hosts)})")


def allocate(num_proc: int, hosts: Sequence[HostSlots]) -> tuple[HostSlots, ...]:
    """Fill hosts in order: the exact (host, ranks) list whose ranks sum to num_proc.

    Hosts left with no rank are dropped.  Requires check_slots to have passed.
    """
    out = []
    left = num_proc
    for h in hosts:
        if left == 0:
            break
        n = min(h.slots, left)
        out.append(HostSlots(h.host, n))
        left -= n
    if left:
        raise UsageError(f"-np {num_proc} does not fit in {format_hosts(hosts)}")
    return tuple(out)


def format_hosts(hosts: Sequence[HostSlots]) -> str:
    """``a:2,b:2`` form of a host list."""
    return ",".join(f"{h.host}:{h.slots}" for h in hosts)


# ---------------------------------------------------------------------------
# Environment.


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
        pairs[START_TIMEOUT_ENV] = format_seconds(cfg.start_timeout)
    return tuple(pairs.items())


def missing_env(cfg: RunConfig, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Names given as ``-x VAR`` (no value) that are not set in ``environ``."""
    return tuple(s.name for s in cfg.env if s.value is None and s.name not in environ)


def format_seconds(seconds: float) -> str:
    """``30`` for 30.0, ``2.5`` for 2.5: the shortest exact text of a duration."""
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


# ---------------------------------------------------------------------------
# Which MPI / launcher.


def detect_flavour(version_text: str) -> Flavour:
    """The MPI flavour from the output of ``mpiexec --version``.

    Intel MPI is checked before MPICH because its hydra also mentions HYDRA.
    Raises ValueError quoting the first line when nothing is recognised.
    """
    if "Intel(R) MPI Library" in version_text:
        return "intel"
    if "Open MPI" in version_text or "OpenRTE" in version_text:
        return "openmpi"
    if "HYDRA build details" in version_text:
        return "mpich"
    first = version_text.strip().splitlines()[0] if version_text.strip() else "(no output)"
    raise ValueError("cannot tell which MPI this is from `mpiexec --version`: "
                     f"{first!r}; expected MPICH (hydra), Open MPI or Intel MPI")


def choose_launcher(requested: LauncherChoice, in_slurm_job: bool, have_srun: bool) -> str:
    """'srun' or 'mpi'.  auto picks srun inside a SLURM job when srun exists."""
    if requested == "srun":
        return "srun"
    if requested == "mpi":
        return "mpi"
    return "srun" if in_slurm_job and have_srun else "mpi"


def program_name(flavour: Flavour) -> str:
    """The conventional launcher executable of a flavour (a sibling of mpiexec)."""
    return {"mpich": "mpiexec", "openmpi": "mpirun", "intel": "mpiexec.hydra",
            "slurm": "srun"}[flavour]


# ---------------------------------------------------------------------------
# Building the launcher argv.


def rank_command(python: str, task_py: str, cfg: RunConfig,
                 status_dir: Optional[str]) -> tuple[str, ...]:
    """``[python, task.py, <task options>, '--', user command...]`` run on every rank.

    ``output_filename`` should already be absolute (each rank resolves it in
    its own working directory otherwise).
    """
    opts = ["--num-proc", str(cfg.num_proc)]
    if cfg.output_filename is not None:
        opts += ["--output-filename", cfg.output_filename]
    if status_dir is not None:
        opts += ["--status-dir", status_dir]
    return (python, task_py, *opts, "--", *cfg.command)


def make_plan(cfg: RunConfig, program: str, hosts: Optional[Sequence[HostSlots]],
              environ: Mapping[str, str], rank_cmd: Sequence[str]) -> LaunchPlan:
    """Combine a validated config, resolved hosts and environment into a LaunchPlan.

    ``hosts`` (from -H or the hostfile) is checked against -np and allocated.
    """
    assert cfg.num_proc is not None
    alloc = None
    if hosts is not None:
        check_slots(cfg.num_proc, hosts, "--hostfile" if cfg.hostfile else "-H")
        alloc = allocate(cfg.num_proc, hosts)
    return LaunchPlan(program=program, num_proc=cfg.num_proc, hosts=alloc,
                      env=resolve_env(cfg, environ), mpi_args=cfg.mpi_args,
                      rank_command=tuple(rank_cmd))


def build_mpich_argv(plan: LaunchPlan) -> list[str]:
    """MPICH hydra: ``mpiexec [-hosts h:n,...] [-genv V X]... [mpi args] -n N cmd``.

    Global options come before the local ``-n``.  Without hosts no -hosts is
    passed, so hydra runs everything on this machine.
    """
    argv = [plan.program]
    if plan.hosts is not None:
        argv += ["-hosts", format_hosts(plan.hosts)]
    for name, value in plan.env:
        argv += ["-genv", name, value]
    return argv + [*plan.mpi_args, "-n", str(plan.num_proc), *plan.rank_command]


def build_openmpi_argv(plan: LaunchPlan) -> list[str]:
    """Open MPI: ``mpirun --allow-run-as-root -np N [-H h:n,...] --bind-to none --map-by slot
    -x V=X... cmd``.

    No binding, so the runtime may pin its progress thread itself; ranks fill
    hosts slot by slot, and root (containers, CI) may launch, as with horovodrun.
    """
    argv = [plan.program, "--allow-run-as-root", "-np", str(plan.num_proc)]
    if plan.hosts is not None:
        argv += ["-H", format_hosts(plan.hosts)]
    argv += ["--bind-to", "none", "--map-by", "slot"]
    for name, value in plan.env:
        argv += ["-x", f"{name}={value}"]
    return argv + [*plan.mpi_args, *plan.rank_command]


def build_intel_argv(plan: LaunchPlan) -> list[str]:
    """Intel MPI: ``mpiexec.hydra [-genv V X]... [mpi args] -n N [-hosts h,... -ppn k] cmd``.

    Intel's -hosts takes no per-host counts, so equal counts use -ppn and
    unequal ones become an MPMD line ``-n a -host h1 cmd : -n b -host h2 cmd``.
    """
    argv = [plan.program]
    for name, value in plan.env:
        argv += ["-genv", name, value]
    argv += list(plan.mpi_args)
    hosts = plan.hosts
    if hosts is None:
        return argv + ["-n", str(plan.num_proc), *plan.rank_command]
    if len({h.slots for h in hosts}) == 1:
        return argv + ["-n", str(plan.num_proc), "-hosts", ",".join(h.host for h in hosts),
                       "-ppn", str(hosts[0].slots), *plan.rank_command]
    for i, h in enumerate(hosts):
        if i:
            argv.append(":")
        argv += ["-n", str(h.slots), "-host", h.host, *plan.rank_command]
    return argv


def build_srun_argv(plan: LaunchPlan) -> list[str]:
    """SLURM: ``srun --ntasks=N --kill-on-bad-exit=1 [--nodelist=...] [--export=ALL,V=X]``.

    Hosts need the same rank count on each (srun's --ntasks-per-node);
    a value containing ',' cannot go through --export and is a UsageError.
    """
    argv = [plan.program, f"--ntasks={plan.num_proc}", "--kill-on-bad-exit=1"]
    if plan.hosts is not None:
        counts = {h.slots for h in plan.hosts}
        if len(counts) != 1:
            raise UsageError("the srun launcher needs the same number of ranks on every "
                             f"host, got {format_hosts(plan.hosts)}")
        argv += [f"--nodes={len(plan.hosts)}", f"--ntasks-per-node={counts.pop()}",
                 "--nodelist=" + ",".join(h.host for h in plan.hosts)]
    if plan.env:
        for name, value in plan.env:
            if "," in value:
                raise UsageError(f"-x {name}: srun --export cannot carry a value with ',' "
                                 f"({value!r}); export it in the shell instead")
        argv.append("--export=" + ",".join(["ALL"] + [f"{n}={v}" for n, v in plan.env]))
    return argv + [*plan.mpi_args, *plan.rank_command]


_BUILDERS: Mapping[str, Callable[[LaunchPlan], list[str]]] = {
    "mpich": build_mpich_argv,
    "openmpi": build_openmpi_argv,
    "intel": build_intel_argv,
    "slurm": build_srun_argv,
}


def build_launch_argv(flavour: Flavour, plan: LaunchPlan) -> list[str]:
    """The full launcher argv for ``flavour`` (one of mpich, openmpi, intel, slurm)."""
    try:
        builder = _BUILDERS[flavour]
    except KeyError:
        raise ValueError(f"unknown MPI flavour {flavour!r}") from None
    return builder(plan)
