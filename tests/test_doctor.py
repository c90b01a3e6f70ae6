"""python -m trnlab doctor on bad settings: a [FAIL] line naming the variable, valid JSON, exit 1, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BAD_SETTINGS = [
    ("TRNLAB_DTYPE", "float16"), ("TRNLAB_DTYPE", "bf16"),
    ("TRNLAB_CPU_THREADS", "two"), ("TRNLAB_CPU_THREADS", "-1"),
    ("TRNLAB_DEVICE", "banana"),
]


def _doctor(*args, env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRNLAB_")}
    return subprocess.run([sys.executable, "-m", "trnlab", "doctor", *args], capture_output=True, text=True,
                          env={**clean, **env}, timeout=300)


@pytest.mark.parametrize("variable, value", BAD_SETTINGS)
def test_doctor_reports_a_bad_setting_as_a_failed_check(variable, value):
    table = _doctor(env={variable: value})
    assert table.returncode == 1, table.stderr
    assert "Traceback" not in table.stderr + table.stdout
    fail = [line.strip() for line in table.stdout.splitlines() if line.strip().startswith(f"[FAIL] {variable}:")]
    assert fail and fail[0].startswith(f"[FAIL] {variable}: {variable}={value!r}"), table.stdout
    assert f"fix {variable}" in table.stdout.splitlines()[-1]
    # the other checks still ran: the model's own state is reported, not hidden by the bad setting
    assert "[ok] model:" in table.stdout and "[ok] transformers:" in table.stdout


@pytest.mark.parametrize("variable, value", [BAD_SETTINGS[1], BAD_SETTINGS[3], BAD_SETTINGS[4]])
def test_doctor_json_stays_json_on_a_bad_setting(variable, value):
    done = _doctor("--json", env={variable: value})
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)  # the whole stdout is one JSON document
    assert data["ok"] is False
    failed = [c for c in data["checks"] if not c["ok"]]
    assert [c["name"] for c in failed] == [variable]
    assert failed[0]["detail"].startswith(f"{variable}={value!r}")


def test_every_bad_setting_at_once_is_listed(monkeypatch):
    from trnlab import doctor
    from trnlab.device import device_report

    monkeypatch.setenv("TRNLAB_DTYPE", "fp16")
    monkeypatch.setenv("TRNLAB_CPU_THREADS", "many")
    monkeypatch.setenv("TRNLAB_DEVICE", "cpu")
    checks = doctor.run_checks(device_report())
    assert [c.name for c in checks if not c.ok] == ["TRNLAB_DTYPE", "TRNLAB_CPU_THREADS"]
    assert next(c for c in checks if c.name == "device").ok  # TRNLAB_DEVICE itself is fine
    monkeypatch.delenv("TRNLAB_DTYPE")
    monkeypatch.delenv("TRNLAB_CPU_THREADS")
    assert [c.name for c in doctor.run_checks(device_report())][:1] == ["device"]  # no settings line when fine
