"""Which launcher runs the ranks (MPICH, Open MPI, Intel MPI or srun) and the argv each is given.

Pure functions of their arguments: no file access, no subprocess, no reading of
``os.environ`` (launch.py runs ``mpiexec --version``, passes its text and the
environment in, and runs the result).  Every launcher command is an argv list,
never a shell string.
"""

import dataclasses
from typing import Callable, Literal, Mapping, Optional, Sequence

from mlsl_tf.runner.config import HostSlots, LauncherChoice, RunConfig, UsageError
from mlsl_tf.runner.hosts import allocate, check_slots, format_hosts
from mlsl_tf.runner.rank_env import forwarded_names, resolve_env
from mlsl_tf.runner.ssh import SshOptions, rsh_args_text

# MPI flavours mlslrun can drive; "slurm" means srun, whatever MPI is inside.
Flavour = Literal["mpich", "openmpi", "intel", "slurm"]


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything a flavour's builder needs; independent of the flavour.

    ``hosts`` is an exact allocation (sum of slots == num_proc) or None for
    "let the launcher decide" (local run or the SLURM allocation).
    ``rank_command`` is what every rank runs (task.py wrapping the user command).
    ``ssh``: how the launcher's ssh reaches the hosts; ``ssh_exec``: the ssh wrapper
    (ssh.launcher_exec_script) for launchers that take an executable, not ssh options.
    """

    program: str
    num_proc: int
    hosts: Optional[tuple[HostSlots, ...]]
    env: tuple[tuple[str, str], ...]
    mpi_args: tuple[str, ...]
    rank_command: tuple[str, ...]
    ssh: SshOptions = SshOptions()
    ssh_exec: Optional[str] = None
    # The names set in mlslrun's environment (for launchers that do not forward it all).
    environ_names: tuple[str, ...] = ()


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
# The plan: what every flavour launches.


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
    if cfg.tag_output:
        opts.append("--tag-output")
    return (python, task_py, *opts, "--", *cfg.command)


def ssh_options(cfg: RunConfig) -> SshOptions:
    """--ssh-port and --ssh-identity-file."""
    return SshOptions(port=cfg.ssh_port, identity_file=cfg.ssh_identity_file)


def needs_ssh_exec(flavour: Flavour, cfg: RunConfig) -> bool:
    """Whether the launcher takes the ssh options only as an ssh wrapper (MPICH's hydra)."""
    return flavour == "mpich" and ssh_options(cfg).given


def make_plan(cfg: RunConfig, program: str, hosts: Optional[Sequence[HostSlots]],
              environ: Mapping[str, str], rank_cmd: Sequence[str],
              ssh_exec: Optional[str] = None) -> LaunchPlan:
    """Combine a validated config, resolved hosts and environment into a LaunchPlan.

    ``hosts`` (from -H or the hostfile) is checked against -np and allocated.
    ``ssh_exec``: the ssh wrapper's path, where needs_ssh_exec.
    """
    assert cfg.num_proc is not None
    alloc = None
    if hosts is not None:
        check_slots(cfg.num_proc, hosts, "--hostfile" if cfg.hostfile else "-H")
        alloc = allocate(cfg.num_proc, hosts)
    return LaunchPlan(program=program, num_proc=cfg.num_proc, hosts=alloc,
                      env=resolve_env(cfg, environ), mpi_args=cfg.mpi_args,
                      rank_command=tuple(rank_cmd), ssh=ssh_options(cfg), ssh_exec=ssh_exec,
                      environ_names=tuple(sorted(environ)))


# ---------------------------------------------------------------------------
# One argv builder per flavour.


def _hydra_ssh_args(plan: LaunchPlan) -> list[str]:
    """MPICH hydra runs ``ssh`` unless told another executable: the wrapper with the options."""
    if not plan.ssh.given:
        return []
    if plan.ssh_exec is None:
        raise ValueError("--ssh-port/--ssh-identity-file with MPICH need the ssh wrapper (ssh_exec)")
    return ["-launcher", "ssh", "-launcher-exec", plan.ssh_exec]


def _openmpi_ssh_args(plan: LaunchPlan) -> list[str]:
    """Open MPI appends plm_rsh_args to its ssh command line."""
    if not plan.ssh.given:
        return []
    return ["--mca", "plm_rsh_args", rsh_args_text(plan.ssh, "Open MPI's plm_rsh_args")]


def _intel_ssh_args(plan: LaunchPlan) -> list[str]:
    """Intel MPI's hydra takes ssh's arguments itself (-bootstrap-exec-args)."""
    if not plan.ssh.given:
        return []
    return ["-bootstrap", "ssh", "-bootstrap-exec-args",
            rsh_args_text(plan.ssh, "Intel MPI's -bootstrap-exec-args")]


def build_mpich_argv(plan: LaunchPlan) -> list[str]:
    """MPICH hydra: ``mpiexec [-hosts h:n,...] [-genv V X]... [mpi args] -n N cmd``.

    Global options come before the local ``-n``.  Without hosts no -hosts is
    passed, so hydra runs everything on this machine.
    """
    argv = [plan.program]
    if plan.hosts is not None:
        argv += ["-hosts", format_hosts(plan.hosts)]
    argv += _hydra_ssh_args(plan)
    for name, value in plan.env:
        argv += ["-genv", name, value]
    return argv + [*plan.mpi_args, "-n", str(plan.num_proc), *plan.rank_command]


# Open MPI's MCA parameters mlslrun sets unless the user chose them (--mpi-args '--mca P V'
# or OMPI_MCA_P in the environment: Open MPI would join a second value to ours with a comma).
# The openib BTL is left out: deprecated for UCX, it does not support MPI_THREAD_MULTIPLE, which
# mlsl_tf's background thread asks for, and it warns about fork() (Horovod leaves it out too).
OPENMPI_MCA_DEFAULTS: tuple[tuple[str, str], ...] = (("btl", "^openib"),)
# mpi4py >= 4 wheels carry one extension per MPI ABI and pick one by these variables, else by
# the first libmpi they find (the venv's MPICH from PyPI): under Open MPI's mpirun that rank
# would run as a singleton, so mlslrun names Open MPI's unless the user set either.
MPI4PY_ABI_VARS = ("MPI4PY_MPIABI", "MPI4PY_LIBMPI")


def _mca_params_chosen(mpi_args: Sequence[str], environ_names: Sequence[str]) -> set[str]:
    """The MCA parameters set by ``--mca P V`` (or -mca/--gmca) in mpi_args or OMPI_MCA_P."""
    chosen = {n[len("OMPI_MCA_"):] for n in environ_names if n.startswith("OMPI_MCA_")}
    chosen.update(mpi_args[i + 1] for i, word in enumerate(mpi_args[:-1])
                  if word in ("--mca", "-mca", "--gmca", "-gmca"))
    return chosen


def build_openmpi_argv(plan: LaunchPlan) -> list[str]:
    """Open MPI: ``mpirun --allow-run-as-root -np N [-H h:n,...] --oversubscribe --bind-to none
    --map-by slot [--mca btl ^openib] [-x NAME]... [-x V=X]... [-x MPI4PY_MPIABI=openmpi]
    [mpi args] cmd``.

    Root may launch (containers, CI), as with horovodrun. --oversubscribe: without -H Open MPI
    allows only one rank per core (hydra has no such limit; with -H the slots are exact
    anyway). No binding: mlsl_tf's affinity (mlsl_tf/cpu_placement.py) gives each local rank its
    block of cores, as under hydra. With hosts, every variable of mlslrun's environment (but
    forwarded_names' exclusions) is passed by name: Open MPI, unlike hydra, gives ranks on other
    hosts only what -x names.
    """
    argv = [plan.program, "--allow-run-as-root", "-np", str(plan.num_proc)]
    if plan.hosts is not None:
        argv += ["-H", format_hosts(plan.hosts)]
    argv += ["--oversubscribe", "--bind-to", "none", "--map-by", "slot"]
    chosen = _mca_params_chosen(plan.mpi_args, plan.environ_names)
    for param, value in OPENMPI_MCA_DEFAULTS:
        if param not in chosen:
            argv += ["--mca", param, value]
    explicit = {name for name, _ in plan.env}
    if plan.hosts is not None:
        for name in forwarded_names(plan.environ_names):
            if name not in explicit:
                argv += ["-x", name]
    argv += _openmpi_ssh_args(plan)
    for name, value in plan.env:
        argv += ["-x", f"{name}={value}"]
    if not explicit.intersection(MPI4PY_ABI_VARS) and not set(plan.environ_names).intersection(MPI4PY_ABI_VARS):
        argv += ["-x", "MPI4PY_MPIABI=openmpi"]
    return argv + [*plan.mpi_args, *plan.rank_command]


def build_intel_argv(plan: LaunchPlan) -> list[str]:
    """Intel MPI: ``mpiexec.hydra [-genv V X]... [mpi args] -n N [-hosts h,... -ppn k] cmd``.

    Intel's -hosts takes no per-host counts, so equal counts use -ppn and
    unequal ones become an MPMD line ``-n a -host h1 cmd : -n b -host h2 cmd``.
    """
    argv = [plan.program, *_intel_ssh_args(plan)]
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


# The PMI srun offers the ranks unless the user chose one: MPICH from PyPI speaks PMI-1 and
# PMI-2 over PMI_FD (SLURM's mpi/pmi2), not PMIx, and under --mpi=none every rank would start
# MPI alone, as a world of one (docs/slurm.md).
SRUN_DEFAULT_MPI = "pmi2"
SRUN_MPI_TYPE_ENV = "SLURM_MPI_TYPE"  # srun's own variable for --mpi


def srun_mpi_chosen(mpi_args: Sequence[str], environ_names: Sequence[str]) -> bool:
    """Whether the user chose srun's PMI: ``--mpi=TYPE`` / ``--mpi TYPE`` in --mpi-args, or
    SLURM_MPI_TYPE in the environment."""
    return SRUN_MPI_TYPE_ENV in environ_names or \
        any(a == "--mpi" or a.startswith("--mpi=") for a in mpi_args)


def build_srun_argv(plan: LaunchPlan) -> list[str]:
    """SLURM: ``srun --ntasks=N --kill-on-bad-exit=1 [--mpi=pmi2] [--nodelist=...] [--export=ALL,V=X]``.

    --mpi=pmi2 unless the user chose srun's PMI (srun_mpi_chosen).  Hosts need the same rank
    count on each (srun's --ntasks-per-node); a value containing ',' cannot go through
    --export and is a UsageError.
    """
    if plan.ssh.given:
        raise UsageError("--ssh-port/--ssh-identity-file: srun starts the ranks without ssh; "
                         "drop them, or use --launcher mpi")
    argv = [plan.program, f"--ntasks={plan.num_proc}", "--kill-on-bad-exit=1"]
    if not srun_mpi_chosen(plan.mpi_args, plan.environ_names):
        argv.append(f"--mpi={SRUN_DEFAULT_MPI}")
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
