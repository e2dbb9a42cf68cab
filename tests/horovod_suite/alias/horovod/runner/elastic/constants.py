"""horovod.runner.elastic.constants: the text a job over its --reset-limit fails with (mlslrun's)."""

RESET_LIMIT_EXCEEDED_MESSAGE = "more than --reset-limit {}"
