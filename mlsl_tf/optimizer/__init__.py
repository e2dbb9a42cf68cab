"""DistributedOptimizer's family, one module per kind of optimizer: dispatch.py (the public
DistributedOptimizer and is_distributed: picks one of the next three), keras3.py (Keras 3),
keras2.py (Keras 2, tf_keras), tf1.py (tf.compat.v1.train optimizers), and reduce.py (what they
and DistributedGradientTape share). This file imports nothing."""
