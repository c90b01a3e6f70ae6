import json
import re
import warnings

import pytest
import torch

import trnlab
from neuron_ls_samples import NEURON_LS_2_21_BETA, NEURON_LS_2_33, NEURON_LS_2_33_JSON
from trnlab import device as dev
from trnlab import doctor
from trnlab.doctor import _format_report as format_report, run_checks


def test_cpu_path_for_real(no_accelerator, capsys):
    assert dev.detect_backend() == "cpu"
    assert trnlab.pick_device() == torch.device("cpu")
    said = capsys.readouterr().out
    assert "Using cpu" in said and "no neuron device (TorchNeuron is not installed here" in said and "no CUDA GPU" in said
    x = torch.arange(4.0).to(trnlab.pick_device(verbose=False))
    assert x.device.type == "cpu" and x.sum().item() == 6.0


def test_cpu_report(no_accelerator):
    report = doctor.device_report()
    assert report.backend == "cpu" and report.device_count == 1
    assert report.available == {"neuron": False, "cuda": False, "cpu": True}
    assert report.versions["torch"] == torch.__version__.split("+")[0] or report.versions["torch"] == torch.__version__
    assert report.versions["torch-neuronx"] is None
    assert set(report.neuron_env) == {"NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_CC_FLAGS"}
    assert report.neuron_ls is None
    assert any("No Neuron device" in note for note in report.notes)


@pytest.mark.parametrize("prefer", ["neuron", "cuda", "neuron:0"])
def test_explicit_missing_device_raises_never_falls_back(no_accelerator, prefer):
    with pytest.raises(trnlab.NotAvailableError, match="not available") as info:
        trnlab.pick_device(prefer)
    assert "install" in str(info.value).lower()


def test_unknown_device_name():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        trnlab.pick_device("tpu")


def test_neuron_branch(fake_neuron):
    assert dev.detect_backend() == "neuron"
    assert trnlab.pick_device() == torch.device("neuron", 0)
    assert trnlab.pick_device("neuron:3") == torch.device("neuron", 3)
    with pytest.raises(trnlab.NotAvailableError, match="sees 4 neuron device"):
        trnlab.pick_device("neuron:4")
    report = doctor.device_report()
    assert (report.backend, report.device_count, report.bf16_supported) == ("neuron", 4, True)
    assert report.versions["torch-neuronx"] == "0.0.0+fake"
    assert report.notes == []


def test_neuron_without_cores_falls_back(fake_neuron, monkeypatch):
    fake_neuron.count = 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dev.detect_backend() == "cpu"
    with pytest.raises(trnlab.NotAvailableError):
        trnlab.pick_device("neuron")


def test_device_map_auto_on_neuron_warns_and_fixes(fake_neuron):
    with pytest.warns(UserWarning, match=r"1\.16 asks torch\.neuron\.mem_get_info, found neither in the Neuron docs"):
        assert trnlab.resolve_device_map("auto") == "neuron"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trnlab.resolve_device_map("neuron") == "neuron"


def test_device_map_elsewhere(no_accelerator):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trnlab.resolve_device_map("auto") == "cpu"
        assert trnlab.resolve_device_map("auto", backend="cuda") == "auto"
        assert trnlab.resolve_device_map({"": "cpu"}) == {"": "cpu"}
        assert trnlab.resolve_device_map(None) is None
    with pytest.warns(UserWarning, match="loads on CPU on Neuron, silently"):
        assert trnlab.resolve_device_map("auto", backend="neuron") == "neuron"
    with pytest.raises(trnlab.NotAvailableError, match="device_map='neuron'"):
        trnlab.resolve_device_map("neuron")


def test_neff_cache_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    (tmp_path / "graph1").mkdir()
    (tmp_path / "graph1" / "model.neff").write_bytes(b"x" * 100)
    (tmp_path / "b.neff").write_bytes(b"y" * 20)
    assert doctor._neff_cache_summary() == {"path": str(tmp_path), "exists": True, "files": 2, "bytes": 120}
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "missing"))
    assert doctor._neff_cache_summary()["exists"] is False


def test_neuron_ls_is_read_when_present(tmp_path, monkeypatch):
    tool = tmp_path / "neuron-ls"
    tool.write_text("#!/bin/sh\necho 'NEURON DEVICE 0: 8 cores'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert dev._neuron_ls_output() == "NEURON DEVICE 0: 8 cores"


def test_doctor_report_on_fake_neuron(fake_neuron, monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-1")
    report = doctor.device_report()
    checks = run_checks(report)
    text = format_report(report, checks)
    assert "backend                  neuron" in text
    assert "NEURON_RT_VISIBLE_CORES  0-1" in text
    assert [c.name for c in checks] == ["device", "transformers", "accelerate", "model"]


@pytest.fixture(scope="module")
def doctor_cli(trnlab_cli):
    """python -m trnlab doctor: --json on cpu, the table, and the table with a missing device and model."""
    return trnlab_cli((["doctor", "--json"], {"TRNLAB_DEVICE": "cpu"}), (["doctor"], {}),
                      (["doctor"], {"TRNLAB_DEVICE": "neuron", "TRNLAB_MODEL": "/nonexistent/model"}))


def test_doctor_cli_ok_and_json(doctor_cli):
    done, table, _ = doctor_cli
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is True and data["backend"] in ("cpu", "cuda")
    assert {"bf16_supported", "device_count", "versions", "neff_cache"} <= set(data), sorted(data)  # DeviceReport's fields
    assert {c["name"] for c in data["checks"]} == {"device", "transformers", "accelerate", "model"}
    assert table.returncode == 0 and "The course can run here." in table.stdout


def test_doctor_cli_fails_with_reason(doctor_cli):
    done = doctor_cli[2]
    assert done.returncode == 1
    assert "[FAIL] device: TRNLAB_DEVICE=neuron" in done.stdout
    assert "[FAIL] model: no model folder at /nonexistent/model" in done.stdout
    assert "cannot run here: fix device, model" in done.stdout


NEURON_LS_WITH_PROCESSES = """\
+--------+--------+--------+-----------+--------------+-------+----------------------------+---------+
| NEURON | NEURON | NEURON | CONNECTED |     PCI      |  PID  |          COMMAND           | RUNTIME |
| DEVICE | CORES  | MEMORY |  DEVICES  |     BDF      |       |                            | VERSION |
+--------+--------+--------+-----------+--------------+-------+----------------------------+---------+
| 0      | 4      | 96 GB  | 1         | 0000:00:1c.0 | 4242  | python -m ipykernel_launcher | 2.29.0  |
|        |        |        |           |              | 4343  | python train.py            | 2.29.0  |
+--------+--------+--------+-----------+--------------+-------+----------------------------+---------+
| 1      | 4      | 96 GB  | 0         | 0000:00:1d.0 |       |                            |         |
+--------+--------+--------+-----------+--------------+-------+----------------------------+---------+
"""  # a trn2 in the --wide columns of the Neuron 2.32 docs: 4 logical NeuronCores per device at LNC=2


def test_neuron_core_holders_reads_the_pid_column():
    assert dev._neuron_core_holders(NEURON_LS_WITH_PROCESSES) == [
        (4242, "python -m ipykernel_launcher"), (4343, "python train.py")]
    assert dev._neuron_core_holders(NEURON_LS_WITH_PROCESSES, ignore_pids=(4242,)) == [(4343, "python train.py")]
    assert dev._neuron_core_holders("| NEURON | CORES |\n| 0 | 8 |") == []  # no PID column
    assert dev._neuron_core_holders(None) == []


def test_neuron_ls_is_read_in_each_layout_of_the_docs():
    beta = dev._neuron_ls_devices(NEURON_LS_2_21_BETA)
    assert beta == {"instance_type": None, "lnc": None, "cores": [4, 4],  # LOGICAL NC, not the 8 physical
                    "holders": [(268911, "neuron-bench exec --run-as-cc-neff --..."),
                                (269192, "neuron-ls --show-all-procs")]}  # each process once, not once per device
    text = dev._neuron_ls_devices(NEURON_LS_2_33)
    assert text == {"instance_type": "trn2n.48xlarge", "lnc": 2, "cores": [4, 4], "holders": []}
    from_json = dev._neuron_ls_devices(NEURON_LS_2_33_JSON)
    assert from_json == {"instance_type": None, "lnc": 2, "cores": [4, 4],
                         "holders": [(113985, "neuron-bench exec --run-as-cc-neff --...")]}
    both = dev._neuron_ls_devices(NEURON_LS_2_33_JSON, NEURON_LS_2_33)  # the JSON's processes, the text's header
    assert both == {**from_json, "instance_type": "trn2n.48xlarge"}
    assert dev._neuron_core_holders(NEURON_LS_2_33_JSON) == [(113985, "neuron-bench exec --run-as-cc-neff --...")]
    assert dev._neuron_core_holders(NEURON_LS_2_33) == []  # the plain table lists no process: hence the JSON
    assert dev._neuron_ls_devices(None, "", "{}") == {"instance_type": None, "lnc": None, "cores": [], "holders": []}


@pytest.mark.parametrize("accepts", ["--output-format json", "-j"])  # the flag the 2.34 intent notice names; before 2.34
def test_neuron_ls_json_is_asked_with_the_flag_the_tool_has(tmp_path, monkeypatch, accepts):
    tool = tmp_path / "neuron-ls"
    tool.write_text(f'#!/bin/sh\n[ "$*" = "{accepts}" ] || {{ echo "unknown option $1" >&2; exit 2; }}\necho "[]"\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert dev._neuron_ls_json() == "[]\n"
    tool.write_text("#!/bin/sh\necho 'no JSON here'\n")  # a tool without JSON: the text is read instead
    assert dev._neuron_ls_json() is None
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert dev._neuron_ls_json() is None


def test_doctor_names_the_process_that_holds_the_cores():
    from trnlab import doctor

    report = doctor.device_report()
    report.neuron_ls = NEURON_LS_WITH_PROCESSES
    check = next(c for c in doctor.run_checks(report) if c.name == "neuron cores")
    assert not check.ok
    assert "PID 4242 (python -m ipykernel_launcher)" in check.detail and "NEURON_RT_VISIBLE_CORES" in check.detail
    report.neuron_ls = None  # no neuron-ls on this machine: no such check
    assert all(c.name != "neuron cores" for c in doctor.run_checks(report))


def test_accelerator_memory_on_cpu_says_there_is_no_counter():
    assert dev._accelerator_memory("cpu") is None
    assert dev._accelerator_memory(torch.device("cpu")) is None
    text = trnlab.format_accelerator_memory("cpu")
    assert text.startswith("cpu: the CPU has no such counter") and "torch.accelerator.memory_allocated" in text
    # Generic: notebook 02 prints it after loading, notebook 04 after a training step.
    assert "weights" not in text and "process's ordinary RAM" in text


@pytest.mark.parametrize("backend", ["cuda", "neuron"])
def test_accelerator_memory_reads_torch_accelerator(monkeypatch, backend):
    asked = []
    monkeypatch.setattr(dev, "_current_accelerator", lambda: backend)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 1)
    monkeypatch.setattr(torch.accelerator, "memory_allocated", lambda i: asked.append(i) or 3 * 2**20)
    monkeypatch.setattr(torch.accelerator, "max_memory_allocated", lambda i: asked.append(i) or 5 * 2**30)
    assert dev._accelerator_memory(f"{backend}:2") == {"allocated": 3 * 2**20, "max_allocated": 5 * 2**30}
    assert asked == [2, 2]
    assert dev._accelerator_memory(backend) == {"allocated": 3 * 2**20, "max_allocated": 5 * 2**30}
    assert asked[2:] == [1, 1]  # no index: the current device
    assert trnlab.format_accelerator_memory(f"{backend}:0") == (
        f"{backend}:0: 3.0 MiB allocated by tensors now, 5.0 GiB at most so far "
        "(torch.accelerator.memory_allocated / max_memory_allocated)")
    other = "cuda" if backend == "neuron" else "neuron"
    with pytest.raises(ValueError, match=f"{other}:0 is not this process's accelerator \\({backend}\\)"):
        dev._accelerator_memory(f"{other}:0")


def _setup_output(capsys, device=None):
    chosen = dev.setup(device)
    return chosen, capsys.readouterr().out


def test_setup_without_neuron_says_so_in_one_line(no_accelerator, monkeypatch, capsys):
    monkeypatch.setattr("trnlab.device._neuron_ls_output", lambda: None)
    chosen, out = _setup_output(capsys, "cpu")
    assert chosen == torch.device("cpu")
    lines = [line for line in out.splitlines() if line.startswith("NeuronCores")]
    assert lines == ["NeuronCores: none on this machine (no neuron-ls, no neuron device). On a trn2, setup() "
                     "lists here the processes that hold NeuronCores and how to release them."]


def test_setup_on_neuron_names_the_processes_holding_cores(fake_neuron, monkeypatch, capsys):
    monkeypatch.setattr("trnlab.device._neuron_ls_output", lambda: NEURON_LS_WITH_PROCESSES)
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    chosen, out = _setup_output(capsys)
    assert chosen == torch.device("neuron", 0)
    notice = next(line for line in out.splitlines() if line.startswith("NeuronCores"))
    assert notice.startswith("NeuronCores: held by PID 4242 (python -m ipykernel_launcher); PID 4343 "
                             "(python train.py) (neuron-ls); this kernel (PID ")
    for advice in ("Neuron runtime cannot be initialized", "Shut Down Kernel", "kill <PID>",
                   "NEURON_RT_VISIBLE_CORES set before each kernel starts"):
        assert advice in notice, advice
    # This kernel itself is never reported as another holder; its own cores are named when limited.
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2-3")
    own = dev.core_holders_notice(NEURON_LS_WITH_PROCESSES, "neuron", own_pid=4242)
    assert own.startswith("NeuronCores: held by PID 4343 (python train.py) (neuron-ls); this kernel "
                          "(PID 4242) sees NeuronCores 2-3 (NEURON_RT_VISIBLE_CORES).")
    free = dev.core_holders_notice(NEURON_LS_WITH_PROCESSES.replace("4343", "4242"), "neuron", own_pid=4242)
    assert free.startswith("NeuronCores: no other process holds one (neuron-ls)")
    assert "neuron-ls is not on PATH" in dev.core_holders_notice(None, "neuron")


def test_core_holders_notice_reports_every_other_holder_and_not_the_kernel_itself():
    # Notebook 01's example: this kernel has its own row; another kernel and a training script are reported.
    table = """\
| NEURON | NEURON | NEURON | CONNECTED |     PCI      |  PID  |           COMMAND            | RUNTIME |
| DEVICE | CORES  | MEMORY |  DEVICES  |     BDF      |       |                              | VERSION |
| 0      | 8      | 96 GB  | 0         | 0000:00:1e.0 | 4242  | python -m ipykernel_launcher | 2.29.0  |
|        |        |        |           |              | 4343  | python train.py              | 2.29.0  |
|        |        |        |           |              | 4444  | python -m ipykernel_launcher | 2.29.0  |"""
    assert [pid for pid, _ in dev._neuron_core_holders(table)] == [4242, 4343, 4444]
    notice = dev.core_holders_notice(table, "neuron", own_pid=4444)
    assert notice.startswith("NeuronCores: held by PID 4242 (python -m ipykernel_launcher); PID 4343 "
                             "(python train.py) (neuron-ls); this kernel (PID 4444) ")
    assert "4444 (" not in notice


def test_run_summary_counts_graphs_since_setup(no_accelerator, monkeypatch, capsys):
    monkeypatch.setattr(dev, "_run", {})
    with pytest.raises(RuntimeError, match=r"call trnlab.setup\(\) at the top of the notebook first"):
        trnlab.run_summary()
    monkeypatch.setattr("trnlab.device._neuron_ls_output", lambda: None)
    add = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)
    add(torch.ones(1))  # compiled before setup: not this notebook's
    dev.setup("cpu")
    add(torch.ones(2)), add(torch.ones(3)), add(torch.ones(3))
    first, second, *more = trnlab.run_summary().splitlines()
    assert re.fullmatch(r"this notebook compiled 2 graph\(s\) in \d+ s on cpu", first), first
    assert second.startswith("on a trn2: each graph is a neuronx-cc compilation to a NEFF")
    assert "an estimate, from the Neuron docs" in second and "several minutes for large models" in second
    assert 'a training graph two: TorchNeuron\'s AOT Autograd stage compiles its forward and backward apart, Neuron ' \
           'docs, "How torch.compile works on Neuron"' in second
    assert more == []  # no NEFF line off Neuron


def test_run_summary_on_neuron_counts_neffs(fake_neuron, monkeypatch, capsys):
    metrics = [{"graph_name": "model__0_inference_0"}]
    fake_neuron.get_dynamo_metrics = lambda: list(metrics)
    monkeypatch.setattr("trnlab.device._neuron_ls_output", lambda: None)
    dev.setup()
    metrics += [{"graph_name": "model__1_forward_1"}, {"graph_name": "model__1_backward_1"}, {"graph": "g3"}]
    lines = trnlab.run_summary().splitlines()
    assert lines[0].endswith("on neuron:0")
    assert lines[2] == ("torch.neuron.get_dynamo_metrics(): 3 NEFF(s) compiled (1 forward, 1 backward, 0 inference, "
                        "1 unnamed) since setup()")
    del metrics[:]
    assert trnlab.run_summary().splitlines()[2] == ("torch.neuron.get_dynamo_metrics(): 0 NEFF(s) compiled "
                                                    "(0 forward, 0 backward, 0 inference) "
                                                    "since torch.neuron.reset_dynamo_metrics() was last called")


def test_setup_warns_when_a_package_is_newer_than_the_tested_one(no_accelerator, monkeypatch, capsys):
    from trnlab.run_record import tested_versions

    monkeypatch.setattr("trnlab.device._neuron_ls_output", lambda: None)
    versions = {**dev._package_versions(), "accelerate": "9.1.0"}
    monkeypatch.setattr("trnlab.device._package_versions", lambda: versions)
    _, out = _setup_output(capsys, "cpu")
    assert f"warning: accelerate 9.1.0 is newer than {tested_versions()['accelerate']}, the version" in out
    monkeypatch.setattr("trnlab.device._package_versions", lambda: {**versions, "accelerate": None})
    assert "warning:" not in _setup_output(capsys, "cpu")[1]
