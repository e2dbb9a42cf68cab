"""mlslrun's ssh options (--ssh-port, --ssh-identity-file) in each launcher's form, and the ssh check's texts.

The pre-flight check's command and its verdict on each host are here too.

Pure functions of their arguments: no subprocess, no file access, no ``os.environ``
(ssh_check.py runs the check and writes the launcher's ssh wrapper).
"""

import dataclasses
import shlex
from typing import Optional, Sequence

from mlsl_tf.runner.config import UsageError

# Every ssh mlslrun starts or has its launcher start fails rather than asking for a password or a
# passphrase: there is nobody to answer (the launcher runs without a terminal).
BATCH_OPTIONS = ("-o", "BatchMode=yes")
CONNECT_TIMEOUT_S = 10   # ssh's own limit on opening the TCP connection to a host
CHECK_TIMEOUT_S = 30     # the whole check of one host: connection, login, remote test
# The remote check's exit codes (a remote shell's own are below 128, ssh's own error is 255).
NO_PYTHON_EXIT = 41
NO_TASK_EXIT = 42
SSH_ERROR_EXIT = 255


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """What the user asked ssh to do differently: port and identity file (None: ssh's defaults)."""

    port: Optional[int] = None
    identity_file: Optional[str] = None

    @property
    def given(self) -> bool:
        return self.port is not None or self.identity_file is not None


def option_args(opts: SshOptions) -> list[str]:
    """``-p PORT -i FILE`` (each only when given)."""
    args = []
    if opts.port is not None:
        args += ["-p", str(opts.port)]
    if opts.identity_file is not None:
        args += ["-i", opts.identity_file]
    return args


def launcher_exec_script(opts: SshOptions, ssh: str = "ssh") -> str:
    """A /bin/sh script that runs ssh with the options and then the launcher's own arguments.

    MPICH's hydra takes no ssh arguments, only another ssh executable (``-launcher-exec``):
    this script is that executable.  Every word is shell-quoted.
    """
    words = [ssh, *BATCH_OPTIONS, *option_args(opts)]
    return "#!/bin/sh\n# mlslrun's ssh for the MPI launcher\nexec " + shlex.join(words) + ' "$@"\n'


def rsh_args_text(opts: SshOptions, option: str) -> str:
    """The ssh options as one string, for a launcher that splits its value at blanks and
    has no quoting (Open MPI's plm_rsh_args, Intel MPI's -bootstrap-exec-args).  A file
    name with a blank cannot pass through it: UsageError naming ``option``."""
    if opts.identity_file is not None and any(c.isspace() for c in opts.identity_file):
        raise UsageError(f"--ssh-identity-file {opts.identity_file!r}: {option} splits its value "
                         "at blanks, so the file name must have none (move or link the key)")
    return " ".join([*BATCH_OPTIONS, *option_args(opts)])


def check_argv(host: str, opts: SshOptions, python: str, task_py: str,
               connect_timeout: int = CONNECT_TIMEOUT_S) -> list[str]:
    """The ssh command that checks one host: log in without prompting, then test that the
    interpreter every rank runs is executable there and mlslrun's rank wrapper is there."""
    remote = (f"test -x {shlex.quote(python)} || exit {NO_PYTHON_EXIT}; "
              f"test -f {shlex.quote(task_py)} || exit {NO_TASK_EXIT}")
    return ["ssh", *BATCH_OPTIONS, "-o", f"ConnectTimeout={connect_timeout}", *option_args(opts),
            host, remote]


def _ssh_message(output: str) -> str:
    """The line of ssh's output that says what went wrong (its last, skipping mere warnings)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith("Warning: Permanently added")]
    return (useful or lines or ["no message from ssh"])[-1]


def _port_text(opts: SshOptions) -> str:
    return f"port {opts.port}" if opts.port is not None else "ssh's port (22 unless ssh_config says otherwise)"


def describe_failure(host: str, returncode: Optional[int], output: str, opts: SshOptions,
                     python: str, task_py: str, timeout_s: float = CHECK_TIMEOUT_S) -> Optional[str]:
    """Why the check of ``host`` failed, one line starting with the host; None when it passed.

    ``returncode`` None means the check did not end within ``timeout_s``.
    """
    if returncode == 0:
        return None
    if returncode is None:
        return f"{host}: no answer within {timeout_s:g} s (ssh connection or login hangs)"
    if returncode == NO_PYTHON_EXIT:
        return (f"{host}: the ranks' interpreter {python} is missing or not executable there "
                "(install the same environment at the same path on every host)")
    if returncode == NO_TASK_EXIT:
        return (f"{host}: mlslrun's rank wrapper {task_py} is missing there "
                "(install mlsl_tf at the same path on every host)")
    why = _ssh_message(output)
    if returncode != SSH_ERROR_EXIT:
        return f"{host}: the check's remote command failed with exit code {returncode}: {why}"
    low = why.lower()
    if "permission denied" in low or "too many authentication failures" in low:
        key = opts.identity_file if opts.identity_file is not None else "ssh's default keys"
        return (f"{host}: ssh login refused ({why}); is the public key of {key} "
                f"(--ssh-identity-file) in that host's authorized_keys?")
    if "host key verification failed" in low or "remote host identification has changed" in low:
        return (f"{host}: its ssh host key is unknown or changed ({why}); "
                "add the right key to known_hosts (ssh-keyscan)")
    if "could not resolve hostname" in low or "name or service not known" in low:
        return f"{host}: unknown host name ({why})"
    if any(s in low for s in ("connection refused", "no route to host", "timed out",
                              "network is unreachable", "connection reset", "connection closed")):
        return f"{host}: unreachable by ssh on {_port_text(opts)} ({why})"
    return f"{host}: ssh failed ({why})"


def failure_report(failures: Sequence[str], checked: int) -> str:
    """The error for a failed check: how many of the hosts failed, then one line per host."""
    head = (f"ssh check failed for {len(failures)} of {checked} remote "
            f"host{'s' if checked != 1 else ''}; no rank was started:")
    return "\n".join([head] + [f"  {line}" for line in failures])
