"""Elastic mlslrun's decisions about hosts: discovery output, the blacklist, each generation's hosts.

Pure: no file access, no subprocess, no clock or randomness of its own (callers pass ``now`` and
a random draw in).  elastic_driver.py does the I/O and asks these functions what to do.
"""

import dataclasses
from typing import Iterable, Optional, Sequence

from mlsl_tf.runner.config import HostSlots, UsageError
from mlsl_tf.runner.hosts import allocate, parse_hosts

# Horovod's HostUpdateResult: what changed, as bit flags the workers OR together.
NO_UPDATE, REMOVED, ADDED = 0, 1, 2


def parse_discovery(text: str, slots_per_host: int) -> tuple[HostSlots, ...]:
    """The hosts a discovery script printed: one ``host`` or ``host:slots`` per line (a bare host
    has ``slots_per_host``); blank lines are skipped.  Raises UsageError naming the bad line."""
    hosts = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name, sep, slots = line.partition(":")
        try:
            hosts.extend(parse_hosts(f"{name}:{slots if sep else slots_per_host}"))
        except UsageError as e:
            raise UsageError(f"the host discovery script printed {line!r}: {e}") from None
    seen, unique = set(), []
    for h in hosts:  # a host printed twice counts once (its first line)
        if h.host not in seen:
            seen.add(h.host)
            unique.append(h)
    return tuple(unique)


@dataclasses.dataclass
class Blacklist:
    """Hosts whose worker failed.  Without a cooldown range a host stays out for good; with
    (low, high) it is out for a time drawn in [low, high] seconds, doubled for each earlier
    failure of the same host (Horovod's exponential back-off).  The time counts from when training
    goes on without the host (start_cooldowns: the next generation trains), so a slow reset does
    not use it up."""

    cooldown: Optional[tuple[float, float]] = None
    until: dict = dataclasses.field(default_factory=dict)     # host -> time it may return (inf: not yet known)
    failures: dict = dataclasses.field(default_factory=dict)  # host -> how often it failed
    pending: dict = dataclasses.field(default_factory=dict)   # host -> cooldown seconds not started yet

    def fail(self, host: str, draw: float) -> float:
        """Blacklists ``host`` (``draw`` in [0, 1) picks the cooldown); returns the cooldown in
        seconds (inf: for good), which start_cooldowns starts."""
        count = self.failures.get(host, 0)
        self.failures[host] = count + 1
        self.until[host] = float("inf")
        if self.cooldown is None:
            return float("inf")
        low, high = self.cooldown
        self.pending[host] = (low + draw * (high - low)) * (2 ** count)
        return self.pending[host]

    def start_cooldowns(self, now: float) -> None:
        """The job trains again without the blacklisted hosts: their cooldowns run from ``now``."""
        for host, seconds in self.pending.items():
            self.until[host] = now + seconds
        self.pending.clear()

    def usable(self, host: str, now: float) -> bool:
        return now >= self.until.get(host, 0.0)

    def filter(self, hosts: Iterable[HostSlots], now: float) -> tuple[HostSlots, ...]:
        return tuple(h for h in hosts if self.usable(h.host, now))

    def all_out_for_good(self, hosts: Iterable[HostSlots]) -> bool:
        """Whether every one of ``hosts`` is blacklisted without a cooldown."""
        hosts = list(hosts)
        return bool(hosts) and all(self.until.get(h.host, 0.0) == float("inf") and h.host not in self.pending
                                   for h in hosts)


def order_hosts(available: Sequence[HostSlots], keep_first: Sequence[str]) -> tuple[HostSlots, ...]:
    """``available`` with the hosts named in ``keep_first`` (the hosts of the generation that
    ended, in its rank order) first, in that order, then the others as discovered: ranks that
    survive keep their place, and rank 0 stays on a host that holds the last commit."""
    by_name = {h.host: h for h in available}
    first = [by_name[name] for name in dict.fromkeys(keep_first) if name in by_name]
    return tuple(first + [h for h in available if h.host not in set(keep_first)])


def plan_generation(available: Sequence[HostSlots], max_np: Optional[int]) -> tuple[HostSlots, ...]:
    """The hosts and ranks of the next generation: hosts filled in order up to ``max_np`` ranks
    (None: every slot)."""
    total = world_size(available)
    return allocate(total if max_np is None else min(max_np, total), available)


def world_size(hosts: Sequence[HostSlots]) -> int:
    return sum(h.slots for h in hosts)


def update_kind(current: Sequence[HostSlots], proposed: Sequence[HostSlots]) -> int:
    """Horovod's HostUpdateResult for going from ``current`` to ``proposed``: REMOVED when a rank
    slot in use goes away, ADDED when new ones come, both, or NO_UPDATE."""
    now = {(h.host, i) for h in current for i in range(h.slots)}
    then = {(h.host, i) for h in proposed for i in range(h.slots)}
    return (REMOVED if now - then else NO_UPDATE) | (ADDED if then - now else NO_UPDATE)


@dataclasses.dataclass
class SlotIdentity:
    """The HOROVOD_RANK of each rank slot (host, index on the host).  A slot that ran in the
    previous generation keeps the number it had (its worker is the same worker, restarted, as a
    surviving Horovod worker keeps the environment it was launched with); a slot new to this
    generation starts with its rank in it, as a worker Horovod launches now would."""

    previous: dict = dataclasses.field(default_factory=dict)  # (host, index) -> start rank

    def ranks(self, hosts: Sequence[HostSlots]) -> list[tuple[str, int]]:
        """(host, start rank) for each rank of a generation on ``hosts``, in rank order; this
        generation becomes the previous one."""
        out, now = [], {}
        for h in hosts:
            for i in range(h.slots):
                now[(h.host, i)] = self.previous.get((h.host, i), len(out))
                out.append((h.host, now[(h.host, i)]))
        self.previous = now
        return out
