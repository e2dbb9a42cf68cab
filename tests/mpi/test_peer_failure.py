"""A peer's end reaches Python as a status code, not as message text: collectives (eager and in a
tf.function) and group changes that fail because another rank shut down carry StatusCode
kUnavailable (an AbortedError, as in Horovod, with the code in its payload), which
mlsl_tf.basics.caused_by_peer (and so mlslrun's failure record) goes by; an error of this rank's
own is not caused by a peer."""

import json
import time

import pytest
import tensorflow as tf

import mlsl_tf as hvd
from mlsl_tf import _library, basics

R, N = hvd.rank(), hvd.size()


def _peers_leave_rank0_fails(fn):
    """Every rank but 0 shuts down; rank 0 runs fn(), which must fail. Returns its error on rank
    0 (None elsewhere); every rank is initialised again afterwards."""
    error = None
    if R != 0:
        time.sleep(0.3)
        hvd.shutdown()
    else:
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            fn()
        assert time.monotonic() - start < 10, "the error took too long to arrive"
        error = info.value
    return error


def _again():
    if hvd.is_initialized():
        hvd.shutdown()
    hvd.init()
    assert float(hvd.allreduce(tf.ones([1]), op=hvd.Sum, name="peer_failure.again")[0]) == N


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_peers_shutdown_is_unavailable(mode, tmp_path, monkeypatch):
    def pending():
        f = lambda: hvd.allreduce(tf.ones([4]), name=f"peer_failure.{mode}")  # noqa: E731
        return tf.function(f)() if mode == "graph" else f()

    error = _peers_leave_rank0_fails(pending)
    if R == 0:
        assert isinstance(error, tf.errors.AbortedError), repr(error)
        assert "shut down" in str(error) and f"'peer_failure.{mode}'" in str(error)
        assert _library.status_code(error) == _library.UNAVAILABLE
        assert basics.caused_by_peer(error)
        # a collective submitted after the runtime closed fails with the same code
        with pytest.raises(tf.errors.AbortedError) as info:
            hvd.allreduce(tf.ones([1]), name="peer_failure.after")
        assert basics.caused_by_peer(info.value)
        # mlslrun's record of this rank's failure says a peer caused it
        path = tmp_path / "failure.json"
        monkeypatch.setenv(basics.FAILURE_FILE_ENV, str(path))
        basics._record_failure(error)
        assert json.loads(path.read_text())["caused_by_peer"] is True
    _again()


def test_a_group_change_after_a_peers_shutdown_carries_the_code():
    def change():
        hvd.allreduce(tf.ones([1]), name="peer_failure.before_group")  # fails: closes the runtime

    error = _peers_leave_rank0_fails(change)
    if R == 0:
        assert basics.caused_by_peer(error)
        with pytest.raises(ValueError) as info:
            hvd.add_process_set([0])
        assert info.value.mlsl_status_code == _library.UNAVAILABLE, info.value
        assert basics.caused_by_peer(info.value)
    _again()


def test_an_error_of_this_rank_is_not_caused_by_a_peer():
    with pytest.raises(tf.errors.OpError) as info:
        hvd.allreduce(tf.ones([2 + (R == N - 1)]), name="peer_failure.own_shape")
    assert _library.status_code(info.value) not in (None, _library.UNAVAILABLE)
    assert not basics.caused_by_peer(info.value)
    assert not basics.caused_by_peer(RuntimeError("rank 1 shut down, so collectives can no longer complete"))
