"""Horovod's timeline API at run time: start_timeline mid-job, the file read while the job runs,
stop_timeline, a second start to another path, mark_cycles, '{rank}' paths and unwritable paths
(the environment variables and init's errors: tests/unit/test_timeline_env.py)."""

import errno
import json
import re
import os
import shutil
import tempfile
import time

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import mlsl_tf as hvd
from mlsl_tf import timeline

RANK, SIZE = hvd.rank(), hvd.size()


@pytest.fixture
def shared_dir():
    """A directory every rank sees (rank 0 makes it)."""
    path = MPI.COMM_WORLD.bcast(tempfile.mkdtemp(prefix="mlsl-tl-") if RANK == 0 else None, root=0)
    yield path
    hvd.allreduce(tf.zeros([1]), name="tl.cleanup")  # every rank is done with the files
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


def collectives(tag):
    """An allreduce, allgather and broadcast named after `tag`, results checked."""
    x = tf.fill([300], float(RANK + 1))
    s = hvd.allreduce(x, op=hvd.Sum, name=f"{tag}.sum")
    assert np.all(s.numpy() == SIZE * (SIZE + 1) / 2)
    g = hvd.allgather(tf.fill([2], RANK), name=f"{tag}.gather")
    assert g.numpy().tolist() == [r for r in range(SIZE) for _ in range(2)]
    b = hvd.broadcast(tf.fill([3], float(RANK)), root_rank=SIZE - 1, name=f"{tag}.bcast")
    assert b.numpy().tolist() == [SIZE - 1.0] * 3


def expected(tag):
    return [("NEGOTIATE_ALLREDUCE", f"{tag}.sum"), ("ALLREDUCE", f"{tag}.sum"),
            ("NEGOTIATE_ALLGATHER", f"{tag}.gather"), ("ALLGATHER", f"{tag}.gather"),
            ("NEGOTIATE_BROADCAST", f"{tag}.bcast"), ("BROADCAST", f"{tag}.bcast")]


def wait_for(path, wanted, cycles=False, seconds=20.0):
    """Reads the trace at `path` while the job runs until it holds every (activity, tensor) in
    `wanted` (and a CYCLE_START); returns the trace and the raw text of that read. Between two
    writes the file is strict JSON (a read that caught a write half done is read again)."""
    deadline = time.monotonic() + seconds
    while True:
        with open(path) as f:
            text = f.read()
        try:
            t = timeline.parse(json.loads(text))
        except json.JSONDecodeError:
            t = None
        missing = [w for w in wanted if t is None or not t.activity(*w)]
        if not missing and (not cycles or t.cycle_starts):
            return t, text
        assert time.monotonic() < deadline, f"{path} still lacks {missing} (cycles: {cycles}):\n{text[-2000:]}"
        time.sleep(0.02)


def check_spans(t, tag):
    """Every Horovod span sits on its tensor's own row, and ALLREDUCE follows its negotiation."""
    neg = t.activity("NEGOTIATE_ALLREDUCE", f"{tag}.sum")[0]
    op = t.activity("ALLREDUCE", f"{tag}.sum")[0]
    assert neg.lane == op.lane == f"allreduce.{tag}.sum"
    assert neg.end_us <= op.start_us + 1 and op.dur_us >= 0
    # mlsl_tf's own events are still there, for mlsl_tf.timeline's chart
    assert any(s.phase == "negotiate" and s.name == f"{tag}.gather" for s in t.spans)
    assert any(i.kind in ("done", "eager") and i.name == f"{tag}.sum" for i in t.instants)


def test_start_read_while_running_stop_and_restart(shared_dir):
    first, second = os.path.join(shared_dir, "first.json"), os.path.join(shared_dir, "second.json")
    hvd.start_timeline(first)
    collectives("tl.a")
    for _ in range(3):  # a name every rank knows: small ones ride in the control message (eager)
        hvd.allreduce(tf.ones([300]), op=hvd.Sum, name="tl.a.sum")
    if RANK == 0:
        # the job is still running (no stop yet): the file is already a valid trace
        t, text = wait_for(first, expected("tl.a"))
        check_spans(t, "tl.a")
        assert "start_time_since_epoch_in_micros" in text and t.pids() == [0]
    hvd.stop_timeline()
    if RANK == 0:
        text = open(first).read()
        assert text.endswith("]\n") and json.loads(text)
        size_after_stop = len(text)
        t = timeline.load(first)
        assert len(t.activity("NEGOTIATE_ALLREDUCE", "tl.a.sum")) == len(t.activity("ALLREDUCE", "tl.a.sum")) == 4
    collectives("tl.between")  # not recorded: no timeline now
    hvd.start_timeline(second, mark_cycles=True)
    collectives("tl.b")
    if RANK == 0:
        t, _ = wait_for(second, expected("tl.b"), cycles=True)
        check_spans(t, "tl.b")
        assert t.cycle_starts and all(c.kind == "CYCLE_START" for c in t.cycle_starts)
    hvd.stop_timeline()
    if RANK == 0:
        first_text, second_text = open(first).read(), open(second).read()
        assert len(first_text) == size_after_stop, "the first file changed after stop_timeline"
        assert "tl.between" not in first_text + second_text
        assert "tl.b.sum" not in first_text and "tl.a.sum" not in second_text
        json.loads(second_text)
    hvd.stop_timeline()  # nothing to stop: no error, as Horovod


def test_same_path_again_keeps_the_file_and_sets_mark_cycles(shared_dir):
    path = os.path.join(shared_dir, "same.json")
    hvd.start_timeline(path, mark_cycles=False)
    collectives("tl.c")
    if RANK == 0:
        t, _ = wait_for(path, expected("tl.c"))
        assert not t.cycle_starts
    hvd.start_timeline(path, mark_cycles=True)  # the same path: not truncated
    collectives("tl.d")
    if RANK == 0:
        t, _ = wait_for(path, expected("tl.c") + expected("tl.d"), cycles=True)
    hvd.stop_timeline()
    if RANK == 0:
        t = timeline.load(path)
        assert t.activity("ALLREDUCE", "tl.c.sum") and t.activity("ALLREDUCE", "tl.d.sum") and t.cycle_starts


def test_rank_placeholder_every_rank_writes(shared_dir):
    pattern = os.path.join(shared_dir, "rank{rank}.json")
    hvd.start_timeline(pattern)
    collectives("tl.e")
    mine = pattern.replace("{rank}", str(RANK))
    t, _ = wait_for(mine, expected("tl.e"))
    assert t.pids() == [RANK]
    hvd.stop_timeline()
    json.loads(open(mine).read())


def test_unwritable_path_fails_on_the_writing_ranks_only(shared_dir):
    missing_dir = os.path.join(shared_dir, "no", "such", "dir")
    path = os.path.join(missing_dir, "t.json")
    if RANK == 0:
        with pytest.raises(FileNotFoundError, match="rank 0 cannot write the timeline file " + re.escape(repr(path))):
            hvd.start_timeline(path)
    else:
        hvd.start_timeline(path)  # rank 0 alone writes this path: nothing to do here
    # every rank writes a '{rank}' path: every rank fails, naming its own file
    per_rank = os.path.join(missing_dir, "t{rank}.json")
    with pytest.raises(FileNotFoundError, match=f"rank {RANK} cannot write .*t{RANK}.json"):
        hvd.start_timeline(per_rank)
    hvd.stop_timeline()
    collectives("tl.after_error")  # the job goes on
    # another path that cannot be written: the file being written is closed first (as Horovod)
    good = os.path.join(shared_dir, "good.json")
    hvd.start_timeline(good)
    collectives("tl.f")
    if RANK == 0:
        wait_for(good, expected("tl.f"))
        with pytest.raises(FileNotFoundError, match="cannot write the timeline file"):
            hvd.start_timeline(path)
    hvd.allreduce(tf.ones([1]), name="tl.sync")
    collectives("tl.g")
    hvd.stop_timeline()
    if RANK == 0:
        text = open(good).read()
        assert json.loads(text) and "tl.f.sum" in text and "tl.g.sum" not in text


def test_paths_that_cannot_be_written_raise_on_every_writing_rank():
    """/dev/full opens but takes no byte: the first write fails, and start_timeline says so
    (it used to return with the timeline silently off); an empty path is open('')'s error, not a
    silent stop; a NUL byte is refused, not cut (the C string would name another file)."""
    if RANK == 0:
        with pytest.raises(OSError, match="rank 0 cannot write the timeline file '/dev/full'") as info:
            hvd.start_timeline("/dev/full")
        assert info.value.errno == errno.ENOSPC
    else:
        hvd.start_timeline("/dev/full")  # rank 0 alone writes this path
    with pytest.raises(FileNotFoundError, match="empty path"):
        hvd.start_timeline("")
    with pytest.raises(ValueError, match="embedded null byte"):
        hvd.start_timeline("/tmp/a\0b.json")
    hvd.stop_timeline()
    collectives("tl.after_bad_paths")  # the job goes on
