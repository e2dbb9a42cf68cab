"""The ssh I/O before a multi-host launch: which hosts are remote, their ssh check, the ssh wrapper file.

The pre-flight check, as horovodrun does: before anything starts, ssh to every remote host
without prompting (BatchMode, ConnectTimeout) and test there that the ranks' interpreter
is executable; every failing host is listed with why, instead of a launcher that hangs or
fails with a message about some proxy.  Texts and commands come from ssh.py.
"""

import concurrent.futures
import os
import socket
import subprocess
from typing import Optional, Sequence

from mlsl_tf.runner.config import UsageError
from mlsl_tf.runner import ssh

MAX_PARALLEL_CHECKS = 32
LAUNCHER_EXEC_NAME = "ssh"


def is_local(host: str) -> bool:
    """Whether ``host`` is this machine: its name, or an address one can bind here (the
    launcher starts ranks there without ssh)."""
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False  # unknown here: ssh will say so
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def remote_hosts(hosts: Sequence[str]) -> list[str]:
    """The hosts, in order, that are not this machine."""
    return [h for h in hosts if not is_local(h)]


def _check_one(host: str, opts: ssh.SshOptions, python: str, task_py: str,
               timeout_s: float) -> Optional[str]:
    argv = ssh.check_argv(host, opts, python, task_py)
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, errors="replace",
                             timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return ssh.describe_failure(host, None, "", opts, python, task_py, timeout_s)
    except OSError as e:
        return f"{host}: cannot run ssh: {e}"
    return ssh.describe_failure(host, out.returncode, out.stdout, opts, python, task_py, timeout_s)


def check_hosts(hosts: Sequence[str], opts: ssh.SshOptions, python: str, task_py: str,
                timeout_s: float = ssh.CHECK_TIMEOUT_S) -> list[str]:
    """Check every host at once (up to MAX_PARALLEL_CHECKS at a time); the failures, one line
    per failing host, in the order of ``hosts``."""
    if not hosts:
        return []
    workers = min(MAX_PARALLEL_CHECKS, len(hosts))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        verdicts = list(pool.map(lambda h: _check_one(h, opts, python, task_py, timeout_s), hosts))
    return [v for v in verdicts if v is not None]


def preflight(hosts: Sequence[str], opts: ssh.SshOptions, python: str, task_py: str) -> None:
    """Check the remote ones of ``hosts``; raise RuntimeError listing each failing host."""
    remote = remote_hosts(hosts)
    failures = check_hosts(remote, opts, python, task_py)
    if failures:
        raise RuntimeError(ssh.failure_report(failures, len(remote)))


def check_identity_file(opts: ssh.SshOptions) -> None:
    """UsageError when --ssh-identity-file is not a readable file here (ssh would only warn,
    then try other keys and report a refused login)."""
    path = opts.identity_file
    if path is None:
        return
    if not os.path.exists(path):
        why = "no such file"
    elif not os.path.isfile(path):
        why = "not a file"
    elif not os.access(path, os.R_OK):
        why = "not readable"
    else:
        return
    raise UsageError(f"--ssh-identity-file {path}: {why}")


def write_launcher_exec(directory: str, opts: ssh.SshOptions) -> str:
    """Write the ssh wrapper (ssh.launcher_exec_script) into ``directory``; its path."""
    path = os.path.join(directory, LAUNCHER_EXEC_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(ssh.launcher_exec_script(opts))
    return path
