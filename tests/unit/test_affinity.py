"""Which cores init() binds a rank to (mlsl_tf/cpu_placement.py): the policy on made-up machines."""

import json
import os
import subprocess
import sys

import pytest

from mlsl_tf import cpu_placement


@pytest.mark.parametrize("text,want", [
    ("0-3", {0, 1, 2, 3}), ("0", {0}), ("0-1,4,6-7\n", {0, 1, 4, 6, 7}), ("", set()), (" 2 , 5 ", {2, 5}),
])
def test_parse_cpu_list(text, want):
    assert cpu_placement.parse_cpu_list(text) == want


def two_sockets_with_hyperthreads(cpu):
    """Linux's usual numbering on 2 sockets x 4 cores x 2 threads: CPU c and c + 8 are siblings,
    CPUs 0-3 (and 8-11) on socket 0."""
    core = cpu % 8
    return core // 4, core % 4


def test_hyperthreads_stay_with_their_core_and_blocks_stay_in_a_socket():
    cores = cpu_placement.physical_cores(set(range(16)), two_sockets_with_hyperthreads)
    assert cores == [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]
    assert cpu_placement.share(cores, 0, 2) == {0, 1, 2, 3, 8, 9, 10, 11}
    assert cpu_placement.share(cores, 1, 2) == {4, 5, 6, 7, 12, 13, 14, 15}
    assert cpu_placement.share(cores, 3, 4) == {6, 7, 14, 15}


@pytest.mark.parametrize("ncores,nranks", [(2, 2), (7, 3), (8, 3), (40, 6), (5, 5)])
def test_blocks_are_disjoint_cover_every_core_and_differ_by_at_most_one(ncores, nranks):
    cores = cpu_placement.physical_cores(set(range(ncores)), lambda cpu: (0, cpu))
    blocks = [cpu_placement.share(cores, r, nranks) for r in range(nranks)]
    assert set().union(*blocks) == set(range(ncores))
    assert sum(len(b) for b in blocks) == ncores
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    for b in blocks:  # contiguous
        assert b == set(range(min(b), max(b) + 1))


def test_unknown_topology_counts_each_cpu_as_a_core():
    assert cpu_placement.physical_cores({3, 1, 2}, lambda cpu: None) == [[1], [2], [3]]


def test_fewer_cores_than_ranks_binds_nothing():
    cores = cpu_placement.physical_cores({0, 1}, lambda cpu: (0, cpu))
    assert cpu_placement.share(cores, 0, 3) is None
    for ranks in (3, 4):
        cpus, why = cpu_placement.plan("auto", 0, ranks, [], {0, 1}, {0, 1}, lambda cpu: (0, cpu))
        assert cpus is None and f"{ranks} ranks on 2 physical cores" in why


def plan(setting="auto", local_rank=1, local_size=2, comm_cores=(), current=frozenset(range(4)),
         allowed=frozenset(range(4))):
    return cpu_placement.plan(setting, local_rank, local_size, list(comm_cores), current, allowed, lambda cpu: (0, cpu))


def test_an_unbound_rank_gets_its_block():
    assert plan() == ({2, 3}, "local rank 1 of 2 on 4 physical cores")


@pytest.mark.parametrize("kwargs,reason", [
    (dict(setting="none"), "MLSL_TF_BIND=none"),
    (dict(comm_cores=[3]), "MLSL_TF_COMM_CORE"),
    (dict(local_rank=0, local_size=1), "one rank on this machine"),
    (dict(current=frozenset({2, 3})), "the launcher bound this rank already"),
])
def test_left_alone(kwargs, reason):
    cpus, why = plan(**kwargs)
    assert cpus is None and reason in why


def test_the_cgroup_limit_is_the_whole_machine():
    # A container limited to CPUs 4-7 with an unbound rank: the blocks come from those four.
    cpus, _ = plan(local_rank=0, current=frozenset(range(4, 8)), allowed=frozenset(range(4, 8)))
    assert cpus == {4, 5}


def test_bad_local_rank():
    with pytest.raises(ValueError):
        cpu_placement.share([[0], [1]], 2, 2)


# --- init() on real jobs of this machine -------------------------------------------

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
REPORT = """
import json, os
import tensorflow as tf
import mlsl_tf as hvd
hvd.init()
tf.constant(1.0) + 1.0  # TensorFlow's pools now exist
masks = {}
for tid in os.listdir("/proc/self/task"):
    try:
        masks[tid] = sorted(os.sched_getaffinity(int(tid)))
    except OSError:
        pass
with open(os.path.join(os.environ["REPORT_DIR"], f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(sorted(set(map(tuple, masks.values()))), f)
"""


def job_masks(tmp_path, env_extra, preexec=None, ranks=2):
    """{rank: the distinct CPU masks of its threads} after init() in an mpiexec job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSL_TF_", "PMI_", "HYD"))}
    env.update(env_extra, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", REPORT_DIR=str(tmp_path))
    out = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, "-c", REPORT], env=env, capture_output=True,
                         text=True, timeout=180, preexec_fn=preexec)
    assert out.returncode == 0, out.stderr[-3000:]
    return {r: [set(m) for m in json.loads((tmp_path / f"rank{r}.json").read_text())] for r in range(ranks)}


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_init_binds_every_thread_of_each_rank_as_planned(tmp_path, ranks):
    allowed = cpu_placement.allowed_cpus()
    # as an unbound launcher starts it
    masks = job_masks(tmp_path, {}, preexec=lambda: os.sched_setaffinity(0, allowed), ranks=ranks)
    for rank in range(ranks):
        want, why = cpu_placement.plan("auto", rank, ranks, [], allowed, allowed, cpu_placement.core_of)
        assert masks[rank] == [want or allowed], f"rank {rank}: threads on {masks[rank]}, want {want} ({why})"
    cores = cpu_placement.physical_cores(allowed, cpu_placement.core_of)
    if len(cores) >= ranks:  # each rank its own cores
        assert all(not masks[a][0] & masks[b][0] for a in range(ranks) for b in range(a))


def test_init_leaves_a_bound_job_and_none_alone(tmp_path):
    allowed = cpu_placement.allowed_cpus()
    one = {max(os.sched_getaffinity(0))}
    assert job_masks(tmp_path, {}, preexec=lambda: os.sched_setaffinity(0, one)) == {0: [one], 1: [one]}
    assert job_masks(tmp_path, {"MLSL_TF_BIND": "none"}, preexec=lambda: os.sched_setaffinity(0, allowed)) == \
        {0: [allowed], 1: [allowed]}


def test_bind_sets_every_thread_and_a_second_init_keeps_its_own_mask(monkeypatch):
    masks = {0: set(range(4)), 11: set(range(4)), 12: set(range(4))}  # 0: the calling thread

    def setaffinity(tid, cpus):
        masks[tid] = set(cpus)
        if tid == 11:
            masks[0] = set(cpus)  # thread 11 is the calling thread

    monkeypatch.setattr(cpu_placement, "_bound", None)
    monkeypatch.setattr(cpu_placement, "allowed_cpus", lambda: set(range(4)))
    monkeypatch.setattr(cpu_placement, "core_of", lambda cpu: (0, cpu))
    monkeypatch.setattr(cpu_placement.os, "listdir", lambda path: ["11", "12"])
    monkeypatch.setattr(cpu_placement.os, "sched_getaffinity", lambda tid: masks[tid])
    monkeypatch.setattr(cpu_placement.os, "sched_setaffinity", setaffinity)
    assert cpu_placement.bind(1, 2, "auto", "") == {2, 3}
    assert masks[11] == masks[12] == {2, 3}
    # init() again (after shutdown): the mask differs from the cgroup's, yet it is not a launcher's
    assert cpu_placement.bind(1, 2, "auto", "") == {2, 3}
