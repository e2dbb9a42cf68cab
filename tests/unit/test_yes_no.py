"""_library.yes_no, the one reader of a yes/no setting's words (cpu_placement.py, overlap.py and groups.py
use it), and its words against the library's table, which init() checks values with."""

import pytest

from mlsl_tf import _library, cpu_placement, groups, overlap


@pytest.mark.parametrize("value", ["1", "true", "on", "yes", "TRUE", " On ", "Yes\n"])
def test_yes_words(value):
    assert _library.yes_no("MLSL_TF_X", value) is True


@pytest.mark.parametrize("value", ["0", "false", "off", "no", "FALSE", " Off ", "No\t"])
def test_no_words(value):
    assert _library.yes_no("MLSL_TF_X", value) is False


@pytest.mark.parametrize("value", ["", "2", "y", "n", "enable", "onn", "1 0", "-1"])
def test_other_values_are_an_error_naming_setting_and_value(value):
    with pytest.raises(ValueError) as e:
        _library.yes_no("MLSL_TF_X", value, yes="fast", no="slow")
    assert str(e.value).startswith(f"MLSL_TF_X={value!r}: expected 1 (fast) or 0 (slow)")


def test_the_words_are_the_library_tables():
    """Every setting the table checks as yes/no allows exactly these words, so a value init()
    accepted is one yes_no reads, and the three Python readers' settings are such settings."""
    words = set(_library.YES_WORDS + _library.NO_WORDS)
    yes_no_settings = {name for name, s in _library.settings().items()
                       if s.allowed.startswith("one of ") and set(s.allowed[7:].split(", ")) == words}
    assert {cpu_placement.SPINNING, overlap.SETTING, "MLSL_TF_DYNAMIC_PROCESS_SETS"} <= yes_no_settings


def test_the_three_readers_use_it(monkeypatch):
    assert cpu_placement.spinning("YES") is True and cpu_placement.spinning(None) is False
    with pytest.raises(ValueError, match=r"MLSL_TF_THREAD_SPINNING='sometimes': expected 1 \(TensorFlow"):
        cpu_placement.spinning("sometimes")
    monkeypatch.setenv(overlap.SETTING, "Off")
    assert overlap.enabled() is False
    monkeypatch.setenv(overlap.SETTING, "maybe")
    with pytest.raises(ValueError, match="MLSL_TF_CROSS_ITERATION='maybe'"):
        overlap.enabled()
    monkeypatch.setenv("MLSL_TF_DYNAMIC_PROCESS_SETS", "no")
    assert groups.dynamic_process_sets() is False
    monkeypatch.setenv("MLSL_TF_DYNAMIC_PROCESS_SETS", " ON")
    assert groups.dynamic_process_sets() is True
    monkeypatch.delenv("MLSL_TF_DYNAMIC_PROCESS_SETS")
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "false")  # Horovod's name, read by settings()
    assert groups.dynamic_process_sets() is False
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "sometimes")
    with pytest.raises(ValueError, match="MLSL_TF_DYNAMIC_PROCESS_SETS='sometimes'"):
        groups.dynamic_process_sets()
