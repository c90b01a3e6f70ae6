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
from pathlib import Path  # noqa: E402

from trnlab.doctor import DeviceReport  # noqa: E402

NATIVE = "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"
XLA_VENV = "/opt/aws_neuronx_venv_pytorch_2_9"
UBUNTU = 'PRETTY_NAME="Ubuntu {0} LTS"\nNAME="Ubuntu"\nVERSION_ID="{0}"\nID=ubuntu\n'
PLENTY, TIGHT, GIB = 400 * 2**30, 5 * 2**30, 2**30
TRN2 = doctor._Machine(  # a trn2.48xlarge in the DLAMI's TorchNeuron venv, as doctor's checks see it
    versions={"torch": "2.14.0", "torch-neuronx": "2.14.3.0", "torch-xla": None, "neuronx-cc": "2.24.0"},
    env={"VIRTUAL_ENV": NATIVE}, prefix=NATIVE, os_release=UBUNTU.format("24.04"), dev_neuron=True,
    disk={"NEFF cache": ("/tmp/neff_cache", "/tmp", PLENTY, 2**39, "ext4"),
          "debug folder": ("/tmp/neuron_backend", "/tmp", PLENTY, 2**39, "ext4"),
          "root volume": ("/", "/", PLENTY, 2**39, "ext4")}, devices=64, python=(3, 12), torch_neuron=True,
    privateuse1="neuron", neuron_ls={"instance_type": "trn2.48xlarge", "lnc": 2, "cores": [4] * 16, "holders": []},
    memory=(1800 * GIB, 2000 * GIB), weights=("Qwen/Qwen3-8B", 16 * GIB), oom_kills=[])
CHECKS = [doctor._environment_check, doctor._family_check, doctor._python_check, doctor._autoload_check,
          doctor._compiler_check, doctor._ubuntu_check, doctor._disk_check, doctor._memory_check, doctor._lnc_check,
          doctor._compiler_lnc_check, doctor._device_count_check, doctor._torchrun_check, doctor._cores_check]
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
    assert [check(cpu) for check in CHECKS] == [None] * len(CHECKS)  # torch-xla, 22.04 alone do not make it a trn
    gathered = doctor._Machine.gather(DeviceReport("cpu", 1, False, {}, {}, {}, {}, None))
    import torch
    assert gathered.versions["torch"] == torch.__version__ and gathered.devices == 0  # 0: the backend is cpu


def test_a_trn2_in_the_torchneuron_venv_passes_every_check():
    checks = [check(TRN2) for check in CHECKS]
    assert [(c.name, c.ok) for c in checks if c] == [
        ("neuron environment", True), ("torch family", True), ("python", True), ("torch.neuron", True),
        ("neuronx-cc", True), ("ubuntu", True), ("disk", True), ("host memory", True), ("LNC", True),
        ("device count", True), ("neuron cores", True)]
    assert checks[0].detail == f"TorchNeuron (the native device): torch-neuronx 2.14.3.0 in {NATIVE}"
    assert checks[6].detail.startswith("NEFF cache /tmp/neff_cache: 400.0 GiB free of 512.0 GiB (at /tmp)")
    assert checks[10].detail == ("device_count() is 64 (every core); neuron-ls: trn2.48xlarge, 16 devices, 64 logical "
                                 "NeuronCores at logical-neuroncore-config 2 (16 chips x 8 physical / 2: 64)")


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
    assert detail.endswith(f'pip install --upgrade "torch==2.14.0" "torch-neuronx==2.14.*" {INSTALL}')


@pytest.mark.parametrize("torch, neuronx, fix", [
    ("2.13.0", "2.14.3.0", f'pip install --upgrade "torch==2.13.0" "torch-neuronx==2.13.*" {INSTALL}'),
    ("2.14.0+cpu", "2.13.3.1", f'pip install --upgrade "torch==2.14.0" "torch-neuronx==2.14.*" {INSTALL}'),
    ("2.12.1", "2.14.3.0", f"TorchNeuron exists for torch 2.13.0 and 2.14.0 only: activate TorchNeuron's venv"),
])
def test_torch_and_torch_neuronx_from_different_families_fail(torch, neuronx, fix):
    detail = _fail(doctor._family_check(_with(versions={"torch": torch, "torch-neuronx": neuronx})), "torch family")
    assert detail.startswith(f"torch {torch} with torch-neuronx {neuronx}, which needs torch {neuronx[:4]}.0: {fix}")
    assert doctor._family_check(_with(versions={"torch": "2.13.0+cpu", "torch-neuronx": "2.13.3.1"})).ok


@pytest.mark.parametrize("torch, neuronx, said", [("2.14.0", "2.14.3.0", True), ("2.13.0", "2.13.3.0", True),
                                                  ("2.14.0", "2.14.3.1", False), ("2.13.0", "2.13.3.2", False)])
def test_a_torch_neuronx_before_2_34_passes_and_says_the_memory_figures_may_be_wrong(torch, neuronx, said):
    check = doctor._family_check(_with(versions={"torch": torch, "torch-neuronx": neuronx}))
    assert check.ok and check.detail.startswith(f"torch {torch} with torch-neuronx {neuronx}")
    assert ("memory functions work on Neuron from torch-neuronx 2.13.3.1 / 2.14.3.1" in check.detail) is said


@pytest.mark.parametrize("torch, family", [("2.14.0", "2.14"), ("2.13.0", "2.13")])
def test_a_missing_compiler_fails_with_the_install_line_of_this_torch(torch, family):
    detail = _fail(doctor._compiler_check(_with(versions={"torch": torch, "neuronx-cc": None})), "neuronx-cc")
    assert detail == ("the Neuron compiler, which turns graphs into NEFFs, is not installed, so nothing compiles: "
                      f'pip install --upgrade "torch=={family}.0" "torch-neuronx=={family}.*" {INSTALL}')
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
    disk = {**TRN2.disk, "debug folder": ("/data/debug", "/", TIGHT, 2**37, "ext4")}
    detail = _fail(doctor._disk_check(_with(disk=disk)), "disk")
    assert "debug folder /data/debug: 5.0 GiB free of 128.0 GiB (at /)" in detail
    assert "under trnlab's threshold of 20 GiB free" in detail
    assert detail.endswith("grow the volume, or point TORCH_NEURONX_NEFF_CACHE_DIR and TORCH_NEURONX_DEBUG_DIR "
                           "at a larger disk")


def test_a_root_volume_under_512_gb_fails_though_it_has_room_left():
    small = {**TRN2.disk, "root volume": ("/", "/", 150 * 10**9, 200 * 10**9, "ext4")}
    detail = _fail(doctor._disk_check(_with(disk=small)), "disk")
    assert detail.endswith("the root volume is 200 GB (186.3 GiB), and trn2/trn3 need a root EBS volume of at least "
                           "512 GB (Neuron setup guide): grow it")
    assert "threshold" not in detail  # 150 GB free is plenty: only the size is wrong
    assert doctor._disk_check(_with(disk={**small, "root volume": ("/", "/", 1, 512 * 10**9, "ext4")})).ok


def test_caches_on_tmpfs_fail_with_the_folder_to_use_instead():
    disk = {**TRN2.disk, "NEFF cache": ("/tmp/neff_cache", "/tmp", PLENTY, 2**39, "tmpfs")}
    detail = _fail(doctor._disk_check(_with(disk=disk)), "disk")
    assert "NEFF cache /tmp/neff_cache: 400.0 GiB free of 512.0 GiB (at /tmp, tmpfs: in memory)" in detail
    assert detail.endswith("NEFF cache on tmpfs, which lives in host memory: gone at each reboot, and taken from the "
                           "memory compiling needs: point TORCH_NEURONX_NEFF_CACHE_DIR and TORCH_NEURONX_DEBUG_DIR "
                           "at a folder on disk")
    assert doctor._filesystem("/proc") == "proc" and doctor._filesystem("/proc/self") == "proc"


def test_the_disk_is_measured_on_the_nearest_existing_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "not" / "yet"))
    monkeypatch.delenv("TORCH_NEURONX_DEBUG_DIR", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", raising=False)
    disk = doctor._Machine.gather(DeviceReport("cpu", 1, False, {}, {}, {}, {}, None)).disk
    folder, at, free, total, _ = disk["NEFF cache"]
    assert (folder, at) == (str(tmp_path / "not" / "yet"), str(tmp_path)) and 0 < free <= total
    assert disk["debug folder"][0] == "/tmp/neuron_backend" and disk["root volume"][:2] == ("/", "/")
    assert "local NEFF cache" not in disk  # no default: listed only where it is set
    monkeypatch.setenv("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", str(tmp_path / "local"))
    assert doctor._disk()["local NEFF cache"][:2] == (str(tmp_path / "local"), str(tmp_path))


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
                              "neuronx-cc": "2.21.0"}, env={"VIRTUAL_ENV": XLA_VENV}, prefix=XLA_VENV, devices=0,
                    torch_neuron=False, privateuse1="privateuseone")
    lines = doctor._format_report(report, doctor.run_checks(report, machine)).splitlines()
    fails = [line.strip() for line in lines if "[FAIL]" in line]
    assert fails == [f"[FAIL] neuron environment: torch-neuronx 2.9.0.2.11.19912 is not TorchNeuron (2.13.3.x or "
                     f"2.14.3.x); torch-xla 2.9.0 is installed; {XLA_VENV} is an XLA-based venv: this is the "
                     "XLA-based torch-neuronx, not the native neuron device (the symptom: under torchrun Transformers "
                     "warns to \"use the NeuronTrainer from optimum[neuron]\"): activate TorchNeuron's venv: "
                     f"`source {NATIVE}/bin/activate` (the DLAMI \"Deep Learning AMI Neuron torch-neuronx 2.14.0\")"]
    assert "  [ok] LNC: LNC=2 (default): device_count() is 0;" in "\n".join(lines)
    assert [line.split(":")[0].strip() for line in lines if line.startswith("  [")][-8:] == [
        "[FAIL] neuron environment", "[ok] python", "[ok] neuronx-cc", "[ok] ubuntu", "[ok] disk", "[ok] host memory",
        "[ok] LNC", "[ok] neuron cores"]  # no torch.neuron or device count checks: not TorchNeuron, no device
    assert lines[-1] == "The course cannot run here: fix neuron environment."


@pytest.mark.parametrize("python, ok", [((3, 11), False), ((3, 12), True), ((3, 14), True), ((3, 15), False)])
def test_python_outside_3_12_to_3_14_with_torch_neuronx_fails(python, ok):
    check = doctor._python_check(_with(python=python))
    assert (check.name, check.ok) == ("python", ok)
    if not ok:
        assert check.detail.startswith(f"Python {python[0]}.{python[1]} with torch-neuronx installed, but TorchNeuron "
                                       "has wheels for Python 3.12, 3.13 and 3.14 only: activate TorchNeuron's venv")
    assert doctor._python_check(_with(python=(3, 11), versions={"torch-neuronx": None})) is None  # not asked


@pytest.mark.parametrize("changes, why", [
    ({"env": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}},
     "TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps PyTorch from loading TorchNeuron: unset it, or `import torch_neuronx` "
     "first"),
    ({"privateuse1": "other_npu"}, "PyTorch's out-of-tree backend (PrivateUse1) is already named 'other_npu': "
                                   "another package registered its device first"),
    ({}, "`python -c 'import torch_neuronx'` shows why it does not load"),
])
def test_no_torch_neuron_beside_torchneuron_says_why(changes, why):
    detail = _fail(doctor._autoload_check(_with(**{"torch_neuron": False, "privateuse1": "privateuseone", **changes})),
                   "torch.neuron")
    assert detail.startswith("torch has no neuron device although torch-neuronx 2.14.3.0 is installed: " + why)
    assert doctor._autoload_check(_with(torch_neuron=False, versions={"torch-neuronx": "2.9.0.2.11.19912"})) is None


def test_host_memory_against_trnlab_s_rule_of_thumb_for_compiling():
    check = doctor._memory_check(TRN2)
    assert check.ok and check.detail == (
        "1800.0 GiB available of 2000.0 GiB; compiling Qwen/Qwen3-8B takes about 72.0 GiB by trnlab's own rule of "
        "thumb (4 x its 16.0 GiB of weights + 8 GiB: no figure is published); no OOM kill in the kernel log")
    detail = _fail(doctor._memory_check(_with(memory=(60 * GIB, 128 * GIB))), "host memory")
    assert detail.endswith("no figure is published): use an instance with more host memory or a smaller model, or end "
                           "the processes (other notebooks' kernels) that hold memory")
    unread = doctor._memory_check(_with(oom_kills=None, weights=None))
    assert unread.ok and unread.detail == ("1800.0 GiB available of 2000.0 GiB; the kernel log could not be read for "
                                           "OOM kills (`sudo dmesg | grep -i 'killed process'` reads it)")
    assert doctor._memory_check(_with(memory=None)) is None
    cpu = _with(dev_neuron=False, env={}, prefix="/usr", versions={"torch-neuronx": None})
    assert doctor._memory_check(cpu) is None


def test_an_oom_kill_in_the_kernel_log_fails_naming_the_process(tmp_path, monkeypatch):
    dmesg = tmp_path / "dmesg"
    dmesg.write_text("#!/bin/sh\necho '[ 812.5] Out of memory: Killed process 4242 (neuronx-cc) total-vm:9kB'\n")
    dmesg.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert doctor._oom_kills() == ["neuronx-cc (PID 4242)"]
    detail = _fail(doctor._memory_check(_with(oom_kills=doctor._oom_kills())), "host memory")
    assert ("; the kernel log shows the OOM killer ended neuronx-cc (PID 4242) since boot, as in compiles killed for "
            "host memory (aws-neuron-sdk#431, #706): use an instance with more host memory") in detail
    dmesg.write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1\n")
    monkeypatch.setattr(doctor, "_KERNEL_LOG", tmp_path / "kern.log")
    assert doctor._oom_kills() is None  # neither readable: the check says so rather than "no OOM kill"
    (tmp_path / "kern.log").write_text("kernel: Out of memory: Killed process 77 (python) total-vm:1kB\n")
    assert doctor._oom_kills() == ["python (PID 77)"]


def test_the_chosen_model_s_weights_are_measured_where_they_lie(monkeypatch):
    monkeypatch.delenv("TRNLAB_MODEL", raising=False)
    name, size = doctor._model_weights()
    assert Path(name).name == "tiny-qwen3" and size == sum(f.stat().st_size for f in Path(name).glob("*.safetensors"))
    monkeypatch.setenv("TRNLAB_MODEL", "nobody/not-downloaded")
    assert doctor._model_weights() is None  # neither a folder nor in the Hugging Face cache: no estimate


@pytest.mark.parametrize("flags, lnc, ok", [("--lnc=1", None, False), ("-O1 --logical-nc-config 2", None, True),
                                            ("--lnc 1", "1", True), ("-lnc 2", "1", False)])
def test_the_compiler_s_lnc_must_match_the_runtime_s(flags, lnc, ok):
    env = {"NEURON_CC_FLAGS": flags, **({"NEURON_LOGICAL_NC_CONFIG": lnc} if lnc else {})}
    check = doctor._compiler_lnc_check(_with(env=env))
    assert (check.name, check.ok) == ("compiler LNC", ok)
    flag, value = flags.split()[-1].split("=") if "=" in flags else flags.split()[-2:]
    assert check.detail.startswith(f"NEURON_CC_FLAGS has {flag} {value}, NEURON_LOGICAL_NC_CONFIG is {lnc or 2}")
    if not ok:
        assert check.detail.endswith(f"the runtime's and the compiler's LNC must match: set NEURON_LOGICAL_NC_CONFIG="
                                     f"{value}, or drop {flag} from NEURON_CC_FLAGS")
    assert doctor._compiler_lnc_check(_with(env={"NEURON_CC_FLAGS": "-O1"})) is None
    off = doctor._Machine(versions={}, env=env)  # a CPU machine: the compiler flags do not matter there
    assert doctor._compiler_lnc_check(off) is None


@pytest.mark.parametrize("changes, expected", [
    ({"devices": 128}, "device_count() is 128, expected 64 (every core)"),  # LNC=1 in the process, 2 in neuron-ls
    ({"devices": 4, "env": {"NEURON_RT_VISIBLE_CORES": "0-3"}}, None),
    ({"devices": 4, "env": {"NEURON_RT_NUM_CORES": "2"}}, "device_count() is 4, expected 2 (NEURON_RT_NUM_CORES=2)"),
    ({"neuron_ls": {**TRN2.neuron_ls, "cores": [4] * 12}}, "device_count() is 64, expected 64 (every core); neuron-ls: "
                                                         "trn2.48xlarge, 12 devices, 48 logical"),
])
def test_device_count_against_neuron_ls_instance_type_and_lnc_header(changes, expected):
    check = doctor._device_count_check(_with(**changes))
    assert check.name == "device count" and check.ok is (expected is None), check
    if expected:
        assert check.detail.startswith(expected) and check.detail.endswith(
            "set NEURON_LOGICAL_NC_CONFIG (here unset: 2), NEURON_RT_VISIBLE_CORES and NEURON_RT_NUM_CORES to what "
            "this process should use before it starts, and run doctor again")


def test_device_count_from_the_docs_neuron_ls_of_an_instance_trnlab_does_not_list():
    from neuron_ls_samples import NEURON_LS_2_33  # trn2n.48xlarge, two devices of four logical cores kept

    shown = doctor._neuron_ls_devices(NEURON_LS_2_33)
    assert doctor._device_count_check(_with(neuron_ls=shown, devices=8)).detail == (
        "device_count() is 8 (every core); neuron-ls: trn2n.48xlarge, 2 devices, 8 logical NeuronCores at "
        "logical-neuroncore-config 2")
    assert doctor._device_count_check(_with(neuron_ls=None)) is None  # no neuron-ls
    assert doctor._device_count_check(_with(devices=0)) is None  # no torch.neuron: the torch.neuron check says why


def test_a_many_core_visible_setting_names_trnlab_rank_cores_and_fails_inside_a_rank():
    shell = doctor._torchrun_check(_with(env={"NEURON_RT_VISIBLE_CORES": "4-7"}))
    fix = ("all 4, and TorchNeuron asserts one core per rank: start the ranks with `torchrun --nproc-per-node=4 -m "
           "trnlab.rank_cores 4-7 train.py` (one core each), or trnlab.launch(script), which does it; or unset "
           "NEURON_RT_VISIBLE_CORES to use every core")
    assert shell.ok and shell.detail == ("NEURON_RT_VISIBLE_CORES=4-7 gives one process (a notebook kernel) those "
                                         f"cores, but under a plain torchrun it gives every rank {fix}")
    rank = _fail(doctor._torchrun_check(_with(env={"NEURON_RT_VISIBLE_CORES": "4-7", "LOCAL_RANK": "0"})), "torchrun")
    assert rank == f"NEURON_RT_VISIBLE_CORES=4-7 gives this rank {fix}"
    assert doctor._torchrun_check(_with(env={"NEURON_RT_VISIBLE_CORES": "5", "LOCAL_RANK": "1"})) is None  # rank_cores'
    assert _fail(doctor._torchrun_check(_with(env={"NEURON_RT_VISIBLE_CORES": "3-1"})), "torchrun").startswith(
        "NEURON_RT_VISIBLE_CORES='3-1' is not a core list")
    stale = doctor._torchrun_check(_with(env={"NEURON_RT_ROOT_COMM_ID": "10.0.0.5:62182"}))
    assert stale.ok and stale.detail.endswith("if a run before this one left it, `unset NEURON_RT_ROOT_COMM_ID`")


def test_the_holders_of_neuroncores_come_from_neuron_ls_json_too():
    from neuron_ls_samples import NEURON_LS_2_33, NEURON_LS_2_33_JSON

    shown = doctor._neuron_ls_devices(NEURON_LS_2_33_JSON, NEURON_LS_2_33)
    detail = _fail(doctor._cores_check(_with(neuron_ls=shown)), "neuron cores")
    assert detail.startswith("held by PID 113985 (neuron-bench exec --run-as-cc-neff --...): a process")
    own = {**shown, "holders": [(os.getpid(), "python -m trnlab doctor")]}
    assert doctor._cores_check(_with(neuron_ls=own)).ok  # doctor itself is never the culprit


def test_doctor_asks_torch_apart_where_torch_neuronx_is_installed(monkeypatch):
    installed = doctor._installed
    monkeypatch.setattr(doctor, "_installed", lambda name: "2.14.3.0" if name == "torch-neuronx" else installed(name))
    report = doctor.device_report()  # a child process asks torch here: this machine's real answers come back
    assert (report.backend, report.device_count, report.available["cpu"]) == ("cpu", 1, True)
    assert report.notes[0] == ("doctor asked torch for the devices in a child process: this process has not started "
                               "the Neuron runtime")
    monkeypatch.setattr(doctor.sys, "executable", "/nonexistent/python")
    said = doctor.device_report().notes[0]
    assert said.startswith("asking torch in a child process failed (") and said.endswith(
        "so doctor asked it in this process, which may have started the Neuron runtime here: init_process_group would "
        "then fail TorchNeuron's assertion in this process; run `python -m trnlab doctor` on its own")
    monkeypatch.setattr(doctor, "_installed", installed)
    assert not any("child process" in note for note in doctor.device_report().notes)  # no torch-neuronx: asked here


def test_a_package_newer_than_the_tested_one_is_a_warning_naming_both_versions(monkeypatch):
    from trnlab.run_record import newer_than_tested, tested_versions

    tested = tested_versions()
    same = {"torch": tested["torch"] + "+cpu", "transformers": tested["transformers"], "accelerate": None}
    assert newer_than_tested(same) == []  # a local build label or an absent package is not newer
    newer = {**same, "transformers": "9.0.0"}
    assert newer_than_tested(newer) == [
        f"transformers 9.0.0 is newer than {tested['transformers']}, the version the course was tested with "
        f"(trnlab/constraints.txt): if a cell fails, try pip install \"transformers=={tested['transformers']}\""]
    from trnlab.doctor import device_report

    report = device_report()
    report.versions["transformers"] = "9.0.0"
    checks = [c for c in doctor.run_checks(report) if c.name == "tested versions"]
    assert [(c.ok, c.detail) for c in checks] == [(True, newer_than_tested(newer)[0])]  # a warning, never a failure
