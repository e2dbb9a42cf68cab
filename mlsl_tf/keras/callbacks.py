"""Keras callbacks for data-parallel training, with Horovod's names and semantics, plus an
atomic rank-0 checkpoint callback. They subclass Keras 3's Callback and work in Keras 3's and in
tf_keras' `model.fit` alike: what differs between the two (optimizer state, learning rate) goes
through mlsl_tf.keras_flavour."""

import os
import warnings

import keras
import numpy as np
import tensorflow as tf

from mlsl_tf import keras_flavour, ops
from mlsl_tf.basics import rank, size
from mlsl_tf.functions import broadcast_variables


Callback = keras_flavour.Callback


class BroadcastGlobalVariablesCallback(Callback):
    """At the start of the first `fit`, gives every rank root_rank's model weights and optimizer
    state. The optimizer is built first if it is not yet, so its state (slots, iteration count)
    agrees before step 1, not only after it as with Horovod. Put it first in `callbacks`.

    A model whose weights do not exist yet when fit starts (a Sequential without an Input, a
    subclassed model never called) creates them inside the first step; its weights and
    optimizer state are broadcast right after that step instead, as Horovod does.

    mlsl_tf's collectives have no XLA kernels, so a model whose train step would be
    XLA-compiled (Keras' jit_compile="auto" on a GPU) is switched to jit_compile=False here.

    local_variables (or register_local_var): model variables that are each rank's own, as in
    model parallelism: they keep this rank's values (the optimizer's state is broadcast whole)."""

    def __init__(self, root_rank=0, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local = {}  # id -> variable (held, so the id stays its own)
        for v in local_variables or []:
            self.register_local_var(v)

    def register_local_var(self, var):
        """Leaves `var` out of the broadcast: every rank keeps its own value."""
        self._local[id(var)] = var

    def _broadcast(self):
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        variables = [v for v in model.variables if id(v) not in self._local]
        if optimizer is not None:
            compat = keras_flavour.of(optimizer)
            if not compat.optimizer_built(optimizer):
                compat.build_optimizer(optimizer, model.trainable_variables)
            variables += compat.optimizer_variables(optimizer)
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        model = self.model
        if getattr(model, "jit_compile", False):
            warnings.warn("mlsl_tf: collectives cannot be XLA-compiled; training with jit_compile=False")
            model.jit_compile = False
            model.make_train_function(force=True)
        if not self.broadcast_done and model.built and model.variables:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:  # the weights were created by the first step
            self._broadcast()


class MetricAverageCallback(Callback):
    """At the end of each epoch replaces every numeric value in `logs` by its mean over ranks, so
    that callbacks after it (and History, the progress bar) see the global value. Put it before
    callbacks that read metrics (checkpointing, early stopping, LR reduction)."""

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        if not keys:
            return
        values = tf.constant([float(np.asarray(logs[k])) for k in keys], tf.float64)
        mean = ops.allreduce(values, op=ops.Average, name="MetricAverageCallback").numpy()
        for k, v in zip(keys, mean):
            logs[k] = float(v)


def _is_number(v):
    try:
        return np.asarray(v).ndim == 0 and np.issubdtype(np.asarray(v).dtype, np.number)
    except (TypeError, ValueError):
        return False


def _get_lr(optimizer):
    return keras_flavour.of(optimizer).get_learning_rate(optimizer)


class LearningRateScheduleCallback(Callback):
    """Sets the learning rate to initial_lr * multiplier(epoch) for epochs in
    [start_epoch, end_epoch). `multiplier` is a constant or a function of the epoch; with
    staircase=True it is applied at the first batch of each epoch with the integer epoch,
    otherwise at every batch with the fractional epoch (epoch + batch / steps_per_epoch).

    momentum_correction: when the rate changes from lr to lr', an SGD momentum buffer is
    rescaled by lr'/lr (Goyal et al., 2017) — the same update as Horovod's momentum * lr'/lr for
    one batch, done on the buffers because Keras 3 bakes `momentum` into the traced step.
    Optimizers without momentum buffers (Adam, ...) need no correction."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.staircase = True
            self.multiplier = lambda epoch: multiplier

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}: could not tell the number of steps per epoch; "
                                 "pass steps_per_epoch=")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def _in_range(self):
        return self.current_epoch >= self.start_epoch and (self.end_epoch is None
                                                            or self.current_epoch < self.end_epoch)

    def _adjust_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if self.momentum_correction and old_lr > 0 and new_lr != old_lr:
            ratio = new_lr / old_lr
            for m in keras_flavour.of(optimizer).momentum_buffers(optimizer):
                m.assign(m * ratio)
        return new_lr

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch is None or not self._in_range():
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate linearly from initial_lr / size() to initial_lr over the first
    warmup_epochs epochs (Goyal et al., 2017), updating it every batch. initial_lr is the rate
    for the full, size()-times larger global batch."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Shifted by one batch so the rate reaches round values at the ends of epochs.
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_lr(self.model.optimizer):g}.")


class ModelCheckpoint(Callback):
    """Saves the model (`model.save`, a `.keras` path) or its weights (save_weights_only, a
    `.weights.h5` path) on rank 0 only, atomically: into a temporary file in the same directory,
    then `os.replace`, so a reader never sees a half-written checkpoint. `filepath` may contain
    `{epoch}` (1-based) and any log key, e.g. "ckpt-{epoch:02d}-{val_loss:.3f}.keras".

    save_best_only: save only when `monitor` improves (mode "min", "max", or "auto": max for
    accuracy-like names). save_freq: "epoch", or an int to save every that many batches.
    Put MetricAverageCallback before it so the monitored value is the global one."""

    def __init__(self, filepath, monitor="val_loss", verbose=0, save_best_only=False, save_weights_only=False,
                 mode="auto", save_freq="epoch", initial_value_threshold=None):
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq > 0):
            raise ValueError(f"save_freq must be 'epoch' or a positive int, got {save_freq!r}")
        suffix = ".weights.h5" if save_weights_only else ".keras"
        if not str(filepath).endswith(suffix):
            raise ValueError(f"with save_weights_only={save_weights_only} the filepath must end in {suffix!r}, "
                             f"got {filepath!r}")
        if mode == "auto":
            mode = "max" if ("acc" in monitor or monitor.startswith("fmeasure")) else "min"
        self.filepath = str(filepath)
        self.monitor = monitor
        self.verbose = verbose
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.save_freq = save_freq
        self.best = initial_value_threshold
        self._epoch = 0
        self._batches_seen = 0

    def _improved(self, value):
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def _write(self, path):
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        suffix = ".weights.h5" if self.save_weights_only else ".keras"
        tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.path.basename(path)[:-len(suffix)]}{suffix}")
        try:
            if self.save_weights_only:
                self.model.save_weights(tmp, overwrite=True)
            else:
                self.model.save(tmp, overwrite=True)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def _maybe_save(self, epoch, batch, logs):
        if rank() != 0:
            return
        logs = dict(logs or {})
        if self.save_best_only:
            if self.monitor not in logs:
                warnings.warn(f"ModelCheckpoint: {self.monitor!r} is not in the logs ({sorted(logs)}); not saving")
                return
            value = float(np.asarray(logs[self.monitor]))
            if not self._improved(value):
                return
            if self.verbose > 0:
                print(f"\nEpoch {epoch + 1}: {self.monitor} improved from {self.best} to {value:.5f}")
            self.best = value
        fields = {k: float(np.asarray(v)) if _is_number(v) else v for k, v in logs.items()}
        fields["epoch"] = epoch + 1
        if batch is not None:
            fields["batch"] = batch
        path = self.filepath.format(**fields)
        self._write(path)
        if self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: saved {'weights' if self.save_weights_only else 'model'} to {path}")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq == "epoch":
            return
        self._batches_seen += 1
        if self._batches_seen % self.save_freq == 0:
            self._maybe_save(self._epoch, batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._maybe_save(epoch, None, logs)


class BestModelCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that keeps only the best model by `monitor` at `filepath` (rank 0, atomic)."""

    def __init__(self, filepath, monitor="val_loss", verbose=0, mode="auto", save_weights_only=False,
                 save_freq="epoch"):
        super().__init__(filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
