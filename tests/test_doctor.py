"""python -m trnlab doctor on bad settings: a [FAIL] line naming the variable, valid JSON, exit 1, no traceback."""

from __future__ import annotations

import json
import os

import pytest

from trnlab import doctor

BAD_SETTINGS = [
    ("TRNLAB_DTYPE", "float16"), ("TRNLAB_DTYPE", "bf16"),
    ("TRNLAB_CPU_THREADS", "two"), ("TRNLAB_CPU_THREADS", "-1"),
    ("TRNLAB_DEVICE", "banana"), ("TRNLAB_DTYPE", " "),  # blank: refused, as setup() and knob() refuse it
]


JSON_CASES = [BAD_SETTINGS[1], BAD_SETTINGS[3], BAD_SETTINGS[4]]


@pytest.fixture(scope="module")
def doctor_runs(trnlab_cli):
    """Every ``python -m trnlab doctor`` run of this file, by (variable, value, --json or not)."""
    cases = [(v, x, False) for v, x in BAD_SETTINGS] + [(v, x, True) for v, x in JSON_CASES]
    runs = trnlab_cli(*[(["doctor", "--json"] if json_out else ["doctor"], {v: x}) for v, x, json_out in cases])
    return dict(zip(cases, runs))


@pytest.mark.parametrize("variable, value", BAD_SETTINGS)
def test_doctor_reports_a_bad_setting_as_a_failed_check(doctor_runs, variable, value):
    table = doctor_runs[variable, value, False]
    assert table.returncode == 1, table.stderr
    assert "Traceback" not in table.stderr + table.stdout
    fail = [line.strip() for line in table.stdout.splitlines() if line.strip().startswith(f"[FAIL] {variable}:")]
    assert fail and fail[0].startswith(f"[FAIL] {variable}: {variable}={value!r}"), table.stdout
    assert f"fix {variable}" in table.stdout.splitlines()[-1]
    # the other checks still ran: the model's own state is reported, not hidden by the bad setting
    assert "[ok] model:" in table.stdout and "[ok] transformers:" in table.stdout


@pytest.mark.parametrize("variable, value", JSON_CASES)
def test_doctor_json_stays_json_on_a_bad_setting(doctor_runs, variable, value):
    done = doctor_runs[variable, value, True]
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)  # the whole stdout is one JSON document
    assert data["ok"] is False
    failed = [c for c in data["checks"] if not c["ok"]]
    assert [c["name"] for c in failed] == [variable]
    assert failed[0]["detail"].startswith(f"{variable}={value!r}")


def test_every_bad_setting_at_once_is_listed(monkeypatch):
    from trnlab import doctor
    from trnlab.doctor import device_report

    monkeypatch.setenv("TRNLAB_DTYPE", "fp16")
    monkeypatch.setenv("TRNLAB_CPU_THREADS", "many")
    monkeypatch.setenv("TRNLAB_DEVICE", "cpu")
    checks = doctor.run_checks(device_report())
    assert [c.name for c in checks if not c.ok] == ["TRNLAB_DTYPE", "TRNLAB_CPU_THREADS"]
    assert next(c for c in checks if c.name == "device").ok  # TRNLAB_DEVICE itself is fine
    monkeypatch.delenv("TRNLAB_DTYPE")
    monkeypatch.delenv("TRNLAB_CPU_THREADS")
    assert [c.name for c in doctor.run_checks(device_report())][:1] == ["device"]  # no settings line when fine


@pytest.mark.parametrize("installed, ok", [("1.12.0", False), ("1.13.0", True), ("1.16.0", True)])
def test_accelerate_before_1_13_fails_naming_multi_neuron(installed, ok):
    check = doctor._version_check("accelerate", installed)  # whatever the installed metadata still says
    assert (check.name, check.ok) == ("accelerate", ok)
    assert check.detail.startswith(f"{installed} (course needs >=1.13)")
    assert check.detail.endswith("" if ok else "1.13 is the first release with MULTI_NEURON, Accelerate's distributed "
                                 "type for Neuron (1.12 has no neuron code): pip install 'accelerate>=1.13'")
    assert doctor._version_check("accelerate", None).detail == "not installed: pip install 'accelerate>=1.13'"


# The Neuron checks: pure functions of a faked _Machine (versions, env, os-release, disk, device count).
from dataclasses import replace  # noqa: E402

from trnlab.doctor import DeviceReport  # noqa: E402

NATIVE = "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"
XLA_VENV = "/opt/aws_neuronx_venv_pytorch_2_9"
UBUNTU = 'PRETTY_NAME="Ubuntu {0} LTS"\nNAME="Ubuntu"\nVERSION_ID="{0}"\nID=ubuntu\n'
PLENTY, TIGHT = 400 * 2**30, 5 * 2**30
TRN2 = doctor._Machine(
    versions={"torch": "2.14.0", "torch-neuronx": "2.14.3.0", "torch-xla": None, "neuronx-cc": "2.24.0"},
    env={"VIRTUAL_ENV": NATIVE}, prefix=NATIVE, os_release=UBUNTU.format("24.04"), dev_neuron=True,
    disk={"NEFF cache": ("/tmp/neff_cache", "/tmp", PLENTY, 2**39),
          "debug folder": ("/tmp/neuron_backend", "/tmp", PLENTY, 2**39)}, devices=4)
CHECKS = [doctor._environment_check, doctor._family_check, doctor._compiler_check, doctor._ubuntu_check,
          doctor._disk_check, doctor._lnc_check]
INSTALL = ('"neuronx-cc==2.*" nki --extra-index-url https://pip.repos.neuron.amazonaws.com '
           "--extra-index-url https://download.pytorch.org/whl/cpu")  # the setup guide's line: no CUDA torch


def _with(**changes):
    versions = {**TRN2.versions, **changes.pop("versions", {})}
    return replace(TRN2, versions=versions, **changes)


def _fail(check, name):
    assert check is not None and not check.ok and check.name == name, check
    return check.detail


def test_no_neuron_check_applies_on_a_plain_cpu_machine():
    cpu = doctor._Machine(versions={"torch": "2.13.0+cpu", "torch-neuronx": None, "torch-xla": "2.9.0",
                                    "neuronx-cc": None}, env={"VIRTUAL_ENV": "/work/main/.venv"},
                          prefix="/work/main/.venv", os_release=UBUNTU.format("22.04"), disk=TRN2.disk)
    assert [check(cpu) for check in CHECKS] == [None] * 6  # torch-xla, 22.04 alone do not make it a trn
    gathered = doctor._Machine.gather(DeviceReport("cpu", 1, False, {}, {}, {}, {}, None))
    import torch
    assert gathered.versions["torch"] == torch.__version__ and gathered.devices == 0  # 0: the backend is cpu


def test_a_trn2_in_the_torchneuron_venv_passes_every_check():
    checks = [check(TRN2) for check in CHECKS]
    assert [(c.name, c.ok) for c in checks] == [("neuron environment", True), ("torch family", True),
                                                ("neuronx-cc", True), ("ubuntu", True), ("disk", True), ("LNC", True)]
    assert checks[0].detail == f"TorchNeuron (the native device): torch-neuronx 2.14.3.0 in {NATIVE}"
    assert checks[4].detail.startswith("NEFF cache /tmp/neff_cache: 400.0 GiB free of 512.0 GiB (at /tmp)")


@pytest.mark.parametrize("changes, sign", [
    ({"versions": {"torch-neuronx": "2.9.0.2.11.19912"}}, "torch-neuronx 2.9.0.2.11.19912 is not TorchNeuron (2.13.3.x or 2.14.3.x)"),
    ({"versions": {"torch-xla": "2.9.0"}}, "torch-xla 2.9.0 is installed"),
    ({"env": {"VIRTUAL_ENV": XLA_VENV}}, f"{XLA_VENV} is an XLA-based venv"),
    ({"prefix": XLA_VENV, "env": {}}, f"{XLA_VENV} is an XLA-based venv"),
])
def test_the_xla_based_environment_fails_and_says_which_venv_to_activate(changes, sign):
    detail = _fail(doctor._environment_check(_with(**changes)), "neuron environment")
    assert detail.startswith(sign + ": this is the XLA-based torch-neuronx, not the native neuron device")
    assert '"use the NeuronTrainer from optimum[neuron]"' in detail
    assert f"`source {NATIVE}/bin/activate`" in detail and '"Deep Learning AMI Neuron torch-neuronx 2.14.0"' in detail


def test_torchneuron_is_torch_s_minor_then_3_and_the_xla_based_package_is_not():
    versions = ["2.13.3.0", "2.14.3.1", "2.14.3", "2.14.3.0.1234", "2.15.3.0", "2.14.30.0", "2.14.0.2.12.0",
                "2.9.0.2.11.19912", "2.12.3.0", "1.0", "banana", None]
    assert [doctor._native(v) for v in versions] == [True] * 5 + [False] * 7
    later = _with(versions={"torch": "2.15.0", "torch-neuronx": "2.15.3.0"})  # a later family: not the XLA package
    assert doctor._environment_check(later).ok and doctor._family_check(later).ok
    detail = _fail(doctor._environment_check(_with(versions={"torch-neuronx": "1.0"})), "neuron environment")
    assert detail.startswith("torch-neuronx 1.0 is not TorchNeuron")  # the public index's placeholder


def test_a_trn_without_torch_neuronx_fails_with_the_venv_and_the_install_line():
    detail = _fail(doctor._environment_check(_with(versions={"torch-neuronx": None})), "neuron environment")
    assert detail.startswith("torch-neuronx is not installed: activate TorchNeuron's venv")
    assert detail.endswith(f'pip install --upgrade "torch-neuronx==2.14.*" {INSTALL}')


@pytest.mark.parametrize("torch, neuronx, fix", [
    ("2.13.0", "2.14.3.0", f'pip install --upgrade "torch-neuronx==2.13.*" {INSTALL}'),
    ("2.14.0+cpu", "2.13.3.1", f'pip install --upgrade "torch-neuronx==2.14.*" {INSTALL}'),
    ("2.12.1", "2.14.3.0", f"TorchNeuron exists for torch 2.13.0 and 2.14.0 only: activate TorchNeuron's venv"),
])
def test_torch_and_torch_neuronx_from_different_families_fail(torch, neuronx, fix):
    detail = _fail(doctor._family_check(_with(versions={"torch": torch, "torch-neuronx": neuronx})), "torch family")
    assert detail.startswith(f"torch {torch} with torch-neuronx {neuronx}, which needs torch {neuronx[:4]}.0: {fix}")
    assert doctor._family_check(_with(versions={"torch": "2.13.0+cpu", "torch-neuronx": "2.13.3.1"})).ok


@pytest.mark.parametrize("torch, family", [("2.14.0", "2.14"), ("2.13.0", "2.13")])
def test_a_missing_compiler_fails_with_the_install_line_of_this_torch(torch, family):
    detail = _fail(doctor._compiler_check(_with(versions={"torch": torch, "neuronx-cc": None})), "neuronx-cc")
    assert detail == ("the Neuron compiler, which turns graphs into NEFFs, is not installed, so nothing compiles: "
                      f'pip install --upgrade "torch-neuronx=={family}.*" {INSTALL}')
    assert doctor._compiler_check(_with(versions={"neuronx-cc": "on PATH"})).ok
    assert doctor._compiler_check(_with(versions={"torch-neuronx": None})) is None  # no torch-neuronx: not asked


@pytest.mark.parametrize("release, ok", [("24.04", True), ("26.04", True), ("22.04", False), ("20.04", False)])
def test_the_ubuntu_release_against_the_wheels_and_dlamis(release, ok):
    check = doctor._ubuntu_check(_with(os_release=UBUNTU.format(release), versions={"torch-neuronx": None}))
    assert check.name == "ubuntu" and check.ok is ok
    assert check.detail.startswith(f"Ubuntu {release} LTS: the 2.33.0 wheels are for Ubuntu 26.04 only (22.04 and "
                                   "24.04 wheels were announced for the next release, not confirmed for 2.34: see its "
                                   "release notes), TorchNeuron's DLAMIs for Ubuntu 24.04 and 26.04; the Neuron docs "
                                   "mark Ubuntu 22.04 end of support")
    if not ok:
        assert "move to the DLAMI on Ubuntu 24.04 or 26.04" in check.detail
        assert check.detail.endswith(", or build torch-neuronx from source where your release has no wheel for it") is (
            release == "22.04")
    built = doctor._ubuntu_check(_with(os_release=UBUNTU.format("22.04")))  # TorchNeuron built from source
    assert built.ok
    assert doctor._ubuntu_check(_with(os_release='PRETTY_NAME="Amazon Linux 2023"\nID="amzn"\n')).ok
    assert doctor._ubuntu_check(_with(os_release="")) is None


def test_little_free_disk_under_the_caches_fails_with_the_fix():
    disk = {**TRN2.disk, "debug folder": ("/data/debug", "/", TIGHT, 2**37)}
    detail = _fail(doctor._disk_check(_with(disk=disk)), "disk")
    assert "debug folder /data/debug: 5.0 GiB free of 128.0 GiB (at /)" in detail
    assert "under trnlab's threshold of 20 GiB free" in detail and "at least 512 GB" in detail
    assert detail.endswith("grow the volume, or point TORCH_NEURONX_NEFF_CACHE_DIR and TORCH_NEURONX_DEBUG_DIR "
                           "at a larger disk")


def test_the_disk_is_measured_on_the_nearest_existing_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "not" / "yet"))
    monkeypatch.delenv("TORCH_NEURONX_DEBUG_DIR", raising=False)
    disk = doctor._Machine.gather(DeviceReport("cpu", 1, False, {}, {}, {}, {}, None)).disk
    folder, at, free, total = disk["NEFF cache"]
    assert (folder, at) == (str(tmp_path / "not" / "yet"), str(tmp_path)) and 0 < free <= total
    assert disk["debug folder"][0] == "/tmp/neuron_backend"


@pytest.mark.parametrize("lnc, devices, shows", [(None, 4, "LNC=2 (default)"), ("2", 4, "LNC=2"), ("1", 8, "LNC=1")])
def test_lnc_and_device_count_are_reported(lnc, devices, shows):
    env = {"NEURON_LOGICAL_NC_CONFIG": lnc} if lnc else {}
    check = doctor._lnc_check(_with(env=env, devices=devices))
    per_chip = 8 // int(lnc or 2)
    assert check.ok and check.detail == (
        f"{shows}: device_count() is {devices}; at LNC={lnc or 2} a Trainium2 chip shows {per_chip} logical cores "
        f"({lnc or 2} physical NeuronCore-v3 each), a trn2.3xlarge {per_chip}")
    visible = doctor._lnc_check(_with(env={**env, "NEURON_RT_VISIBLE_CORES": "0-1"}, devices=2))
    assert visible.detail.endswith("; NEURON_RT_VISIBLE_CORES=0-1 limits this process to those cores")


@pytest.mark.parametrize("value", ["3", "0", "auto"])
def test_an_invalid_lnc_fails_even_off_neuron(value):
    fix = "unset NEURON_LOGICAL_NC_CONFIG or set it to 1 or 2"
    assert _fail(doctor._lnc_check(_with(env={"NEURON_LOGICAL_NC_CONFIG": value})), "LNC").endswith(fix)
    off = doctor._Machine(versions={}, env={"NEURON_LOGICAL_NC_CONFIG": value})
    assert _fail(doctor._lnc_check(off), "LNC").startswith(f"NEURON_LOGICAL_NC_CONFIG={value!r}: only 1 or 2 exist")


def test_the_report_of_a_trn2_in_the_xla_venv(monkeypatch):
    for variable in [v for v in os.environ if v.startswith("TRNLAB_")]:
        monkeypatch.delenv(variable)
    # In the XLA venv torch has no native neuron device: the course would silently run on CPU.
    report = DeviceReport("cpu", 1, False, {"neuron": False, "cuda": False, "cpu": True},
                          {"torch": "2.9.0", "transformers": "5.24.0", "accelerate": "1.15.0",
                           "torch-neuronx": "2.9.0.2.11.19912", "trnlab": "0.1.0"},
                          {"NEURON_RT_VISIBLE_CORES": None}, {"path": "/tmp/neff_cache", "exists": False}, None)
    machine = _with(versions={"torch": "2.9.0", "torch-neuronx": "2.9.0.2.11.19912", "torch-xla": "2.9.0",
                              "neuronx-cc": "2.21.0"}, env={"VIRTUAL_ENV": XLA_VENV}, prefix=XLA_VENV, devices=0)
    lines = doctor._format_report(report, doctor.run_checks(report, machine)).splitlines()
    fails = [line.strip() for line in lines if "[FAIL]" in line]
    assert fails == [f"[FAIL] neuron environment: torch-neuronx 2.9.0.2.11.19912 is not TorchNeuron (2.13.3.x or "
                     f"2.14.3.x); torch-xla 2.9.0 is installed; {XLA_VENV} is an XLA-based venv: this is the "
                     "XLA-based torch-neuronx, not the native neuron device (the symptom: under torchrun Transformers "
                     "warns to \"use the NeuronTrainer from optimum[neuron]\"): activate TorchNeuron's venv: "
                     f"`source {NATIVE}/bin/activate` (the DLAMI \"Deep Learning AMI Neuron torch-neuronx 2.14.0\")"]
    assert "  [ok] LNC: LNC=2 (default): device_count() is 0;" in "\n".join(lines)
    assert [line.split(":")[0].strip() for line in lines if line.startswith("  [")][-5:] == [
        "[FAIL] neuron environment", "[ok] neuronx-cc", "[ok] ubuntu", "[ok] disk", "[ok] LNC"]
    assert lines[-1] == "The course cannot run here: fix neuron environment."
