"""mlslrun, the horovodrun-style launcher: ``python -m mlsl_tf.runner -np 2 python train.py``.

Pure, bottom-up: config.py (RunConfig, UsageError) < hosts.py (-H, hostfiles), rank_env.py
(rank environment) < argv.py (mlslrun's command line), launchers.py (per-MPI argv).
launch.py does the I/O and runs them; task.py wraps each rank.
"""
