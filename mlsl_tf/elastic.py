"""Horovod's elastic training: state objects that commit, roll back and sync, and `run`.

Under elastic mlslrun (`--min-np`, `--max-np`, `--host-discovery-script`) the job outlives its
workers.  `commit()` keeps the state in memory (and tells the link which copy is the last commit);
`restore()` returns to it; `sync()` gives every rank rank 0's state.  `run(func)` syncs, then
calls `func(state, ...)`, and when the job must re-form -- a peer died (a collective failed because
of it, raised as HorovodInternalError, or the driver reported the death), or hosts were added or
removed (HostsUpdatedInterrupt at a commit) -- this worker writes the last commit to a file and
leaves with elastic_link.RESET_EXIT_CODE.  The driver starts the next generation on the hosts
there are; its rank 0 loads that file, the reset callbacks run, `sync()` hands the state to every
rank and `func` is called again: the rollback, re-formation and retry of Horovod's elastic mode,
with fresh processes (docs/design.md says why).

On a fixed job (no elastic mlslrun) nothing resets: a failed collective propagates as it is."""

import copy
import os
import pickle
import queue
import sys
import threading

import tensorflow as tf

from mlsl_tf import _library, elastic_link, keras_flavour
from mlsl_tf.basics import caused_by_peer, rank
from mlsl_tf.functions import broadcast_object, broadcast_variables

# Horovod's HostUpdateResult flags (elastic_hosts.py has the driver's copy)
NO_UPDATE, REMOVED, ADDED = 0, 1, 2


class HorovodInternalError(RuntimeError):
    """A collective failed because a peer died: under elastic mlslrun `run` resets the job."""


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed (raised by commit() on every rank at the same commit)."""

    def __init__(self, skip_sync=False):
        super().__init__()
        self.skip_sync = skip_sync


class State:
    """What elastic training keeps: subclasses define save, restore, sync and their payload."""

    def __init__(self):
        self._reset_callbacks = []
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = 0
        self._committed = None  # the payload of the last commit (what a reset writes to its file)
        self._bcast_object = broadcast_object

    def register_reset_callbacks(self, callbacks):
        """Functions to call after a reset (workers added or removed), before the state syncs:
        e.g. scaling the learning rate to the new size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        """The driver announced a change of hosts (called on the link's thread)."""
        self._host_messages.put((timestamp, update_res))

    def commit(self):
        """Saves the state in memory (restore() returns to it; a reset carries it to the next
        workers), then raises HostsUpdatedInterrupt on every rank alike when hosts changed."""
        self.save()
        self._committed = self._payload()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt when the driver announced a change of hosts; rank 0's
        view decides, so every rank raises at the same commit."""
        if elastic_link.current() is None:
            return  # a fixed job: hosts never change, and no collective is spent on asking
        last = previous = self._last_updated_timestamp
        update = NO_UPDATE
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > last:
                last = timestamp
                update |= result
        previous, self._last_updated_timestamp, update = self._bcast_object((previous, last, update))
        if self._last_updated_timestamp > previous:
            raise HostsUpdatedInterrupt(update == REMOVED)

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def reset(self):
        pass

    def _payload(self):
        """The committed state as picklable values (what save() kept)."""
        raise NotImplementedError

    def _load(self, payload):
        """Takes a payload of _payload() as the committed state and restores it."""
        raise NotImplementedError


class ObjectState(State):
    """Python attributes given as keyword arguments (e.g. epoch=0, batch=0), saved by value."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank, **kwargs):
        super().__init__()
        self._bcast_object = bcast_object
        self._get_rank = get_rank
        self._saved = kwargs
        self._set_attrs()

    def save(self):
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._saved}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved:
            self._saved = self._bcast_object(self._saved)
            self._set_attrs()
        self._committed = self._payload()

    def _set_attrs(self):
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def _payload(self):
        return {"attrs": self._saved}

    def _load(self, payload):
        self._saved = dict(payload["attrs"])
        ObjectState.restore(self)


def _values(variables):
    return [tf.identity(v).numpy() if hasattr(v, "numpy") else tf.convert_to_tensor(v).numpy() for v in variables]


class TensorFlowState(ObjectState):
    """A list of tf.Variables (eager) plus keyword attributes."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None:
            if tf.executing_eagerly():
                raise ValueError("TensorFlowState: pass the variables (eager TensorFlow has no global collection)")
            variables = tf.compat.v1.global_variables()
        self.variables = list(variables)
        self.session = session
        self._saved_values = _values(self.variables)
        super().__init__(**kwargs)

    def save(self):
        self._saved_values = _values(self.variables)
        super().save()

    def restore(self):
        for v, value in zip(self.variables, self._saved_values):
            v.assign(value)
        super().restore()

    def sync(self):
        broadcast_variables(self.variables, root_rank=0)
        self._saved_values = _values(self.variables)
        super().sync()

    def _payload(self):
        return {**super()._payload(), "variables": self._saved_values}

    def _load(self, payload):
        values = payload["variables"]
        if len(values) != len(self.variables):
            raise ValueError(f"TensorFlowState: the commit being resumed has {len(values)} variables, this "
                             f"state {len(self.variables)}")
        self._saved_values = list(values)
        for v, value in zip(self.variables, self._saved_values):
            v.assign(value)
        super()._load(payload)


class TensorFlowKerasState(ObjectState):
    """A built Keras model and its optimizer (the model's own when not given), plus attributes."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not model.built:
            raise ValueError("TensorFlowKerasState: the model must be built first (model.build(input_shape))")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._save_model()
        super().__init__(**kwargs)

    def _state_variables(self):
        opt_vars = keras_flavour.of(self.optimizer).optimizer_variables(self.optimizer) \
            if self.optimizer is not None else []
        return list(self.model.variables), opt_vars

    def _save_model(self):
        model_vars, opt_vars = self._state_variables()
        self._saved_model = _values(model_vars)
        self._saved_optimizer = _values(opt_vars)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        model_vars, opt_vars = self._state_variables()
        for v, value in zip(model_vars, self._saved_model):
            v.assign(value)
        for v, value in zip(opt_vars, self._saved_optimizer):
            v.assign(value)
        super().restore()

    def sync(self):
        self._build_optimizer_like_rank0()
        model_vars, opt_vars = self._state_variables()
        broadcast_variables(model_vars + opt_vars, root_rank=0)
        self._save_model()
        super().sync()

    def _build_optimizer_like_rank0(self):
        """Every rank builds the optimizer's slots when rank 0 has them (a resumed commit
        carries them), so the broadcast lists the same variables everywhere."""
        if self.optimizer is None or elastic_link.current() is None:
            return
        flavour = keras_flavour.of(self.optimizer)
        if self._bcast_object(flavour.optimizer_built(self.optimizer)) and not flavour.optimizer_built(self.optimizer):
            flavour.build_optimizer(self.optimizer, self.model.trainable_variables)

    def _payload(self):
        return {**super()._payload(), "model": self._saved_model, "optimizer": self._saved_optimizer}

    def _load(self, payload):
        if payload["optimizer"] and self.optimizer is not None:
            flavour = keras_flavour.of(self.optimizer)
            if not flavour.optimizer_built(self.optimizer):
                flavour.build_optimizer(self.optimizer, self.model.trainable_variables)
        model_vars, opt_vars = self._state_variables()
        for what, have, saved in (("model", model_vars, payload["model"]), ("optimizer", opt_vars, payload["optimizer"])):
            if len(have) != len(saved):
                raise ValueError(f"TensorFlowKerasState: the commit being resumed has {len(saved)} {what} "
                                 f"variables, this state {len(have)}")
        self._saved_model, self._saved_optimizer = list(payload["model"]), list(payload["optimizer"])
        self.restore()
        ObjectState._load(self, payload)


def _resets_on(error):
    """Whether `error` means a peer died (the collective failed because of another rank)."""
    return isinstance(error, HorovodInternalError) or caused_by_peer(error)


class _Reset:
    """Leaving for a reset, once per process: write the last commit, tell the driver, exit."""

    def __init__(self, state, link):
        self.state, self.link = state, link
        self._guard = threading.Lock()

    def __call__(self, why):
        with self._guard:  # the link's thread and the training thread may both come here
            path = elastic_link.state_path(rank())
            payload = self.state._committed
            saved = None
            if path is not None and payload is not None:
                try:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path + ".tmp", "wb") as f:
                        pickle.dump({"generation": elastic_link.generation(), "payload": payload}, f,
                                    protocol=pickle.HIGHEST_PROTOCOL)
                    os.replace(path + ".tmp", path)
                    saved = path
                except OSError as e:
                    print(f"mlsl_tf: elastic reset could not write the last commit to {path}: {e}",
                          file=sys.stderr, flush=True)
            self.link.send({"type": "reset", "saved": saved, "why": str(why)[:300]})
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(elastic_link.RESET_EXIT_CODE)  # no MPI_Finalize: a dead peer would hold it up


def _resume(state):
    """In a generation after a reset: rank 0 takes the commit the last generation wrote; then
    the reset callbacks run (every rank).  Returns whether this generation resumed."""
    if elastic_link.generation() <= 1:
        return False
    path = elastic_link.resume_path()
    if rank() == 0 and path:
        with open(path, "rb") as f:
            state._load(pickle.load(f)["payload"])
    state.on_reset()
    return True


def run(func):
    """Decorator: `func(state, *args, **kwargs)` runs after `state.sync()` (every rank starts
    from rank 0's state).  Under elastic mlslrun, a dead peer or a change of hosts resets the
    job (module docstring); on a fixed job errors propagate."""

    def wrapper(state, *args, **kwargs):
        link = elastic_link.current()
        if link is None:
            state.sync()
            return func(state, *args, **kwargs)
        reset = _Reset(state, link)
        link.reset_handler = reset
        try:
            _resume(state)  # its on_reset() forgets announcements: listen only after it
            link.add_listener(state)
            state.sync()
            if rank() == 0:
                link.send({"type": "training"})  # the driver starts blacklisted hosts' cooldowns
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt as e:
            reset(f"hosts updated ({e!r})")
        except SystemExit as e:
            if e.code not in (0, None):  # a failing worker: MPI_Finalize would wait for peers that left
                _library.c_api().mlsl_tf_exit_failing()
            raise
        except Exception as e:  # noqa: BLE001 - only a peer's death resets; the rest propagates
            if not _resets_on(e):
                raise
            reset(e)  # the last commit is what the next generation starts from: the rollback
        finally:
            link.remove_listener(state)
            link.reset_handler = None

    wrapper.__name__ = getattr(func, "__name__", "wrapper")
    wrapper.__doc__ = func.__doc__
    return wrapper
