"""mlslrun, the horovodrun-style launcher: ``python -m mlsl_tf.runner -np 2 python train.py``.

argv.py builds command lines (pure), launch.py runs them, task.py wraps each rank.
"""
