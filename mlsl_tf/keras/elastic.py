"""Horovod's Keras elastic names on a fixed job (see mlsl_tf.elastic): KerasState and the
callbacks that commit state and keep its epoch and batch up to date during `fit`."""

from mlsl_tf.elastic import TensorFlowKerasState, run  # noqa: F401  (run is part of the API)
from mlsl_tf.keras_flavour import Callback


class KerasState(TensorFlowKerasState):
    """State of a Keras model and optimizer, with keyword attributes (epoch, batch, ...)."""


class CommitStateCallback(Callback):
    """Commits `state` every `batches_per_commit` batches and at each epoch's end (through
    commit(), which a subclass may extend, as Horovod's tests do)."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a sync

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.commit()

    def commit(self):
        self.state.commit()


class UpdateBatchStateCallback(Callback):
    """Keeps `state.batch` at the number of batches trained in the current epoch (0 at its
    start).  A `fit` that begins with state.batch > 0 (after a reset, finishing the epoch with
    `steps_per_epoch=steps - state.batch`) counts on from there until that epoch ends."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.first_batch = 0

    def on_train_begin(self, logs=None):
        self.first_batch = self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = self.first_batch + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0
        self.first_batch = 0


class UpdateEpochStateCallback(Callback):
    """Keeps `state.epoch` at the number of epochs trained, across resets: `fit` counts its epochs
    from 0 (give it `epochs=total - state.epoch`), so they are added to the epoch the state had
    when training began."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1
