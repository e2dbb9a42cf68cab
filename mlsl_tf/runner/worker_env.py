"""The HOROVOD_* variables of a worker: its rank, size, local and cross numbers, host name.

Standard library only: the rank wrapper (task.py) sets them before every rank's command, from the
elastic driver's layout (MLSL_TF_ELASTIC_LAYOUT) or, on a fixed job, the rank alone."""

from typing import Mapping, Sequence

# The elastic driver's variables the wrapper reads (mlsl_tf/elastic_link.py has the worker's copies:
# runner/ and the package import nothing of each other) and a worker's exit code for a reset.
DRIVER_ENV = "MLSL_TF_ELASTIC_DRIVER"          # host:port:token of elastic mlslrun's server
GENERATION_ENV = "MLSL_TF_ELASTIC_GENERATION"  # 1, 2, ...: which set of workers this is
LAYOUT_ENV = "MLSL_TF_ELASTIC_LAYOUT"          # JSON [[host, start rank], ...] by rank
RESET_EXIT_CODE = 75                           # the command left for a reset


def rank_layout(slots: Sequence[tuple[str, int]]) -> list[dict]:
    """Horovod's per-worker numbers for a generation (``slots``: (host, start rank) per rank):
    rank, size, local and cross rank and size, hostname and start rank."""
    hosts = list(dict.fromkeys(host for host, _ in slots))
    local_sizes = {h: sum(1 for host, _ in slots if host == h) for h in hosts}
    seen: dict = {}
    out = []
    for rank, (host, start) in enumerate(slots):
        local = seen.get(host, 0)
        seen[host] = local + 1
        cross_size = sum(1 for h in hosts if local_sizes[h] > local)
        cross_rank = sum(1 for h in hosts[:hosts.index(host)] if local_sizes[h] > local)
        out.append({"rank": rank, "size": len(slots), "local_rank": local, "local_size": local_sizes[host],
                    "cross_rank": cross_rank, "cross_size": cross_size, "hostname": host, "start_rank": start})
    return out


def horovod_env(layout: Mapping[str, object]) -> dict:
    """The HOROVOD_* variables horovodrun gives a worker, from one entry of rank_layout."""
    names = {"rank": "HOROVOD_RANK", "size": "HOROVOD_SIZE", "local_rank": "HOROVOD_LOCAL_RANK",
             "local_size": "HOROVOD_LOCAL_SIZE", "cross_rank": "HOROVOD_CROSS_RANK",
             "cross_size": "HOROVOD_CROSS_SIZE", "hostname": "HOROVOD_HOSTNAME"}
    env = {var: str(layout[key]) for key, var in names.items()}
    env["HOROVOD_RANK"] = str(layout["start_rank"])  # the rank the worker's slot first ran as
    return env
