"""trnlab.settings: every TRNLAB_* variable is checked where it is read, naming the variable and the fix."""

from __future__ import annotations

import pytest

from trnlab.settings import SettingError, read_setting, read_settings, setting_problems


def test_defaults_when_nothing_is_set():
    settings = read_settings({})
    assert settings.as_dict() == {"model": None, "device": "auto", "dtype": "auto", "cpu_threads": 1}


@pytest.mark.parametrize("value, expected", [
    ("auto", "auto"), ("cpu", "cpu"), ("neuron", "neuron"), ("NEURON:3", "neuron:3"), (" cuda:0 ", "cuda:0"),
    ("", "auto"),
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
    assert setting_problems({variable: value}).keys() == {variable}


def test_each_variable_is_checked_on_its_own():
    env = {"TRNLAB_DEVICE": "banana", "TRNLAB_DTYPE": "bf16", "TRNLAB_CPU_THREADS": "2"}
    assert sorted(setting_problems(env)) == ["TRNLAB_DEVICE", "TRNLAB_DTYPE"]
    assert read_setting("TRNLAB_CPU_THREADS", env) == 2  # a bad neighbour does not hide a good value
    assert read_setting("TRNLAB_MODEL", env) is None
    assert setting_problems({}) == {}
    with pytest.raises(KeyError, match="not a course setting"):
        read_setting("TRNLAB_NOPE", env)
