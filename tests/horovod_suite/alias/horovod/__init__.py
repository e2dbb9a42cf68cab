"""The alias package under which Horovod's test suite imports mlsl_tf (tests/horovod_suite only)."""
