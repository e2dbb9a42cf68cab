"""mlslrun's command line -> a validated RunConfig (the parser, its flags and their checks).

Pure functions of their arguments: no file access (the hostfile is read by
launch.py), no subprocess, no reading of ``os.environ``.
Host lists are parsed in hosts.py, ``-x`` and variable-setting flags in rank_env.py.
"""

import argparse
import shlex
from typing import Iterable, Optional, Sequence

from mlsl_tf.runner.config import ElasticConfig, RunConfig, UsageError
from mlsl_tf.runner.hosts import check_slots, parse_hosts
from mlsl_tf.runner.rank_env import ENV_FLAGS, START_TIMEOUT_ENV, EnvFlag, parse_env_spec


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
                       help="file with one 'host slots=N' (or 'host:N') per line (default: none)")
    p.add_argument("-x", dest="env", action="append", default=[], metavar="VAR[=VAL]",
                   help="set VAR on every rank: to VAL, or to its value here (repeatable; default: none)")
    p.add_argument("--verbose", action="store_true", help="print the command mlslrun runs (default: off)")
    p.add_argument("--output-filename", dest="output_filename", metavar="DIR",
                   help="also write each rank's output to DIR/rank.R/{stdout,stderr} (default: none)")
    p.add_argument("--tag-output", dest="tag_output", action=argparse.BooleanOptionalAction,
                   default=True, help="prefix every line a rank prints with [RANK]<stdout>: or "
                   "[RANK]<stderr>: and keep the ranks' lines whole (default: on)")
    p.add_argument("--start-timeout", dest="start_timeout", type=float, metavar="S",
                   help="fail if some rank has not started after S seconds "
                   "(checked only when all hosts see this machine's temp dir); "
                   f"also sets {START_TIMEOUT_ENV} on every rank (default: none)")
    p.add_argument("--launcher", choices=("auto", "mpi", "srun"), default="auto",
                   help="auto: srun inside a SLURM job if srun exists, else mpiexec (default: %(default)s)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks on this host than 4 per core (default: refused)")
    p.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                   help="show the frameworks, controllers and tensor ops available")
    p.add_argument("--mpi-args", dest="mpi_args", metavar='"ARGS"',
                   help="extra arguments (shell-quoted) appended to the mpiexec/srun command (default: none)")
    _add_ssh_options(p)
    _add_elastic_options(p)
    for flag in ENV_FLAGS:
        if flag.switch:
            p.add_argument(flag.option, dest=_flag_dest(flag), action="store_const", const="on", help=flag.help_text)
        else:
            p.add_argument(flag.option, dest=_flag_dest(flag), metavar="VALUE", help=flag.help_text)
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the program every rank runs, e.g. python train.py")
    return p


def _add_ssh_options(p: argparse.ArgumentParser) -> None:
    """-p, -i, --ssh-check: how mlslrun reaches the hosts of -H / --hostfile."""
    ssh = p.add_argument_group("ssh to the hosts of -H / --hostfile")
    ssh.add_argument("-p", "--ssh-port", dest="ssh_port", type=int, metavar="PORT",
                     help="the port of the ssh server on every host (default: ssh's, 22)")
    ssh.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file", metavar="FILE",
                     help="the private key ssh logs in with (default: ssh's own choice)")
    ssh.add_argument("--ssh-check", dest="ssh_check", action=argparse.BooleanOptionalAction,
                     default=True, help="before launching, ssh to every remote host without "
                     "prompting and check the ranks' interpreter is there; stop with the "
                     "failing hosts and why (default: on)")


def _add_elastic_options(p: argparse.ArgumentParser) -> None:
    """horovodrun's elastic flags (docs/elastic.md)."""
    el = p.add_argument_group("elastic training (horovodrun's flags; docs/elastic.md)")
    el.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                    help="elastic: the fewest workers to train with; fewer fails the job (default: -np)")
    el.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                    help="elastic: the most workers to train with (default: every usable slot)")
    el.add_argument("--host-discovery-script", dest="discovery_script", metavar="FILE",
                    help="elastic: an executable printing the usable hosts, one 'host:slots' a line; "
                    "run every second (default: the -H / --hostfile hosts)")
    el.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int, metavar="N",
                    help="elastic: slots of a host the discovery script prints without ':slots' (default: 1)")
    el.add_argument("--elastic-timeout", dest="elastic_timeout", type=float, metavar="S",
                    help="elastic: seconds to wait for --min-np slots before failing (default: 600)")
    el.add_argument("--reset-limit", dest="reset_limit", type=int, metavar="N",
                    help="elastic: fail the job after more than N resets (default: no limit)")
    el.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=float, nargs=2,
                    metavar=("LOW", "HIGH"), help="elastic: a host whose worker failed stays out for a time "
                    "drawn in [LOW, HIGH] s, doubled for each earlier failure (default: for good)")
    el.add_argument("--network-interface", "--network-interfaces", dest="network_interface", metavar="NICS",
                    help="elastic: the interface(s) whose address the workers reach mlslrun by, comma-separated, "
                    "the first with an IPv4 address used (default: 127.0.0.1 when every host is this machine, "
                    "else the route to the first other host)")


def _flag_dest(flag: EnvFlag) -> str:
    return "envflag_" + flag.option.lstrip("-").replace("-", "_")


# Options that take a value (the next word unless written --opt=value).
_VALUE_OPTIONS = frozenset({"-np", "--num-proc", "-H", "--hosts", "--hostfile", "-x",
                            "--output-filename", "--start-timeout", "--launcher",
                            "--mpi-args", "-p", "--ssh-port", "-i", "--ssh-identity-file",
                            "--min-np", "--min-num-proc", "--max-np", "--max-num-proc",
                            "--host-discovery-script", "--slots-per-host", "--slots", "--elastic-timeout",
                            "--reset-limit", "--network-interface", "--network-interfaces"}
                           | {f.option for f in ENV_FLAGS if not f.switch})


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
    The hostfile is not read here; see hosts.parse_hostfile and hosts.check_slots.
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
        tag_output=ns.tag_output,
        ssh_port=ns.ssh_port,
        ssh_identity_file=ns.ssh_identity_file,
        ssh_check=ns.ssh_check,
        elastic=_elastic(ns),
        oversubscribe=ns.oversubscribe,
    )
    _validate(cfg)
    return cfg


def _elastic(ns: argparse.Namespace) -> Optional[ElasticConfig]:
    """The elastic flags, or None when none that makes a job elastic is given (horovodrun: a
    discovery script, --min-np or --max-np)."""
    if ns.discovery_script is None and ns.min_np is None and ns.max_np is None:
        for name, flag in (("slots_per_host", "--slots-per-host"), ("elastic_timeout", "--elastic-timeout"),
                           ("reset_limit", "--reset-limit"), ("cooldown_range", "--blacklist-cooldown-range"),
                           ("network_interface", "--network-interface")):
            if getattr(ns, name) is not None:
                raise UsageError(f"{flag} is for elastic jobs: add --host-discovery-script, --min-np or --max-np")
        return None
    if ns.num_proc is None:
        raise UsageError("-np N is required (the number of workers to start with)")
    min_np = ns.min_np if ns.min_np is not None else ns.num_proc
    if not 1 <= min_np <= ns.num_proc or (ns.max_np is not None and ns.max_np < ns.num_proc):
        raise UsageError(f"elastic: expected 1 <= --min-np ({min_np}) <= -np ({ns.num_proc}) <= --max-np "
                         f"({'no limit' if ns.max_np is None else ns.max_np})")
    if ns.discovery_script is not None and (ns.hosts is not None or ns.hostfile is not None):
        raise UsageError("--host-discovery-script and -H / --hostfile exclude each other")
    if ns.slots_per_host is not None and ns.slots_per_host < 1:
        raise UsageError(f"--slots-per-host must be >= 1, got {ns.slots_per_host}")
    if ns.elastic_timeout is not None and not ns.elastic_timeout > 0:
        raise UsageError(f"--elastic-timeout must be > 0 seconds, got {ns.elastic_timeout}")
    if ns.reset_limit is not None and ns.reset_limit < 0:
        raise UsageError(f"--reset-limit must be >= 0, got {ns.reset_limit}")
    cooldown = tuple(ns.cooldown_range) if ns.cooldown_range is not None else None
    if cooldown is not None and not 0 <= cooldown[0] <= cooldown[1]:
        raise UsageError(f"--blacklist-cooldown-range: expected 0 <= LOW <= HIGH, got {cooldown[0]:g} {cooldown[1]:g}")
    return ElasticConfig(min_np=min_np, max_np=ns.max_np, discovery_script=ns.discovery_script,
                         slots_per_host=ns.slots_per_host or 1,
                         elastic_timeout=600.0 if ns.elastic_timeout is None else ns.elastic_timeout,
                         reset_limit=ns.reset_limit, cooldown_range=cooldown,
                         network_interfaces=_interfaces(ns.network_interface))


def _interfaces(text: Optional[str]) -> Optional[tuple[str, ...]]:
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise UsageError(f"--network-interface: expected interface names, got {text!r}")
    return names


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
    if cfg.hosts is not None and cfg.elastic is None:
        check_slots(cfg.num_proc, cfg.hosts, "-H")
    if cfg.ssh_port is not None and not 1 <= cfg.ssh_port <= 65535:
        raise UsageError(f"--ssh-port must be a TCP port, 1 to 65535, got {cfg.ssh_port}")
    if cfg.ssh_identity_file is not None and not cfg.ssh_identity_file:
        raise UsageError("--ssh-identity-file needs a file name")
