"""Data-parallel Keras training with mlsl_tf: a small CNN on scikit-learn's 8x8 digits.

    python -m mlsl_tf.runner -np 2 python examples/keras_digits.py
    mpiexec -n 2 python examples/keras_digits.py

A Horovod script with only the import changed: every rank trains on its own shard of the
training set; DistributedOptimizer averages the gradients; the callbacks make the ranks start
from rank 0's weights and report metrics averaged over ranks. Keras' progress bar is printed by
rank 0 only (mlsl_tf.keras.init does that; hvd.set_progress_output("all") would undo it).
"""

import time

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import mlsl_tf.keras as hvd

hvd.init()

# The same split on every rank (fixed seed), then rank r keeps every size()-th training example.
digits = load_digits()
images = (digits.images / 16.0).astype("float32")[..., None]  # (1797, 8, 8, 1) in [0, 1]
x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=0,
                                                    stratify=digits.target)
x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

keras.utils.set_random_seed(hvd.rank())  # different on purpose: the broadcast makes them agree
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])

# Horovod's recipe: scale the learning rate by the number of ranks, warm it up over the first epochs.
base_lr = 0.002
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(base_lr * hvd.size())),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])

epochs = 12
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # rank 0's weights and optimizer state everywhere
    hvd.callbacks.MetricAverageCallback(),  # epoch metrics averaged over ranks
    hvd.callbacks.LearningRateWarmupCallback(base_lr * hvd.size(), warmup_epochs=2),
]

start = time.perf_counter()
# verbose=2: one line per epoch with the rank-averaged loss and accuracy, printed by rank 0.
model.fit(x_train, y_train, batch_size=32, epochs=epochs, callbacks=callbacks, verbose=2)
train_s = time.perf_counter() - start

# Every rank holds the same weights now; each scores its share of the test set, the counts are summed.
shard = slice(hvd.rank(), None, hvd.size())
predictions = np.argmax(model.predict(x_test[shard], verbose=0), axis=1)
correct = hvd.allreduce(np.array([np.sum(predictions == y_test[shard]), len(predictions)], np.float64), op=hvd.Sum,
                        name="keras_digits.test_accuracy").numpy()
if hvd.rank() == 0:
    print(f"test accuracy {correct[0] / correct[1]:.4f} on {int(correct[1])} images "
          f"({hvd.size()} ranks, {train_s:.1f} s of training)")
