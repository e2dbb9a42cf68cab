"""mlslrun's command line -> RunConfig: flags, -H/hostfile parsing, rank environment (no MPI)."""

import os

import pytest

from mlsl_tf.runner.argv import build_parser, parse_args
from mlsl_tf.runner.config import EnvSpec, HostSlots, UsageError
from mlsl_tf.runner.hosts import allocate, parse_hostfile, parse_hosts
from mlsl_tf.runner.rank_env import (ENV_FLAGS, format_seconds, missing_env, parse_env_spec,
                                     resolve_env)


# ---------------------------------------------------------------- parse_args


def test_minimal_command_line():
    cfg = parse_args(["-np", "4", "python", "train.py", "--lr", "0.1"])
    assert cfg.num_proc == 4
    assert cfg.command == ("python", "train.py", "--lr", "0.1")
    assert cfg.hosts is None and cfg.hostfile is None
    assert cfg.env == () and cfg.mpi_args == () and cfg.flag_env == ()
    assert not cfg.verbose and cfg.output_filename is None and cfg.start_timeout is None
    assert cfg.launcher == "auto" and cfg.tag_output


def test_tag_output_can_be_turned_off():
    assert not parse_args(["-np", "2", "--no-tag-output", "python", "t.py"]).tag_output
    assert parse_args(["-np", "2", "--tag-output", "python", "t.py"]).tag_output


def test_long_num_proc_and_double_dash():
    cfg = parse_args(["--num-proc", "2", "--", "python", "-u", "x.py"])
    assert cfg.num_proc == 2 and cfg.command == ("python", "-u", "x.py")


def test_flags_after_the_command_belong_to_the_command():
    cfg = parse_args(["-np", "2", "python", "t.py", "-x", "1", "--verbose", "-np", "9"])
    assert cfg.num_proc == 2 and cfg.env == () and not cfg.verbose
    assert cfg.command == ("python", "t.py", "-x", "1", "--verbose", "-np", "9")


def test_all_flags():
    cfg = parse_args(["-np", "2", "-H", "a:1,b:1", "-x", "FOO", "-x", "BAR=1=2",
                      "--verbose", "--output-filename", "out", "--start-timeout", "2.5",
                      "--launcher", "mpi", "--mpi-args", "-l --foo 'a b'",
                      "python", "t.py"])
    assert cfg.hosts == (HostSlots("a", 1), HostSlots("b", 1))
    assert cfg.env == (EnvSpec("FOO", None), EnvSpec("BAR", "1=2"))
    assert cfg.verbose and cfg.output_filename == "out" and cfg.start_timeout == 2.5
    assert cfg.launcher == "mpi"
    assert cfg.mpi_args == ("-l", "--foo", "a b")


def test_mpi_args_equals_form():
    cfg = parse_args(["-np", "1", "--mpi-args=-bind-to core", "python"])
    assert cfg.mpi_args == ("-bind-to", "core")


def test_mpi_args_bad_quoting():
    with pytest.raises(UsageError, match="--mpi-args"):
        parse_args(["-np", "1", "--mpi-args", "'unclosed", "python"])


def test_unknown_flag():
    with pytest.raises(UsageError, match="--bogus"):
        parse_args(["-np", "2", "--bogus", "python", "t.py"])


def test_abbreviations_are_not_accepted():
    with pytest.raises(UsageError, match="--verb"):
        parse_args(["-np", "2", "--verb", "python"])


def test_missing_command():
    with pytest.raises(UsageError, match="missing the command"):
        parse_args(["-np", "2"])
    with pytest.raises(UsageError, match="missing the command"):
        parse_args(["-np", "2", "--"])


def test_missing_np():
    with pytest.raises(UsageError, match="-np N is required"):
        parse_args(["python", "t.py"])


@pytest.mark.parametrize("value", ["0", "-1"])
def test_np_must_be_positive(value):
    with pytest.raises(UsageError, match="-np must be at least 1"):
        parse_args(["-np", value, "python"])


def test_np_not_a_number():
    with pytest.raises(UsageError, match="-np"):
        parse_args(["-np", "two", "python"])


@pytest.mark.parametrize("value", ["0", "-3"])
def test_start_timeout_must_be_positive(value):
    with pytest.raises(UsageError, match="--start-timeout must be > 0"):
        parse_args(["-np", "1", "--start-timeout", value, "python"])


def test_bad_launcher_choice():
    with pytest.raises(UsageError, match="--launcher"):
        parse_args(["-np", "1", "--launcher", "ssh", "python"])


def test_hosts_and_hostfile_are_exclusive():
    with pytest.raises(UsageError, match="not allowed with"):
        parse_args(["-np", "1", "-H", "a:1", "--hostfile", "f", "python"])


def test_check_build_and_help_need_nothing_else():
    assert parse_args(["--check-build"]).check_build
    assert parse_args(["-cb"]).check_build
    assert parse_args(["-h"]).show_help
    assert parse_args(["--help"]).show_help


def test_help_text_lists_the_flags():
    text = build_parser().format_help()
    for flag in ["-np", "-H", "--hostfile", "-x", "--verbose", "--output-filename",
                 "--start-timeout", "--launcher", "--check-build", "--mpi-args"]:
        assert flag in text


def test_env_flags_name_declared_settings():
    import re
    settings = open(os.path.join(os.path.dirname(__file__), "..", "..", "ops", "core", "settings.cc")).read()
    declared = set(re.findall(r'"(MLSL_TF_[A-Z_]+)"', settings))
    assert {f.env_var for f in ENV_FLAGS} <= declared


# ---------------------------------------------------------------- hosts


def test_parse_hosts():
    assert parse_hosts("a:2,b:3") == (HostSlots("a", 2), HostSlots("b", 3))
    assert parse_hosts("node-1.example.com") == (HostSlots("node-1.example.com", 1),)


@pytest.mark.parametrize("text,problem", [
    ("a:2,,b:2", "empty host entry"),
    ("a:x", "slots for host 'a' must be an integer, got 'x'"),
    ("a:0", "slots for host 'a' must be >= 1, got 0"),
    ("a:-2", "must be >= 1"),
    ("a:2:3", "must be an integer, got '2:3'"),
    (":2", "bad host name ''"),
    ("a b:2", "bad host name 'a b'"),
    ("a:1,a:2", "host 'a' is listed more than once"),
])
def test_parse_hosts_errors(text, problem):
    with pytest.raises(UsageError) as e:
        parse_hosts(text)
    assert problem in str(e.value) and text in str(e.value)


def test_parse_hostfile_formats():
    text = "# cluster\n\nnode1 slots=4\nnode2:2   # comment\n  node3\n"
    assert parse_hostfile(text) == (HostSlots("node1", 4), HostSlots("node2", 2),
                                    HostSlots("node3", 1))


@pytest.mark.parametrize("text,problem", [
    ("a slots=4\nb slots=x\n",
     "hosts.txt line 2 ('b slots=x'): slots for host 'b' must be an integer"),
    ("a slots=0\n", "line 1 ('a slots=0'): slots for host 'a' must be >= 1"),
    ("a max_slots=4\n", "line 1 ('a max_slots=4'): expected 'host slots=N' or 'host:N'"),
    ("a slots=2 extra\n", "expected 'host slots=N'"),
    ("a:q\n", "must be an integer, got 'q'"),
    ("# nothing\n\n", "hosts.txt: no hosts found"),
    ("a slots=1\na:2\n", "host 'a' is listed more than once"),
])
def test_parse_hostfile_errors(text, problem):
    with pytest.raises(UsageError) as e:
        parse_hostfile(text, source="hosts.txt")
    assert problem in str(e.value)


def test_np_more_than_slots_is_an_error():
    with pytest.raises(UsageError, match=r"-np 5 is more than the 4 slots given by -H \(a:2,b:2\)"):
        parse_args(["-np", "5", "-H", "a:2,b:2", "python"])


def test_allocate_fills_hosts_in_order():
    hosts = (HostSlots("a", 2), HostSlots("b", 2), HostSlots("c", 2))
    assert allocate(3, hosts) == (HostSlots("a", 2), HostSlots("b", 1))
    assert allocate(6, hosts) == hosts
    assert allocate(1, hosts) == (HostSlots("a", 1),)


# ---------------------------------------------------------------- environment


def test_env_spec_forms():
    assert parse_env_spec("FOO") == EnvSpec("FOO", None)
    assert parse_env_spec("FOO=bar") == EnvSpec("FOO", "bar")
    assert parse_env_spec("FOO=") == EnvSpec("FOO", "")
    assert parse_env_spec("A_1=x=y") == EnvSpec("A_1", "x=y")


@pytest.mark.parametrize("text", ["", "=x", "1FOO=x", "FO-O", "A B=1"])
def test_env_spec_errors(text):
    with pytest.raises(UsageError, match="not a valid environment variable name"):
        parse_env_spec(text)


def test_resolve_env_passes_through_and_skips_unset():
    cfg = parse_args(["-np", "1", "-x", "HOME", "-x", "UNSET", "-x", "FOO=bar",
                      "-x", "HOME=/override", "--start-timeout", "30", "python"])
    environ = {"HOME": "/home/me"}
    assert resolve_env(cfg, environ) == (("HOME", "/override"), ("FOO", "bar"),
                                         ("MLSL_TF_START_TIMEOUT", "30"))
    assert missing_env(cfg, environ) == ("UNSET",)


def test_format_seconds():
    assert format_seconds(30.0) == "30"
    assert format_seconds(2.5) == "2.5"


def test_scheduler_flags_become_rank_environment():
    cfg = parse_args(["-np", "2", "--fusion-threshold-mb", "2", "--chunk-mb", "0.5", "--priority", "fifo",
                      "--comm-core", "0,1", "--timeline-filename", "/tmp/t.json", "--inflight", "3",
                      "--bind", "None", "python", "x.py"])
    env = dict(cfg.flag_env)
    assert env == {"MLSL_TF_FUSION_THRESHOLD": str(2 << 20), "MLSL_TF_CHUNK_BYTES": str(1 << 19),
                   "MLSL_TF_PRIORITY": "fifo", "MLSL_TF_COMM_CORE": "0,1", "MLSL_TF_TIMELINE": "/tmp/t.json",
                   "MLSL_TF_INFLIGHT": "3", "MLSL_TF_BIND": "none"}


def test_autotune_flags_become_rank_environment():
    """--autotune takes no value (the next word stays the command); its log, warm-up and sample
    flags take one each (horovodrun's names)."""
    cfg = parse_args(["-np", "3", "--autotune", "--autotune-log-file", "tune.csv", "--autotune-warmup-samples", "0",
                      "--autotune-steps-per-sample", "4", "python", "x.py"])
    assert dict(cfg.flag_env) == {"MLSL_TF_AUTOTUNE": "1", "MLSL_TF_AUTOTUNE_LOG": "tune.csv",
                                  "MLSL_TF_AUTOTUNE_WARMUP_SAMPLES": "0", "MLSL_TF_AUTOTUNE_STEPS_PER_SAMPLE": "4"}
    assert cfg.command == ("python", "x.py")
    cfg = parse_args(["-np", "2", "--autotune", "python", "x.py"])
    assert dict(cfg.flag_env) == {"MLSL_TF_AUTOTUNE": "1"} and cfg.command == ("python", "x.py")
    assert dict(parse_args(["-np", "2", "python", "x.py"]).flag_env) == {}  # off unless asked


@pytest.mark.parametrize("argv", [["--autotune-log-file", ""], ["--autotune-warmup-samples", "-1"],
                                  ["--autotune-steps-per-sample", "0"], ["--autotune-steps-per-sample", "x"],
                                  ["--autotune=1"]])
def test_autotune_flags_reject_bad_values(argv):
    with pytest.raises(ValueError):
        parse_args(["-np", "2", *argv, "python", "x.py"])


@pytest.mark.parametrize("flag,value", [("--priority", "lifo"), ("--comm-core", "a"), ("--chunk-mb", "-1"), ("--chunk-mb", "0"),
                                        ("--inflight", "0"), ("--bind", "core")])
def test_scheduler_flags_reject_bad_values(flag, value):
    with pytest.raises(ValueError):
        parse_args(["-np", "2", flag, value, "python", "x.py"])
