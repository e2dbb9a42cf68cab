"""benchmarks/hosts.py: the namespace commands it builds and the rank shim (no root needed)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import hosts  # noqa: E402


def test_setup_builds_a_bridge_and_one_limited_link_per_host():
    cmds = hosts.setup_commands("mlslhab12cd", 3, "2gbit")
    flat = [" ".join(c) for c in cmds]
    assert flat[:3] == ["ip netns add mlslhab12cdbr", "ip -n mlslhab12cdbr link add br0 type bridge",
                        "ip -n mlslhab12cdbr link set br0 up"]
    for h in range(3):
        ns = f"mlslhab12cd{h}"
        assert f"ip netns add {ns}" in flat
        assert f"ip link add vab12cd{h}h type veth peer name vab12cd{h}b" in flat
        assert f"ip -n {ns} addr add 10.77.0.{h + 1}/24 dev eth0" in flat
        assert f"ip -n mlslhab12cdbr link set vab12cd{h}b master br0" in flat
        assert f"ip netns exec {ns} tc qdisc add dev eth0 root tbf rate 2gbit burst 256kb latency 100ms" in flat
    assert all(len(c[c.index("add") + 1]) <= 15 for c in cmds if c[:3] == ["ip", "link", "add"])  # IFNAMSIZ
    assert not any("tc" in c for c in hosts.setup_commands("mlslhx", 2, None))  # no rate: no limit
    assert not any("10.77.0.254/24" in c for c in cmds)  # the launcher's link only when asked for


def test_launcher_link_reaches_the_bridge_from_here():
    flat = [" ".join(c) for c in hosts.setup_commands("mlslhab12cd", 2, "2gbit", launcher=True)]
    assert hosts.launcher_interface("mlslhab12cd") == "vab12cdL"
    assert "ip link add vab12cdL type veth peer name vab12cdLb" in flat
    assert "ip addr add 10.77.0.254/24 dev vab12cdL" in flat  # this namespace's end, no tc on it
    assert "ip -n mlslhab12cdbr link set vab12cdLb master br0" in flat
    assert not any("tc" in c and "vab12cdL" in c for c in flat)
    assert hosts.teardown_commands("mlslhab12cd", 2, launcher=True)[-1] == ["ip", "link", "delete", "vab12cdL"]


def test_teardown_deletes_every_namespace():
    assert hosts.teardown_commands("mlslhx", 2) == [["ip", "netns", "delete", "mlslhx0"],
                                                     ["ip", "netns", "delete", "mlslhx1"],
                                                     ["ip", "netns", "delete", "mlslhxbr"]]


@pytest.mark.parametrize("env,per_host,host", [
    ({"PMI_RANK": "0"}, 1, 0), ({"PMI_RANK": "3"}, 1, 3), ({"PMI_RANK": "3"}, 2, 1),
    ({"OMPI_COMM_WORLD_RANK": "5"}, 2, 2), ({"SLURM_PROCID": "1"}, 1, 1),
])
def test_enter_runs_the_rank_in_its_hosts_namespace(env, per_host, host):
    assert hosts.enter_command("mlslhx", per_host, ["python", "t.py"], env) == \
        ["ip", "netns", "exec", f"mlslhx{host}", "python", "t.py"]


def test_enter_without_a_rank_says_so():
    with pytest.raises(RuntimeError, match="no rank in the environment"):
        hosts.enter_command("mlslhx", 1, ["python"], {})


def test_enter_argv_calls_this_file():
    argv = hosts.enter_argv("mlslhx", 2, python="/py")
    assert argv[0] == "/py" and argv[1].endswith("hosts.py") and argv[2:] == \
        ["enter", "--prefix", "mlslhx", "--ranks-per-host", "2", "--"]


def test_env_forces_tcp_on_eth0():
    env = hosts.Hosts.env({"PATH": "/bin"})
    assert env["FI_TCP_IFACE"] == "eth0" and env["MPIR_CVAR_NOLOCAL"] == "1" and env["PATH"] == "/bin"
