"""mlslrun launching through ssh as on a cluster (make test-ssh; root only; not part of make test).

On emulated hosts that each run an sshd (cluster.py), mlslrun started on h0 trains the digits
example on h0 and h1, reaching h1 through ssh; an unreachable host, a key no host accepts and a
host without the interpreter each stop it before any rank starts, with a message naming the host.

Where the cluster cannot be built (not root, no network namespaces, no sshd) the tests fail
with the reason; they never skip.
"""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import cluster as emulated  # noqa: E402

from mlsl_tf.runner import ssh  # noqa: E402

EXAMPLE = ["python", "examples/keras_digits.py"]
# The hosts share one kernel: left to itself, MPICH's default (UCX) would move the ranks' data
# through shared memory between them.  As on a cluster with only TCP, the ranks are told to use
# libfabric's TCP provider on eth0 -- passed by mlslrun's -x, so hydra carries them through ssh.
TCP = ["-x", "MPIR_CVAR_CH4_NETMOD=ofi", "-x", "FI_PROVIDER=tcp", "-x", "FI_TCP_IFACE=eth0"]
# The digits CNN has ~33,000 float32 weights whose gradients are allreduced in each of 12 x 22
# steps: over 30 MB cross each host's link; a run whose ranks did not talk over eth0 moves
# only kilobytes there.
MIN_LINK_BYTES = 10 * 2**20
# What a failed check may take: ssh's ConnectTimeout and one login, plus mlslrun's own start.
FAILURE_WITHIN_S = ssh.CHECK_TIMEOUT_S + 15


@pytest.fixture(scope="module")
def hosts():
    with emulated.SshCluster(count=3, hide_python_on=(2,)) as c:
        yield c


def mlslrun(c, np, host_list, *extra, key=None, command=EXAMPLE):
    python = sys.executable
    argv = [python, "-m", "mlsl_tf.runner", "-np", str(np), "-H", host_list,
            "--ssh-port", str(emulated.PORT), "--ssh-identity-file", key or c.key, *extra, *TCP]
    env = dict(os.environ, PYTHONPATH=emulated.ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    return c.run(argv + [python if command[0] == "python" else command[0], *command[1:]], host=0, env=env)


def show(title, code, out, err, seconds):
    print(f"\n===== {title}: exit code {code}, {seconds:.1f} s =====\n{out}{err}", flush=True)


def test_digits_train_on_two_hosts_reached_through_ssh(hosts):
    rx_before = hosts.rx_bytes(1)
    code, out, err, seconds = mlslrun(hosts, 2, "h0:1,h1:1", "--verbose")
    received = hosts.rx_bytes(1) - rx_before
    show("mlslrun -np 2 -H h0:1,h1:1 on h0", code, out, err, seconds)
    print(f"h1's eth0 received {received / 2**20:.1f} MiB during the run", flush=True)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "-launcher ssh -launcher-exec" in out  # hydra was given mlslrun's ssh wrapper
    accuracy = re.search(r"test accuracy ([0-9.]+) on (\d+) images \(2 ranks", out)
    assert accuracy, out[-3000:]
    assert float(accuracy.group(1)) >= 0.9 and accuracy.group(2) == "450"
    # The rank on h1 came in through h1's sshd, from h0, with the test's key...
    assert re.search(r"Accepted publickey for root from 10\.77\.0\.1 port \d+ ssh2: ED25519",
                     hosts.sshd_log(1)), hosts.sshd_log(1)
    # ...and the gradients crossed the emulated network.
    assert received > MIN_LINK_BYTES, received


def test_unreachable_host_is_named(hosts):
    code, out, err, seconds = mlslrun(hosts, 2, f"h0:1,{emulated.UNREACHABLE}:1")
    show(f"-H h0:1,{emulated.UNREACHABLE}:1 (no such machine)", code, out, err, seconds)
    assert code == 1 and seconds < FAILURE_WITHIN_S
    assert f"{emulated.UNREACHABLE}: unreachable by ssh on port {emulated.PORT}" in err, err
    assert "no rank was started" in err and "[0]<stdout>" not in out


def test_wrong_key_is_named(hosts):
    code, out, err, seconds = mlslrun(hosts, 2, "h0:1,h1:1", key=hosts.wrong_key)
    show("-H h0:1,h1:1 --ssh-identity-file wrong_key", code, out, err, seconds)
    assert code == 1 and seconds < FAILURE_WITHIN_S
    assert f"h1: ssh login refused (root@h1: Permission denied (publickey).); is the public key of " \
           f"{hosts.wrong_key} (--ssh-identity-file) in that host's authorized_keys?" in err, err


def test_missing_interpreter_is_named(hosts):
    code, out, err, seconds = mlslrun(hosts, 2, "h0:1,h2:1")
    show("-H h0:1,h2:1 (no interpreter on h2)", code, out, err, seconds)
    assert code == 1 and seconds < FAILURE_WITHIN_S
    assert f"h2: the ranks' interpreter {sys.executable} is missing or not executable there" in err, err


def test_every_failing_host_is_listed(hosts):
    code, out, err, seconds = mlslrun(hosts, 4, f"h0:1,h1:1,h2:1,{emulated.UNREACHABLE}:1",
                                      key=hosts.wrong_key)
    show("-H h0:1,h1:1,h2:1,h9:1 --ssh-identity-file wrong_key", code, out, err, seconds)
    assert code == 1 and seconds < FAILURE_WITHIN_S
    assert "ssh check failed for 3 of 3 remote hosts; no rank was started:" in err, err
    listed = re.findall(r"^  (h\d): (.*)$", err, re.M)
    assert [h for h, _ in listed] == ["h1", "h2", emulated.UNREACHABLE], err
    assert listed[0][1].startswith("ssh login refused") and listed[1][1].startswith("ssh login refused")
    assert listed[2][1].startswith("unreachable by ssh")
