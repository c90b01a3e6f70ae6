"""trnlab.settings: every TRNLAB_* variable is checked where it is read, naming the variable and the fix."""

from __future__ import annotations

import re

import pytest

from trnlab.settings import SettingError, _read_settings as read_settings, _read_setting, _setting_problems


def test_defaults_when_nothing_is_set():
    settings = read_settings({})
    assert settings._asdict() == {"model": None, "device": "auto", "dtype": "auto", "cpu_threads": 1}


@pytest.mark.parametrize("value, expected", [
    ("auto", "auto"), ("cpu", "cpu"), ("neuron", "neuron"), ("NEURON:3", "neuron:3"), (" cuda:0 ", "cuda:0"),
])
def test_device_accepts_the_documented_forms(value, expected):
    assert read_settings({"TRNLAB_DEVICE": value}).device == expected


@pytest.mark.parametrize("value", ["banana", "neuron:x", "cuda:", "gpu", "neuron:-1", "tpu:0"])
def test_a_bad_device_fails_in_read_settings_naming_the_variable_and_the_forms(value):
    with pytest.raises(SettingError) as info:
        read_settings({"TRNLAB_DEVICE": value})
    message = str(info.value)
    assert message.startswith(f"TRNLAB_DEVICE={value!r} is not a device")
    assert "auto, neuron, cuda, cpu" in message and "neuron:3" in message


@pytest.mark.parametrize("variable, value, fix", [
    ("TRNLAB_DTYPE", "float16", "choose one of auto, float32, bfloat16"),
    ("TRNLAB_DTYPE", "bf16", "choose one of auto, float32, bfloat16"),
    ("TRNLAB_CPU_THREADS", "two", "give a whole number of threads >= 0"),
    ("TRNLAB_CPU_THREADS", "-1", "give a whole number of threads >= 0"),
])
def test_bad_dtype_and_threads_name_the_variable(variable, value, fix):
    with pytest.raises(SettingError, match=f"^{variable}='{value}'.*{fix}"):
        read_settings({variable: value})
    assert _setting_problems({variable: value}).keys() == {variable}


def test_each_variable_is_checked_on_its_own():
    env = {"TRNLAB_DEVICE": "banana", "TRNLAB_DTYPE": "bf16", "TRNLAB_CPU_THREADS": "2"}
    assert sorted(_setting_problems(env)) == ["TRNLAB_DEVICE", "TRNLAB_DTYPE"]
    assert _read_setting("TRNLAB_CPU_THREADS", env) == 2  # a bad neighbour does not hide a good value
    assert _read_setting("TRNLAB_MODEL", env) is None
    assert _setting_problems({}) == {}
    with pytest.raises(KeyError, match="not a course setting"):
        _read_setting("TRNLAB_NOPE", env)


def test_environment_sets_and_unsets_in_a_block_and_restores_only_those(monkeypatch):
    import os

    from trnlab.settings import _environment

    monkeypatch.setenv("TRNLAB_TEST_KEPT", "before")
    monkeypatch.delenv("TRNLAB_TEST_NEW", raising=False)
    monkeypatch.delenv("TRNLAB_TEST_SET_INSIDE", raising=False)
    with _environment(TRNLAB_TEST_NEW="1", TRNLAB_TEST_KEPT=None):
        assert os.environ["TRNLAB_TEST_NEW"] == "1" and "TRNLAB_TEST_KEPT" not in os.environ
        os.environ["TRNLAB_TEST_SET_INSIDE"] = "stays"  # e.g. Accelerate's RANK: not ours to undo
    assert os.environ["TRNLAB_TEST_KEPT"] == "before" and "TRNLAB_TEST_NEW" not in os.environ
    assert os.environ["TRNLAB_TEST_SET_INSIDE"] == "stays"
    with pytest.raises(KeyError):
        with _environment(TRNLAB_TEST_KEPT="during"):
            raise KeyError("restored after an error too")
    assert os.environ["TRNLAB_TEST_KEPT"] == "before"


def test_quiet_transformers_silences_logs_and_bars_only_inside():
    from transformers.utils import logging

    from trnlab.settings import quiet_transformers

    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    with quiet_transformers(hide_progress_bars=True):
        assert logging.get_verbosity() == logging.ERROR and not logging.is_progress_bar_enabled()
    assert logging.get_verbosity() == level and logging.is_progress_bar_enabled() == bars
    with quiet_transformers(logs=False, hide_progress_bars=True):
        assert logging.get_verbosity() == level
    with quiet_transformers():
        assert logging.is_progress_bar_enabled() == bars
    assert logging.get_verbosity() == level


def test_progress_bars_toggle_lives_in_settings():
    from transformers.utils import logging

    from trnlab import settings

    assert "progress_bars" in settings.__all__
    bars = logging.is_progress_bar_enabled()
    try:
        for before in (True, False):
            (logging.enable_progress_bar if before else logging.disable_progress_bar)()
            for enabled in (True, False):
                with settings.progress_bars(enabled):
                    assert logging.is_progress_bar_enabled() == enabled
                assert logging.is_progress_bar_enabled() == before
            with settings.quiet_transformers(hide_progress_bars=True):
                assert not logging.is_progress_bar_enabled()
            assert logging.is_progress_bar_enabled() == before
    finally:
        (logging.enable_progress_bar if bars else logging.disable_progress_bar)()


def test_the_default_instance_is_a_course_default():
    from trnlab import settings

    assert settings._DEFAULT_INSTANCE == "trn2.48xlarge"


def test_knob_converts_to_the_default_s_type_and_falls_back_to_it():
    from trnlab.settings import knob

    env = {"TRNLAB_MAX_NEW_TOKENS": " 40 ", "TRNLAB_LEARNING_RATE": "1e-4", "TRNLAB_OUTPUT_DIR": "/tmp/out",
           "TRNLAB_QUICK": "True"}
    assert knob("TRNLAB_MAX_NEW_TOKENS", 20, env) == 40 and type(knob("TRNLAB_MAX_NEW_TOKENS", 20, env)) is int
    assert knob("TRNLAB_LEARNING_RATE", 2e-3, env) == 1e-4
    assert knob("TRNLAB_OUTPUT_DIR", None, env) == "/tmp/out" and knob("TRNLAB_NOT_SET", None, env) is None
    assert knob("TRNLAB_QUICK", False, env) is True
    assert knob("TRNLAB_NOT_SET", 12, env) == 12 and knob("TRNLAB_NOT_SET", "auto", env) == "auto"
    assert knob("TRNLAB_DEVICE", "auto", {"TRNLAB_DEVICE": "Neuron:3"}) == "neuron:3"  # the setting's own check


def test_knob_names_the_variable_and_the_form_on_a_bad_value():
    from trnlab.settings import SettingError, knob

    with pytest.raises(SettingError, match=r"TRNLAB_MAX_NEW_TOKENS='twenty' is not a whole number: give a whole "
                                           r"number \(e.g. TRNLAB_MAX_NEW_TOKENS=20, the default\)"):
        knob("TRNLAB_MAX_NEW_TOKENS", 20, {"TRNLAB_MAX_NEW_TOKENS": "twenty"})
    with pytest.raises(SettingError, match=r"TRNLAB_LEARNING_RATE='fast' is not a number"):
        knob("TRNLAB_LEARNING_RATE", 2e-3, {"TRNLAB_LEARNING_RATE": "fast"})
    with pytest.raises(SettingError, match=r"TRNLAB_QUICK='maybe' is not 1, 0, true or false"):
        knob("TRNLAB_QUICK", False, {"TRNLAB_QUICK": "maybe"})
    with pytest.raises(SettingError, match=r"TRNLAB_DTYPE='float16' is not a dtype the course uses"):
        knob("TRNLAB_DTYPE", "auto", {"TRNLAB_DTYPE": "float16"})
    with pytest.raises(TypeError, match="default must be an int, float, bool, str or None"):
        knob("TRNLAB_SIZES", (1, 2), {"TRNLAB_SIZES": "3"})


@pytest.mark.parametrize("blank", ["", " ", "\t"])
@pytest.mark.parametrize("variable, default", [("TRNLAB_MODEL", None), ("TRNLAB_DEVICE", "auto"),
                                               ("TRNLAB_DTYPE", "auto"), ("TRNLAB_CPU_THREADS", 1),
                                               ("TRNLAB_MAX_NEW_TOKENS", 20), ("TRNLAB_OUTPUT_DIR", None)])
def test_a_blank_value_is_refused_everywhere_naming_the_variable_and_the_fix(variable, default, blank):
    from trnlab.settings import _READERS, knob

    fix = "^" + re.escape(f"{variable}={blank!r} is blank: unset it for the default (`unset {variable}`), or give it "
                          "a value") + "$"
    env = {variable: blank}
    with pytest.raises(SettingError, match=fix):
        knob(variable, default, env)  # a notebook's parameter cell
    if variable in _READERS:  # setup(), pick_device(), model_name() and doctor read the course settings
        with pytest.raises(SettingError, match=fix):
            read_settings(env)
        assert list(_setting_problems(env)) == [variable]  # doctor's [FAIL] line
    assert knob(variable, default, {}) == default  # unset: the default


def test_a_blank_stand_in_setting_warns_as_a_bad_one_does(monkeypatch):
    from trnlab import _standin_entry

    monkeypatch.setenv("TRNLAB_NEURON_STANDIN", " ")
    with pytest.warns(RuntimeWarning, match=r"TRNLAB_NEURON_STANDIN=' ': set it to 1 to start the stand-in, or 0"):
        _standin_entry.autoload()  # it runs inside `import torch`, so it warns rather than raises
    monkeypatch.setenv("TRNLAB_NEURON_STANDIN", "0")
    _standin_entry.autoload()  # off, silently
