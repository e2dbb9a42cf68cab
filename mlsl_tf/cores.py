"""MLSL_TF_COMM_CORE, parsed in one place: which CPU core each local rank's background thread
runs on. mlslrun's --comm-core flag (runner/rank_env.py) and per-rank wrapper (runner/task.py,
which keeps the command's threads off those cores) and init() (mlsl_tf/basics.py, which hands
the decided core to the library, and mlsl_tf/affinity.py, which then leaves threads alone) all
read the setting through `parse` and `core_for`; the C++ runtime only pins where it is told.
Standard library only: mlslrun imports it before TensorFlow."""

SETTING = "MLSL_TF_COMM_CORE"
ALLOWED = "empty, or a core number or a comma-separated list of them (e.g. 3 or 2,3)"


def parse(spec):
    """[] for "" (no pinning), [3] for "3", [2, 3] for "2,3" (spaces around entries allowed);
    raises ValueError naming the setting and the bad entry."""
    if not spec.strip():
        return []
    cores = []
    for item in spec.split(","):
        item = item.strip()
        if not (item.isascii() and item.isdigit()):  # str.isdigit alone takes '²' and '٣'
            raise ValueError(f"{SETTING}={spec!r}: {item!r} is not a core number (expected {ALLOWED})")
        cores.append(int(item))
    return cores


def core_for(cores, local_rank):
    """The core of local rank `local_rank`: the (local_rank mod n)-th entry of `cores` (None when
    there are none)."""
    return cores[local_rank % len(cores)] if cores else None
