"""horovod.runner.launch's two names Horovod's elastic integration tests call (elastic_common.py):
parse_args() reads horovodrun's command line from sys.argv, _run_elastic(args) runs it as
elastic mlslrun and raises RuntimeError when the job fails, as horovodrun's does."""

import os
import subprocess
import sys

from horovod.runner.elastic import driver

# horovodrun's flags mlslrun does not take, with how many values follow each
_DROPPED = {"--log-level": 1, "--verbose": 0}
FAILED_MESSAGE = "Horovod detected that one or more processes exited with non-zero status"


class Args:
    """What parse_args() read: horovodrun's arguments, as given."""

    def __init__(self, argv):
        self.argv = list(argv)


def parse_args():
    return Args(sys.argv[1:])


def mlslrun_argv(argv, python=sys.executable, elastic_timeout=None):
    """mlslrun's arguments for horovodrun's (pure): dropped flags left out, the command's
    `python` made this interpreter, --elastic-timeout added when the test changed the default."""
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word in _DROPPED:
            i += 1 + _DROPPED[word]
            continue
        if word == "python":
            out += [python, *argv[i + 1:]]
            break
        out.append(word)
        i += 1
    if elastic_timeout is not None:
        out = ["--elastic-timeout", str(elastic_timeout), *out]
    return out


def _run_elastic(args):
    timeout = driver.ELASTIC_TIMEOUT_SECS if driver.ELASTIC_TIMEOUT_SECS != driver.DEFAULT_ELASTIC_TIMEOUT_SECS else None
    cmd = [sys.executable, "-m", "mlsl_tf.runner", *mlslrun_argv(args.argv, elastic_timeout=timeout)]
    print(" ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True, errors="replace",
                          env=dict(os.environ))
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.startswith("mlslrun: job failed")]
        raise RuntimeError(f"{FAILED_MESSAGE} (mlslrun exited with code {proc.returncode}: "
                           f"{lines[-1] if lines else proc.stderr[-500:]})")
