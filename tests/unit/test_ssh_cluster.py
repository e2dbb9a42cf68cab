"""tests/ssh/cluster.py without root: the files it writes for each host, and a clear failure where it cannot run.

make test-ssh must fail, not skip, on a machine without root, namespaces or sshd: the cluster
raises, naming what is missing, before it makes anything.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ssh"))
import cluster  # noqa: E402


def test_every_host_resolves_every_name():
    assert cluster.etc_hosts_text(3).splitlines() == [
        "127.0.0.1 localhost", "10.77.0.1 h0", "10.77.0.2 h1", "10.77.0.3 h2", "10.77.0.10 h9"]


def test_sshd_listens_on_its_host_only_and_takes_keys_only():
    text = cluster.sshd_config_text("10.77.0.2", 2222, "/t/hk", "/t/ak").splitlines()
    assert text[:3] == ["ListenAddress 10.77.0.2:2222", "HostKey /t/hk", "AuthorizedKeysFile /t/ak"]
    assert "PasswordAuthentication no" in text and "KbdInteractiveAuthentication no" in text


def test_the_client_trusts_only_the_runs_host_keys():
    assert cluster.ssh_config_text("/t/kh").splitlines() == [
        "UserKnownHostsFile /t/kh", "GlobalKnownHostsFile /dev/null", "StrictHostKeyChecking yes",
        "IdentitiesOnly yes", "IdentityAgent none"]
    assert cluster.known_hosts_line(1, 2222, "ssh-ed25519 AAAA c\n") == "[h1]:2222,[10.77.0.2]:2222 ssh-ed25519 AAAA c\n"


def test_without_root_or_sshd_it_fails_naming_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cluster, "SSHD", str(tmp_path / "no-sshd"))
    monkeypatch.setenv("PATH", str(tmp_path))  # none of the tools either
    made = []
    monkeypatch.setattr(cluster.tempfile, "mkdtemp", lambda **kw: made.append(kw) or str(tmp_path))
    with pytest.raises(RuntimeError) as e:
        with cluster.SshCluster(2):
            pass
    message = str(e.value)
    assert message.startswith("the emulated ssh cluster cannot start here: it must run as root")
    assert "missing commands: ip, unshare, mount, ssh, ssh-keygen" in message
    assert f"no {tmp_path / 'no-sshd'}: install openssh-server" in message
    assert made == []  # nothing was made
