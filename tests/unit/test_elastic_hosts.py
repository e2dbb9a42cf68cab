"""Elastic mlslrun's pure parts: its flags, discovery output, the blacklist and its cooldowns,
each generation's hosts, the HOROVOD_* numbers of each worker, and the Horovod adapter's argv."""

import json
import math
import pathlib
import sys

import pytest

from mlsl_tf.runner import elastic_hosts as eh
from mlsl_tf.runner import worker_env
from mlsl_tf.runner.argv import parse_args
from mlsl_tf.runner.config import HostSlots, UsageError

H = HostSlots


def test_flags_make_a_job_elastic():
    cfg = parse_args(["-np", "3", "--min-np", "2", "--max-np", "4", "--host-discovery-script", "./d.sh",
                      "--slots-per-host", "2", "--elastic-timeout", "30", "--reset-limit", "5",
                      "--blacklist-cooldown-range", "1", "2", "python", "t.py"])
    el = cfg.elastic
    assert (el.min_np, el.max_np, el.discovery_script, el.slots_per_host) == (2, 4, "./d.sh", 2)
    assert (el.elastic_timeout, el.reset_limit, el.cooldown_range) == (30.0, 5, (1.0, 2.0))
    assert cfg.command == ("python", "t.py")
    # horovodrun's long names; -H with --min-np; -np above -H's... allowed only when elastic
    cfg = parse_args(["-np", "2", "--min-num-proc", "2", "--max-num-proc", "3", "-H", "a:2,b:2", "python", "t.py"])
    assert (cfg.elastic.min_np, cfg.elastic.max_np, cfg.hosts) == (2, 3, (H("a", 2), H("b", 2)))
    assert parse_args(["-np", "2", "python", "t.py"]).elastic is None
    assert parse_args(["-np", "2", "--min-np", "1", "python", "t.py"]).elastic.max_np is None  # every slot


@pytest.mark.parametrize("argv, words", [
    (["-np", "2", "--min-np", "3"], "--min-np (3) <= -np (2)"),
    (["-np", "3", "--max-np", "2"], "-np (3) <= --max-np (2)"),
    (["-np", "2", "--host-discovery-script", "d", "-H", "a:2"], "exclude each other"),
    (["-np", "2", "--reset-limit", "3"], "--reset-limit is for elastic jobs"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "3", "1"], "0 <= LOW <= HIGH"),
    (["-np", "2", "--min-np", "1", "--elastic-timeout", "0"], "--elastic-timeout must be > 0"),
    (["-np", "2", "--min-np", "1", "--slots-per-host", "0"], "--slots-per-host must be >= 1"),
    (["-np", "2", "--network-interface", "lo"], "--network-interface is for elastic jobs"),
    (["-np", "2", "--min-np", "1", "--network-interface", ","], "expected interface names"),
])
def test_bad_elastic_flags_are_named(argv, words):
    with pytest.raises(UsageError) as info:
        parse_args(argv + ["python", "t.py"])
    assert words in str(info.value)


def test_network_interface_gives_the_driver_address():
    from mlsl_tf.runner import elastic_driver
    cfg = parse_args(["-np", "2", "--min-np", "1", "--network-interface", "nosuch0, lo", "python", "t.py"])
    assert cfg.elastic.network_interfaces == ("nosuch0", "lo")
    # the first interface with an IPv4 address, whatever the hosts are
    assert elastic_driver.driver_address(["far.example"], cfg.elastic.network_interfaces) == "127.0.0.1"
    with pytest.raises(RuntimeError, match="--network-interface nosuch0: no IPv4 address"):
        elastic_driver.driver_address(["localhost"], ("nosuch0",))
    assert elastic_driver.driver_address(["localhost", "127.0.0.1"]) == "127.0.0.1"  # chosen: all local


def test_discovery_output():
    assert eh.parse_discovery("localhost:2\n\n127.0.0.1\n  h3:4  \nlocalhost:5\n", slots_per_host=3) == \
        (H("localhost", 2), H("127.0.0.1", 3), H("h3", 4))
    with pytest.raises(UsageError, match="printed 'h:x'"):
        eh.parse_discovery("h:x\n", 1)
    assert eh.parse_discovery("", 1) == ()


def test_blacklist_forever_and_with_cooldown_doubling():
    forever = eh.Blacklist()
    assert forever.fail("a", draw=0.5) == math.inf
    forever.start_cooldowns(100.0)
    assert not forever.usable("a", 1e12) and forever.usable("b", 0.0)
    assert forever.all_out_for_good([H("a", 1)]) and not forever.all_out_for_good([H("a", 1), H("b", 1)])
    cool = eh.Blacklist((10.0, 20.0))
    assert cool.fail("a", draw=0.5) == 15.0          # low + draw * (high - low)
    assert not cool.usable("a", 1e12)                # out until training goes on without it
    assert not cool.all_out_for_good([H("a", 2)])    # ... but not for good
    cool.start_cooldowns(0.0)
    assert not cool.usable("a", 14.9) and cool.usable("a", 15.0)
    assert cool.fail("a", draw=0.0) == 20.0          # second failure: doubled
    cool.start_cooldowns(100.0)
    assert not cool.usable("a", 119.9) and cool.usable("a", 120.0)
    assert cool.fail("a", draw=1.0) == 80.0          # third: four times
    cool.start_cooldowns(200.0)
    assert cool.filter([H("a", 2), H("b", 1)], 250.0) == (H("b", 1),)
    assert not cool.all_out_for_good([H("a", 2)])


def test_generation_hosts_keep_survivors_first_and_respect_max_np():
    available = (H("new", 2), H("b", 1), H("a", 2))
    ordered = eh.order_hosts(available, keep_first=["a", "a", "gone", "b"])
    assert ordered == (H("a", 2), H("b", 1), H("new", 2))
    assert eh.plan_generation(ordered, 4) == (H("a", 2), H("b", 1), H("new", 1))
    assert eh.plan_generation(ordered, None) == ordered
    assert eh.world_size(ordered) == 5


def test_update_kind():
    now = (H("a", 2),)
    assert eh.update_kind(now, (H("a", 2),)) == eh.NO_UPDATE
    assert eh.update_kind(now, (H("a", 2), H("b", 1))) == eh.ADDED
    assert eh.update_kind(now, (H("a", 1),)) == eh.REMOVED
    assert eh.update_kind(now, (H("b", 2),)) == eh.REMOVED | eh.ADDED


def test_slot_identity_as_horovod_workers_keep_their_launch_rank():
    ids = eh.SlotIdentity()
    assert ids.ranks((H("localhost", 2),)) == [("localhost", 0), ("localhost", 1)]
    both = ids.ranks((H("localhost", 2), H("127.0.0.1", 2)))
    assert both == [("localhost", 0), ("localhost", 1), ("127.0.0.1", 2), ("127.0.0.1", 3)]
    # localhost gone: the survivors keep the numbers they started with (Horovod's start_rank)
    assert ids.ranks((H("127.0.0.1", 2),)) == [("127.0.0.1", 2), ("127.0.0.1", 3)]
    # a host back after its cooldown is new: its workers start with their rank now
    assert ids.ranks((H("127.0.0.1", 2), H("localhost", 1))) == [("127.0.0.1", 2), ("127.0.0.1", 3),
                                                                  ("localhost", 2)]


def test_rank_layout_and_horovod_env():
    layout = worker_env.rank_layout([("a", 4), ("a", 5), ("b", 0)])
    assert [(x["rank"], x["local_rank"], x["local_size"], x["cross_rank"], x["cross_size"]) for x in layout] == \
        [(0, 0, 2, 0, 2), (1, 1, 2, 0, 1), (2, 0, 1, 1, 2)]
    env = worker_env.horovod_env(layout[1])
    assert env == {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                   "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1", "HOROVOD_HOSTNAME": "a"}
    json.dumps(layout)


def test_horovod_adapter_maps_horovodrun_argv():
    alias = pathlib.Path(__file__).resolve().parents[1] / "horovod_suite" / "alias"
    sys.path.insert(0, str(alias))
    try:
        from horovod.runner.launch import mlslrun_argv
    finally:
        sys.path.remove(str(alias))
        for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
            del sys.modules[name]
    argv = ["-np", "2", "--min-num-proc", "2", "--log-level", "DEBUG", "-H", "a:2", "python", "s.py", "--x", "python"]
    assert mlslrun_argv(argv, python="/v/python", elastic_timeout=1) == \
        ["--elastic-timeout", "1", "-np", "2", "--min-num-proc", "2", "-H", "a:2", "/v/python", "s.py", "--x", "python"]
