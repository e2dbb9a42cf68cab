"""Emulate a cluster link on one machine: run a command inside a private network namespace whose
loopback is rate-limited with tc tbf, with MPICH forced onto TCP so its traffic crosses that
loopback instead of shared memory (docs/design.md, "Measuring it here"). Needs root (ip netns, tc).

    python benchmarks/netlink.py --rate 2gbit -- mpiexec -n 2 python x.py

As a module:

    with netlink.Link("2gbit") as link:
        subprocess.run(link.wrap(["mpiexec", "-n", "2", "python", "x.py"]), env=link.env())

Only 127.0.0.1 inside the namespace is ever a target. Argv lists only, never shell strings.
"""

import argparse
import os
import shutil
import subprocess
import sys
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: mlsl_tf

# MPICH: no shared-memory shortcut between local ranks; every message goes over libfabric's TCP.
TCP_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def setup_commands(name, rate, burst="256kb", latency="100ms"):
    """The argv lists that create namespace `name` with a `rate`-limited loopback."""
    return [
        ["ip", "netns", "add", name],
        ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
        ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
         "rate", rate, "burst", burst, "latency", latency],
    ]


def teardown_command(name):
    return ["ip", "netns", "delete", name]


def wrap(name, argv):
    """`argv` run inside namespace `name`."""
    return ["ip", "netns", "exec", name] + list(argv)


class Link:
    """A namespace with a rate-limited loopback for the duration of a `with` block; it is deleted
    on exit whatever happened inside (including a failed setup)."""

    def __init__(self, rate, burst="256kb", latency="100ms"):
        self.rate, self.burst, self.latency = rate, burst, latency
        self.name = f"mlsl-link-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def __enter__(self):
        try:
            for cmd in setup_commands(self.name, self.rate, self.burst, self.latency):
                subprocess.run(cmd, check=True)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        subprocess.run(teardown_command(self.name), stderr=subprocess.DEVNULL, check=False)

    def wrap(self, argv):
        return wrap(self.name, argv)

    @staticmethod
    def env(base=None):
        """`base` (default: os.environ) with MPICH forced onto TCP."""
        env = dict(os.environ if base is None else base)
        env.update(TCP_ENV)
        return env


def under_mpiexec():
    """True inside a rank started by mpiexec (MPICH/Intel MPI, PMIx or Open MPI)."""
    return any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"))


def mpiexec_next_to(python):
    """The mpiexec of `python`'s venv (PyPI's mpich wheel), else the one on PATH (None if none)."""
    cand = os.path.join(os.path.dirname(python), "mpiexec")
    return cand if os.access(cand, os.X_OK) else shutil.which("mpiexec")


def relaunch(script, argv, nranks, link=None):
    """Runs `script` with `argv` (minus the launcher-only --link/--np options) on `nranks` ranks
    under mlslrun -- inside an emulated link of rate `link` when given, the script then also
    getting `--link-name RATE`. Returns the exit status. For benchmarks' --link / --np."""
    if under_mpiexec():
        sys.exit("--link and --np start their own mpiexec: run this without mpiexec")
    passed, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--link", "--np"):
            skip = True
        elif not a.startswith(("--link=", "--np=")):
            passed.append(a)
    # as users launch: mlslrun (python -m mlsl_tf.runner, the repository's package) over mpiexec;
    # untagged, so the benchmark's JSON lines stay JSON lines
    cmd = [sys.executable, "-m", "mlsl_tf.runner", "-np", str(nranks), "--no-tag-output", sys.executable,
           os.path.abspath(script)] + passed
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    if not link:
        return subprocess.run(cmd, env=env).returncode
    return run(link, cmd + ["--link-name", link], env=env)


def run(rate, argv, burst="256kb", latency="100ms", env=None):
    """Runs `argv` under an emulated link of `rate` (environment `env`, default os.environ, with
    MPICH on TCP); returns its exit status."""
    with Link(rate, burst, latency) as link:
        try:
            return subprocess.run(link.wrap(argv), env=link.env(env)).returncode
        except KeyboardInterrupt:
            return 130


def main(args=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s --rate RATE [--burst B] [--latency L] -- COMMAND [ARG...]")
    p.add_argument("--rate", required=True, help="tbf rate, e.g. 2gbit, 10gbit, 500mbit")
    p.add_argument("--burst", default="256kb", help="tbf bucket size (default 256kb)")
    p.add_argument("--latency", default="100ms", help="tbf queueing limit (default 100ms)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(args)
    cmd = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not cmd:
        p.error("no command given (put it after --)")
    try:
        return run(ns.rate, cmd, ns.burst, ns.latency)
    except (subprocess.CalledProcessError, OSError) as e:
        print(f"netlink: could not set up the emulated link: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
