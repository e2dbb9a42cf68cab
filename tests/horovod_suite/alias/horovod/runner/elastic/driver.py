"""horovod.runner.elastic.driver's settings the tests patch; launch._run_elastic reads them when it
runs the job (mlslrun polls discovery every second whatever DISCOVER_HOSTS_FREQUENCY_SECS says)."""

DEFAULT_ELASTIC_TIMEOUT_SECS = 600
ELASTIC_TIMEOUT_SECS = DEFAULT_ELASTIC_TIMEOUT_SECS
DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
