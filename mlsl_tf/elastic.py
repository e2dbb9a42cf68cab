"""Horovod's elastic-training state objects on mlsl_tf's fixed set of ranks: commit, restore and
sync of variables, Keras models and Python attributes, and `run`.

mlsl_tf runs on the ranks mpiexec started; it never adds or removes workers. Horovod's elastic
API is kept because its state objects are useful on their own (checkpoint in memory, roll back a
failed step, bring every rank to rank 0's state), and scripts written for it should run
unchanged on a fixed job:

- `commit()` saves the state in memory; `check_host_updates()` finds none (hosts never change).
- `restore()` returns to the last commit; `sync()` gives every rank rank 0's state and commits it.
- `run(func)` syncs the state, then calls `func(state, ...)`. A collective that fails because a
  rank died cannot be retried with fewer ranks (the MPI job is fixed): the error propagates,
  where elastic Horovod would restore, re-form the ring and call `func` again."""

import copy

import tensorflow as tf

from mlsl_tf import keras_flavour
from mlsl_tf.basics import rank
from mlsl_tf.functions import broadcast_object, broadcast_variables


class HorovodInternalError(RuntimeError):
    """A collective failed inside the runtime (Horovod's name; never raised to reset here)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod raises it when hosts join or leave; on a fixed job that never happens."""

    def __init__(self, skip_sync=False):
        super().__init__()
        self.skip_sync = skip_sync


class State:
    """What elastic training keeps: subclasses define save, restore and sync."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions to call after a reset; a fixed job never resets, so they are only kept."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp=None, update_res=None):
        pass

    def commit(self):
        """Saves the state in memory (restore() returns to it) and checks for host updates."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Hosts never change in a fixed job: nothing to raise."""

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def reset(self):
        pass


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

    def _set_attrs(self):
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))


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
        model_vars, opt_vars = self._state_variables()
        broadcast_variables(model_vars + opt_vars, root_rank=0)
        self._save_model()
        super().sync()


def run(func):
    """Decorator: `func(state, *args, **kwargs)` runs after `state.sync()` (every rank starts
    from rank 0's state). See the module docstring for what a fixed job cannot do."""

    def wrapper(state, *args, **kwargs):
        state.sync()
        return func(state, *args, **kwargs)

    wrapper.__name__ = getattr(func, "__name__", "wrapper")
    wrapper.__doc__ = func.__doc__
    return wrapper
