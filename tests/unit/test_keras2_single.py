"""Keras 2 (tf_keras) at world size 1 (plain pytest): which Keras an object or a saved file
belongs to, the wrapped optimizer's class and config, and the errors for bad input."""

import os

import keras
import numpy as np
import pytest
import tf_keras

import mlsl_tf.keras as hvd
from mlsl_tf import _library, keras2_compat, keras_flavour

hvd.init()


def _tf_keras_model():
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))])
    model.compile(optimizer=hvd.DistributedOptimizer(tf_keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), verbose=0)
    return model


def _keras3_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=keras.losses.MeanSquaredError())
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), verbose=0)
    return model


def test_objects_are_told_apart():
    assert keras2_compat.is_keras2(tf_keras.optimizers.SGD())
    assert keras2_compat.is_keras2(tf_keras.optimizers.legacy.SGD())
    assert keras2_compat.is_keras2(tf_keras.layers.Dense(1))
    assert not keras2_compat.is_keras2(keras.optimizers.SGD())
    assert not keras2_compat.is_keras2(keras.layers.Dense(1))
    assert keras_flavour.of(tf_keras.optimizers.SGD()) is keras2_compat
    assert keras_flavour.of(keras.optimizers.SGD()) is not keras2_compat


@pytest.mark.parametrize("make", [lambda: tf_keras.optimizers.legacy.Adam(0.01, beta_1=0.8),
                                  lambda: tf_keras.optimizers.Adam(0.01, beta_1=0.8)])
def test_wrapped_optimizer_keeps_class_name_and_config(make):
    opt = make()
    wrapped = hvd.DistributedOptimizer(opt, backward_passes_per_step=2)
    assert hvd.is_distributed(wrapped) and not hvd.is_distributed(opt)
    assert isinstance(wrapped, type(opt))
    assert (type(wrapped).__name__, type(wrapped).__module__) == (type(opt).__name__, type(opt).__module__)
    assert wrapped.get_config() == opt.get_config()
    assert type(wrapped).from_config(wrapped.get_config()).get_config() == opt.get_config()
    assert int(wrapped._agg_helper.counter.numpy()) == 0


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(tf_keras.optimizers.SGD(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="mlsl_tf.Average, mlsl_tf.Sum or mlsl_tf.Adasum"):
        hvd.DistributedOptimizer(tf_keras.optimizers.SGD(), op=hvd.Max)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(tf_keras.optimizers.SGD(), op=hvd.Sum, gradient_predivide_factor=2.0)


def test_saved_files_are_read_by_the_keras_that_wrote_them(tmp_path):
    k2, k3 = _tf_keras_model(), _keras3_model()
    paths = {"k2.h5": k2, "k2.keras": k2, "k2_savedmodel": k2, "k3.h5": k3, "k3.keras": k3}
    for name, model in paths.items():
        model.save(os.fspath(tmp_path / name))
    for name in paths:
        path = os.fspath(tmp_path / name)
        assert hvd.saved_by_keras2(path) == name.startswith("k2"), name
        loaded = hvd.load_model(path)
        assert isinstance(loaded, tf_keras.Model if name.startswith("k2") else keras.Model), name
        assert hvd.is_distributed(loaded.optimizer), name
        np.testing.assert_array_equal(loaded.get_weights()[0], paths[name].get_weights()[0])
    assert not hvd.saved_by_keras2(os.fspath(tmp_path / "missing.h5"))


def test_overlap_is_on_under_keras2_and_a_fallback_is_logged_once(caplog):
    parked = _library.c_api().mlsl_tf_parked
    before = parked()  # what models of earlier tests in this process left pending
    model = _tf_keras_model()
    assert parked() - before == len(model.trainable_variables)  # fit returned, updates pending
    model.get_weights()
    assert parked() == before
    tf_keras.utils.set_random_seed(0)
    clipped = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))])
    clipped.compile(optimizer=hvd.DistributedOptimizer(tf_keras.optimizers.SGD(0.1, global_clipnorm=1.0)), loss="mse")
    with caplog.at_level("INFO", logger="mlsl_tf"):
        for _ in range(2):
            clipped.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), verbose=0)
    assert parked() == before
    assert caplog.text.count("SGD applies synchronously: global_clipnorm needs every gradient at once") == 1
