"""Horovod's Keras elastic names on a fixed job (see mlsl_tf.elastic): KerasState and the
callbacks that commit state and keep its epoch and batch up to date during `fit`."""

from mlsl_tf.elastic import TensorFlowKerasState, run  # noqa: F401  (run is part of the API)
from mlsl_tf.keras_flavour import Callback


class KerasState(TensorFlowKerasState):
    """State of a Keras model and optimizer, with keyword attributes (epoch, batch, ...)."""


class CommitStateCallback(Callback):
    """Commits `state` every `batches_per_commit` batches and at each epoch's end."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._remaining = batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self._remaining -= 1
        if self._remaining == 0:
            self.state.commit()
            self._remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()
        self._remaining = self.batches_per_commit


class UpdateBatchStateCallback(Callback):
    """Keeps `state.batch` at the number of the batch being trained (0 at each epoch's start)."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(Callback):
    """Keeps `state.epoch` at the epoch being trained."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1
