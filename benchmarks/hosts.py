"""Emulated hosts on one machine: one network namespace per host, each with a veth link into a
bridge (in a namespace of its own) and an address 10.77.0.(h+1)/24 on its eth0, whose egress is
limited with tc tbf -- so every host has its own link rate, as on a cluster (docs/design.md,
"Measuring it here"). Ranks are put into their host's namespace by a shim placed in front of
the rank's command, so the job is still launched the usual way (mlslrun, mpiexec):

    python benchmarks/hosts.py --hosts 2 --rate 2gbit -- mlslrun -np 2 {enter} python train.py

`{enter}` becomes `python benchmarks/hosts.py enter --prefix P --ranks-per-host K --`: rank r
(from the launcher's environment) execs the rest inside host r // K. MPICH is forced onto TCP
over eth0 (MPIR_CVAR_NOLOCAL, FI_PROVIDER=tcp, FI_TCP_IFACE=eth0). As a module:

    with hosts.Hosts(2, "2gbit") as h:
        subprocess.run(["mlslrun", "-np", "2"] + h.enter() + ["python", "train.py"], env=h.env())

Everything made is deleted on exit, also after a failure, an exception or Ctrl-C (the
namespaces carry a per-run prefix; `cleanup_stale()` removes what a killed run left). Root only.
Only addresses inside these namespaces are ever targets. Argv lists only, never shell strings.
"""

import argparse
import os
import signal
import subprocess
import sys
import uuid

SUBNET = "10.77.0"
IFACE = "eth0"
NAME_PREFIX = "mlslh"  # every namespace this file makes starts with it
# MPICH: no shared-memory shortcut between the ranks; every message over libfabric's TCP on eth0.
TCP_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": IFACE}
RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def host_namespace(prefix, host):
    return f"{prefix}{host}"


def bridge_namespace(prefix):
    return f"{prefix}br"


def address(host):
    return f"{SUBNET}.{host + 1}"


LAUNCHER_ADDRESS = f"{SUBNET}.254"  # this machine's own end on the bridge (launcher_interface)


def launcher_interface(prefix):
    """The interface by which the launcher's namespace reaches the hosts (an elastic mlslrun's
    --network-interface: its workers connect back to it), unlimited."""
    return f"v{prefix[len(NAME_PREFIX):][:6]}L"


def setup_commands(prefix, hosts, rate, burst="256kb", latency="100ms", launcher=False):
    """The argv lists that build `hosts` namespaces on a bridge, each link limited to `rate`;
    with `launcher`, a link from the namespace this runs in into the bridge (launcher_interface,
    LAUNCHER_ADDRESS: one such set of hosts at a time)."""
    br = bridge_namespace(prefix)
    tag = prefix[len(NAME_PREFIX):][:6]
    cmds = [["ip", "netns", "add", br],
            ["ip", "-n", br, "link", "add", "br0", "type", "bridge"],
            ["ip", "-n", br, "link", "set", "br0", "up"]]
    here, there = launcher_interface(prefix), f"v{tag}Lb"
    cmds += [] if not launcher else [
            ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
            ["ip", "link", "set", there, "netns", br],
            ["ip", "addr", "add", f"{LAUNCHER_ADDRESS}/24", "dev", here],
            ["ip", "link", "set", here, "up"],
            ["ip", "-n", br, "link", "set", there, "master", "br0"],
            ["ip", "-n", br, "link", "set", there, "up"]]
    for h in range(hosts):
        ns = host_namespace(prefix, h)
        end_host, end_bridge = f"v{tag}{h}h", f"v{tag}{h}b"  # <= 15 characters
        cmds += [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", end_host, "type", "veth", "peer", "name", end_bridge],
            ["ip", "link", "set", end_host, "netns", ns],
            ["ip", "link", "set", end_bridge, "netns", br],
            ["ip", "-n", ns, "link", "set", end_host, "name", IFACE],
            ["ip", "-n", ns, "addr", "add", f"{address(h)}/24", "dev", IFACE],
            ["ip", "-n", ns, "link", "set", IFACE, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", br, "link", "set", end_bridge, "master", "br0"],
            ["ip", "-n", br, "link", "set", end_bridge, "up"],
        ]
        if rate:
            cmds.append(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", IFACE, "root", "tbf",
                         "rate", rate, "burst", burst, "latency", latency])
    return cmds


def teardown_commands(prefix, hosts, launcher=False):
    """Deleting a namespace deletes the veth ends in it (and so their peers)."""
    return [["ip", "netns", "delete", host_namespace(prefix, h)] for h in range(hosts)] + \
           [["ip", "netns", "delete", bridge_namespace(prefix)]] + \
           ([["ip", "link", "delete", launcher_interface(prefix)]] if launcher else [])  # if half made


def enter_argv(prefix, ranks_per_host, python=sys.executable):
    """What goes in front of a rank's command to run it in its host's namespace."""
    return [python, os.path.abspath(__file__), "enter", "--prefix", prefix, "--ranks-per-host",
            str(ranks_per_host), "--"]


def rank_of(environ):
    for var in RANK_ENV:
        if environ.get(var, "").isdigit():
            return int(environ[var])
    raise RuntimeError(f"hosts.py enter: no rank in the environment (looked for {', '.join(RANK_ENV)})")


def enter_command(prefix, ranks_per_host, command, environ):
    """The argv that runs `command` in the namespace of this rank's host."""
    return ["ip", "netns", "exec", host_namespace(prefix, rank_of(environ) // ranks_per_host)] + list(command)


def cleanup_stale():
    """Deletes the namespaces an earlier, killed run of this file left behind."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NAME_PREFIX):
            subprocess.run(["ip", "netns", "delete", name], stderr=subprocess.DEVNULL, check=False)


class Hosts:
    """`hosts` emulated hosts, each link `rate` (None: unlimited), for a `with` block."""

    def __init__(self, hosts, rate, ranks_per_host=1, burst="256kb", latency="100ms", launcher=False):
        if hosts < 1 or ranks_per_host < 1:
            raise ValueError("hosts and ranks_per_host must be >= 1")
        self.hosts, self.rate, self.ranks_per_host = hosts, rate, ranks_per_host
        self.burst, self.latency, self.launcher = burst, latency, launcher
        self.prefix = f"{NAME_PREFIX}{uuid.uuid4().hex[:6]}"

    def __enter__(self):
        try:
            for cmd in setup_commands(self.prefix, self.hosts, self.rate, self.burst, self.latency, self.launcher):
                subprocess.run(cmd, check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as e:
            self.close()
            raise RuntimeError(f"hosts.py: {' '.join(e.cmd)} failed: {e.stderr.strip()}") from None
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        for cmd in teardown_commands(self.prefix, self.hosts, self.launcher):
            subprocess.run(cmd, stderr=subprocess.DEVNULL, check=False)

    def enter(self, python=sys.executable):
        return enter_argv(self.prefix, self.ranks_per_host, python)

    @property
    def launcher_interface(self):
        return launcher_interface(self.prefix)

    @staticmethod
    def env(base=None):
        env = dict(os.environ if base is None else base)
        env.update(TCP_ENV)
        return env


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["enter"]:
        p = argparse.ArgumentParser(prog="hosts.py enter")
        p.add_argument("--prefix", required=True)
        p.add_argument("--ranks-per-host", type=int, default=1)
        p.add_argument("command", nargs=argparse.REMAINDER)
        ns = p.parse_args(argv[1:])
        cmd = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
        full = enter_command(ns.prefix, ns.ranks_per_host, cmd, os.environ)
        os.execvp(full[0], full)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--rate", help="tbf rate of each host's link, e.g. 2gbit (default: unlimited)")
    p.add_argument("--ranks-per-host", type=int, default=1)
    p.add_argument("--cleanup", action="store_true", help="delete namespaces a killed run left, then exit")
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    if ns.cleanup:
        cleanup_stale()
        return 0
    cmd = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not cmd:
        p.error("no command given (put it after --)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through the with: cleaned up
    with Hosts(ns.hosts, ns.rate, ns.ranks_per_host) as h:
        full = []
        for a in cmd:
            full += h.enter() if a == "{enter}" else [a]
        try:
            return subprocess.run(full, env=h.env()).returncode
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
