"""Host lists: parse -H text and hostfiles, check -np against slots, allocate ranks to hosts.

Pure functions of their arguments: no file access (launch.py reads the hostfile
and passes its text in), no subprocess, no ``os.environ``.
"""

import re
from typing import Sequence

from mlsl_tf.runner.config import HostSlots, UsageError

_HOST_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]]+\Z")


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
