"""mlslrun, the horovodrun-style launcher: ``python -m mlsl_tf.runner -np 2 python train.py``.

Pure, bottom-up: config.py (RunConfig, UsageError) < hosts.py (-H, hostfiles), rank_env.py
(rank environment), ssh.py (ssh options, the check's command and verdicts) < argv.py
(mlslrun's command line), launchers.py (per-MPI argv).  ssh_check.py does the ssh I/O
(the pre-flight check of the remote hosts); launch.py does the rest and runs them; task.py
wraps each rank, from placement.py (rank, CPUs), rank_status.py (status files, launch.py reads
them too), output.py (output copies and tags), pmi_relay.py (the PMI relay) < child.py (the
command's process).  Floors: tests/unit/test_floors.py RUNNER_FLOORS.
"""
