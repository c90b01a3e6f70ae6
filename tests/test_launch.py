"""trnlab.launcher: planning, validation, commands, and real torchrun launches (tiny scripts, no model)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from trnlab import launcher as tl
from trnlab import rank_cores
from trnlab.settings import LaunchError, PlanError, SettingError

# ------------------------------------------------------------------ planning: processes and backend


def test_cpu_plan_is_gloo_with_a_few_processes_sharing_the_cores(no_accelerator):
    plan = tl.plan_processes()
    assert (plan.device, plan.dist_backend, plan.nproc_per_node) == ("cpu", "gloo", tl._CPU_DEFAULT_PROCESSES)
    four = tl.plan_processes(4)
    assert four.nproc_per_node == 4
    assert four.env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 4))


def test_neuron_plan_is_one_process_per_visible_neuroncore(fake_neuron, monkeypatch):
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    plan = tl.plan_processes()
    assert (plan.device, plan.dist_backend, plan.nproc_per_node) == ("neuron", "neuron", 4)
    assert plan.reason.endswith("each rank starts the Neuron runtime (users report about 6.7 s a process, "
                                "aws-neuron-sdk#1361)")  # 4 ranks pay it 4 times, every restart again
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2-3")
    assert tl.plan_processes().nproc_per_node == 2
    with pytest.raises(PlanError,
                       match=r"4 processes need 4 NeuronCores but NEURON_RT_VISIBLE_CORES=2-3 gives 2: widen .*device='cpu'"):
        tl.plan_processes(4)


def _one_gpu_machine(monkeypatch):
    """Make trnlab.launcher see one CUDA GPU (this machine has none)."""
    monkeypatch.setattr(tl, "detect_backend", lambda: "cuda")
    monkeypatch.setattr(tl, "_backend_available", lambda backend: backend in ("cpu", "cuda"))
    monkeypatch.setattr(tl, "_device_count", lambda backend=None: 1 if backend in (None, "cuda") else 0)


def test_fewer_gpus_than_ranks_fall_back_to_gloo_cpu_processes_and_say_why(monkeypatch):
    import torch

    _one_gpu_machine(monkeypatch)
    assert tl.plan_processes(1, device="cuda").dist_backend == "nccl"
    for device in (torch.device("cuda:0"), "cuda", None, "auto"):   # what notebook 05 passes: setup()'s device
        plan = tl.plan_processes(4, device=device)
        assert (plan.device, plan.dist_backend, plan.nproc_per_node) == ("cpu", "gloo", 4)
        assert plan.reason.startswith("fell back to CPU: 4 ranks need 4 GPUs, one each, but "
                                      "torch.cuda.device_count() gives 1, so 4 CPU processes talk over gloo")
        assert plan.env["CUDA_VISIBLE_DEVICES"] == ""   # else Transformers binds every rank to cuda:LOCAL_RANK
        assert "the ranks get CUDA_VISIBLE_DEVICES=''" in str(plan)


def test_an_explicit_cpu_device_gives_cpu_processes_where_an_accelerator_exists(monkeypatch, fake_neuron):
    from trnlab.device import pick_device

    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    assert tl.plan_processes(4).device == "neuron"
    monkeypatch.setenv("TRNLAB_DEVICE", "cpu")           # the notebook's knob, through setup()'s choice
    plan = tl.plan_processes(4, device=pick_device(os.environ["TRNLAB_DEVICE"]))
    assert (plan.device, plan.dist_backend, plan.nproc_per_node) == ("cpu", "gloo", 4)
    assert plan.reason.startswith("device cpu was asked for, so 4 CPU processes talk over gloo")
    assert plan.env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"   # the ranks do not autoload TorchNeuron
    with pytest.raises(SettingError, match="unknown device 'tpu'"):
        tl.plan_processes(2, device="tpu")


def test_the_core_list_parser_reads_the_runtime_formats(monkeypatch):
    assert [len(rank_cores._parse_core_list(value)) for value in ("0-3", "0,2,5-6", "7")] == [4, 4, 1]
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", " ")
    assert rank_cores._visible_cores_setting() is None  # empty is unset
    with pytest.raises(SettingError, match="use e.g. '0-3'"):
        rank_cores._parse_core_list("all")


def test_rank_neuron_cores_gives_each_rank_one_core_of_the_allowed_ones(monkeypatch):
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    assert tl.rank_neuron_cores(2, "4-7") == [4, 5]
    assert tl.rank_neuron_cores(3, [6, 2, 9]) == [6, 2, 9]
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "8-9,12")  # what this process (a kernel) may use
    assert tl.rank_neuron_cores(3) == [8, 9, 12]
    with pytest.raises(SettingError, match=r"4 ranks need 4 NeuronCores, one each, but only 3 are given \(8,9,12\)"):
        tl.rank_neuron_cores(4)
    with pytest.raises(SettingError, match="distinct core numbers"):
        tl.rank_neuron_cores(2, [1, 1])
    with pytest.raises(SettingError, match=r"neuron_cores='3-1' is not a core list"):
        tl.rank_neuron_cores(2, "3-1")
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES")
    with pytest.raises(SettingError, match="pass neuron_cores='0-3'"):
        tl.rank_neuron_cores(2)


def test_torchrun_command_starts_each_rank_through_rank_cores():
    cmd = tl.torchrun_command("train.py", ["--out", "run"], nproc_per_node=2, python="torchrun", tee=False,
                              neuron_cores="4-7")
    assert shlex.join(cmd) == ("torchrun --standalone --nproc-per-node=2 -m trnlab.rank_cores 4-5 "
                               "train.py --out run")
    one = tl.torchrun_command("train.py", nproc_per_node=1, python="torchrun", tee=False, neuron_cores=[3])
    assert one[-4:] == ["-m", "trnlab.rank_cores", "3", "train.py"]


def test_rank_cores_refuses_to_run_outside_torchrun(tmp_path):
    assert rank_cores._core_for_this_rank("4,5", "1") == "5"
    with pytest.raises(SystemExit, match="LOCAL_RANK is not set: start it with torchrun"):
        rank_cores._core_for_this_rank("4,5", None)
    with pytest.raises(SystemExit, match=r"local rank 2 has no core: '4,5' names 2"):
        rank_cores._core_for_this_rank("4,5", "2")
    assert rank_cores._core_for_this_rank("4-5", "1") == "5"  # the same grammar as --neuron-cores
    with pytest.raises(SystemExit, match="CORES='4,x' is not a core list: use e.g. '0-3'"):
        rank_cores._core_for_this_rank("4,x", "0")
    with pytest.raises(SystemExit, match="CORES='1,1' names core 1 twice"):
        rank_cores._core_for_this_rank("1,1", "0")


def test_rank_cores_says_a_bad_local_rank_is_set_and_loads_no_torch(tmp_path):
    script = tmp_path / "modules.py"
    script.write_text("import sys; print('torch' in sys.modules, 'trnlab.launcher' in sys.modules)\n")
    run = [sys.executable, "-m", "trnlab.rank_cores", "4,5", str(script)]
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    bad = subprocess.run(run, env={**env, "LOCAL_RANK": "x"}, capture_output=True, text=True)
    assert bad.returncode == 1 and "LOCAL_RANK='x' is set but not a whole number" in bad.stderr, bad.stderr
    unset = subprocess.run(run, env=env, capture_output=True, text=True)
    assert "LOCAL_RANK is not set: start it with torchrun" in unset.stderr, unset.stderr
    ok = subprocess.run(run, env={**env, "LOCAL_RANK": "1"}, capture_output=True, text=True, check=True)
    assert ok.stdout == "False False\n"  # it runs before the script imports torch, and imports no launcher


def test_rank_neuron_cores_names_the_forms_it_takes():
    for cores in (4, 4.0, {4, 5}):  # it used to end in a bare TypeError ('int' object is not iterable)
        with pytest.raises(SettingError, match=r"give core numbers as a list \(e.g. \[4, 5\]\) or a core list "
                                               r"string \(e.g. '4-7' or '0,2,5'\)"):
            tl.rank_neuron_cores(2, cores)
    with pytest.raises(SettingError, match="nproc='2': give a whole number >= 1"):
        tl.rank_neuron_cores("2", [4, 5])


def test_one_core_list_parser_for_rank_cores_launch_and_the_runtime_variable(monkeypatch):
    assert rank_cores._parse_core_list("0,1,4-5") == tl.rank_neuron_cores(4, "0,1,4-5") == [0, 1, 4, 5]
    assert rank_cores._format_core_list([4, 5, 6, 7, 9, 11, 12]) == "4-7,9,11-12"
    for duplicated in ("1,1", "0-3,2"):
        with pytest.raises(SettingError, match="twice"):
            rank_cores._parse_core_list(duplicated)
        with pytest.raises(SettingError, match="twice"):
            tl.rank_neuron_cores(2, duplicated)  # a string now refuses like a list [1, 1] does
    with pytest.raises(SettingError, match="give core numbers"):
        tl.rank_neuron_cores(2, ["0", "1"])
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2,2")
    with pytest.raises(SettingError, match="NEURON_RT_VISIBLE_CORES='2,2' names core 2 twice"):
        tl.rank_neuron_cores(1)


# ------------------------------------------------------------------ validation

def qwen_like(**changes):
    """A real Qwen3 config with small widths (a Transformers config passes through validate_parallel_sizes)."""
    from transformers import AutoConfig

    widths = dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=512, num_hidden_layers=4)
    return AutoConfig.for_model("qwen3", **{**widths, "vocab_size": 768, "tie_word_embeddings": True, **changes})


def test_wrong_tp_fsdp_product_names_the_numbers_to_change():
    with pytest.raises(PlanError) as info:
        tl.validate_parallel_sizes(4, tp_size=2, fsdp_size=3)
    message = str(info.value)
    assert "tp_size=2 * fsdp_size=3 = 6" in message and "4 process(es)" in message
    assert "launch 6 processes" in message and "tp_size=2, fsdp_size=2" in message


def test_launch_refuses_a_wrong_product_before_starting_anything(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(PlanError, match="tp_size=2 \\* fsdp_size=3 = 6, but the launch has 4"):
        tl.launch("train.py", nproc_per_node=4, tp_size=2, fsdp_size=3, device="cpu", model=qwen_like())


def test_heads_must_divide_by_tp_size():
    assert tl.validate_parallel_sizes(4, 2, 2, model_config=qwen_like())["tp_size"] == 2
    with pytest.raises(PlanError, match=r"tp_size=4 does not divide the model's key/value heads = 2.*"
                                                r"tp_size in \[1, 2\]"):
        tl.validate_parallel_sizes(4, tp_size=4, fsdp_size=1, model_config=qwen_like())
    with pytest.raises(PlanError, match="attention heads = 4, key/value heads = 2"):
        tl.validate_parallel_sizes(3, tp_size=3, fsdp_size=1, model_config=qwen_like())
    with pytest.raises(PlanError, match="pp_size=3 does not divide num_hidden_layers=4"):
        tl.validate_parallel_sizes(3, pp_size=3, model_config=qwen_like())
    widths = {"num_attention_heads": 4, "num_key_value_heads": 2}
    with pytest.raises(TypeError, match="not as type SimpleNamespace"):  # a config is a Transformers config
        tl.validate_parallel_sizes(4, 2, 2, model_config=SimpleNamespace(**widths))
    with pytest.raises(TypeError, match=r"not as type dict: build the config: transformers.AutoConfig.for_model"):
        tl.validate_parallel_sizes(4, 2, 2, model_config={"model_type": "qwen3", **widths})


def test_uneven_tied_vocabulary_under_fsdp_is_refused_with_the_fix():
    odd = qwen_like(vocab_size=761)
    with pytest.raises(PlanError,
                       match="vocab_size=761 does not divide by tp_size \\* fsdp_size = 4.*pad_vocabulary"):
        tl.validate_parallel_sizes(4, 2, 2, model_config=odd)
    assert tl.validate_parallel_sizes(2, 2, 1, model_config=odd)  # TP alone pads nothing: fine


def test_the_course_models_vocabulary_is_checked_for_real():
    from transformers import AutoConfig

    from trnlab.models import model_name

    vocab = AutoConfig.from_pretrained(model_name()).vocab_size
    if vocab % 4:
        with pytest.raises(PlanError, match=f"vocab_size={vocab}"):
            tl.validate_parallel_sizes(4, 2, 2, model_config=model_name())
    else:
        tl.validate_parallel_sizes(4, 2, 2, model_config=model_name())


# ------------------------------------------------------------------ commands


def test_single_node_command_is_a_list_with_standalone_rendezvous_and_rank_prefixes():
    cmd = tl.torchrun_command("train.py", ["--steps", 3], nproc_per_node=4)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[3:] == ["--standalone", "--nproc-per-node=4", "--tee=3", "train.py", "--steps", "3"]


def test_cli_dry_run_refuses_a_wrong_product(capsys):
    from trnlab.__main__ import main

    assert main(["launch", "--dry-run", "--nproc-per-node", "4", "--tp-size", "2", "--fsdp-size", "3",
                 "train.py"]) == 2
    assert "launch 6 processes" in capsys.readouterr().err


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail the test if any process is started (bad input must be refused before that)."""
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail(f"a process was started: {a}"))


@pytest.mark.parametrize("argv, message", [
    (["--dry-run", "--tp-size", "0"], "tp_size=0: give a whole number >= 1"),
    (["--dry-run", "--tp-size", "2", "--fsdp-size", "-1"], "fsdp_size=-1: give a whole number"),
    (["--tp-size", "0", "--nproc-per-node", "1"], "tp_size=0: give a whole number"),
    (["--dry-run", "--nproc-per-node", "0"], "--nproc-per-node=0: give a whole number >= 1"),
    (["--dry-run", "--neuron-cores", "1,1"], "names core 1 twice"),
    (["--timeout", "0", "--nproc-per-node", "1"], "timeout=0.0: give a number of seconds > 0"),
    (["--dry-run", "--tp-size", "2", "--model", "/nonexistent/model"], "cannot check the mesh against model"),
])
def test_cli_refuses_bad_counts_before_anything_starts(argv, message, nothing_starts, no_accelerator, capsys):
    from trnlab.__main__ import main

    assert main(["launch", *argv, "train.py"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no command, no script printed
    assert re.search(message, captured.err), captured.err
    assert captured.err.startswith("error: ") and "Traceback" not in captured.err


def test_python_api_refuses_the_same_bad_counts(nothing_starts):
    with pytest.raises(SettingError, match="tp_size=0"):
        tl.launch("t.py", tp_size=0, device="cpu")
    for timeout in (0, -5, "600"):
        with pytest.raises(SettingError, match=f"timeout={timeout!r}: give a number of seconds > 0"):
            tl.launch("t.py", nproc_per_node=1, device="cpu", timeout=timeout)


def test_dry_run_checks_a_shipped_model_offline_like_plan(monkeypatch, capsys, nothing_starts, no_accelerator):
    """Qwen/Qwen3-8B is in trnlab/assets/configs: no hub, no ModelNotAvailableError."""
    from transformers import AutoConfig

    from trnlab.__main__ import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(AutoConfig, "from_pretrained", lambda *a, **k: pytest.fail("asked the hub"))
    assert main(["launch", "--dry-run", "--tp-size", "2", "--fsdp-size", "2", "--model", "Qwen/Qwen3-8B",
                 "train.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("torchrun --standalone --nproc-per-node=4 train.py\n")
    with pytest.raises(PlanError, match="tp_size=3 does not divide the model's attention heads = 32"):
        tl.validate_parallel_sizes(3, 3, 1, model_config="Qwen/Qwen3-8B")


# ------------------------------------------------------------------ real launches (tiny scripts)

# Each rank writes its PID, so the tests can check afterwards that no process survived.
PID_HEADER = """
import os, sys, time
rank = int(os.environ["RANK"])
open(os.path.join(sys.argv[1], f"pid{rank}"), "w").write(str(os.getpid()))
print(f"rank {rank} of {os.environ['WORLD_SIZE']} up", flush=True)
"""


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(PID_HEADER + textwrap.dedent(body))
    return path


def _assert_all_gone(pid_dir: Path, expected: int):
    pids = [int(p.read_text()) for p in pid_dir.glob("pid*")]
    assert len(pids) == expected, f"only {len(pids)} of {expected} ranks started"
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()
                 and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()]
        time.sleep(0.1)
    assert not alive, f"stray processes left: {alive}"


@pytest.mark.own_launch("a rank made to fail: what the launcher does then")
def test_a_failing_rank_stops_the_others_and_shows_its_traceback(tmp_path, capsys):
    script = _script(tmp_path, "fail.py", """
        if rank == 1:
            # only once the others have said they are up: on a loaded machine they start late
            while not all(os.path.exists(os.path.join(sys.argv[1], f"pid{r}")) for r in (0, 2)):
                time.sleep(0.05)
            time.sleep(1)
            raise ValueError("rank 1 raises on purpose")
        time.sleep(120)  # the others would wait for rank 1 forever
    """)
    result = tl.launch(script, [tmp_path], nproc_per_node=3, device="cpu", timeout=100)
    assert result.returncode != 0 and not result.timed_out and not result.ok
    assert result.failed_rank == 1
    assert result.traceback.startswith("Traceback (most recent call last)")
    assert result.traceback.endswith("ValueError: rank 1 raises on purpose")
    assert result.seconds < 60  # stopped, not waited for
    out = capsys.readouterr().out
    assert "[rank1]: ValueError: rank 1 raises on purpose" in out  # streamed live, prefixed
    assert "[rank0]: rank 0 of 3 up" in out and "[rank2]: rank 2 of 3 up" in out
    assert "rank 1 failed (exit status 1); torchrun stopped the other ranks" in out
    assert "ChildFailedError" not in out  # torchrun's own traceback is kept out of the notebook
    _assert_all_gone(tmp_path, 3)


@pytest.mark.own_launch("a run made to hang: the timeout ends it")
def test_a_hung_run_ends_at_the_timeout_and_leaves_no_process(tmp_path, capsys):
    script = _script(tmp_path, "hang.py", "time.sleep(3600)\n")
    with pytest.raises(LaunchError, match="timed out") as info:
        tl.launch(script, [tmp_path], nproc_per_node=2, device="cpu", timeout=8, grace=5, check=True)
    assert info.value.result.timed_out and info.value.result.returncode != 0
    assert "TIMEOUT: the run did not end within 8 s" in capsys.readouterr().out
    _assert_all_gone(tmp_path, 2)


@pytest.mark.own_launch("two launchers, one a node: their rendezvous")
def test_two_launchers_on_loopback_form_one_job(tmp_path):
    script = _script(tmp_path, "allreduce.py", """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        print(f"node {os.environ['GROUP_RANK']} world {dist.get_world_size()} sum {total.item():g}", flush=True)
        from trnlab.distributed import finish
        finish()
    """)
    result = tl.launch_loopback_nodes(script, [tmp_path], nnodes=2, nproc_per_node=1, timeout=180)
    assert result.ok, str(result)
    assert len(result.commands) == 2 and "--node-rank=1" in result.commands[1]
    assert result.lines(0)[-1] == "node 0 world 2 sum 3"
    assert result.lines(1)[-1] == "node 1 world 2 sum 3"
    _assert_all_gone(tmp_path, 2)



def test_loopback_nodes_print_the_commands_notebook_05_shows(tmp_path, monkeypatch, capsys):
    """Notebook 05's stored output of its launch_loopback_nodes cell, byte for byte, for the same call: the stored
    port, interpreter and folder stand in for this run's; nothing starts."""
    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "05_distributed.ipynb").read_text())
    cell = next(c for c in cells["cells"] if c["cell_type"] == "code"
                and "launch_loopback_nodes(" in "".join(c["source"]))
    stored = "".join(line for out in cell["outputs"] for line in out.get("text", []) if line.startswith("$ "))
    assert stored.count("    # node ") == 2, stored
    port = int(re.search(r"--master-port=(\d+) ", stored).group(1))
    folder = re.search(r"<tmp>/(\S+)/two_nodes\.py", stored).group(1)

    class Socket:  # hands out the stored port
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", port)

    monkeypatch.setattr(tl.socket, "socket", Socket)
    monkeypatch.setattr(tl.sys, "executable", ".venv/bin/python")
    monkeypatch.setattr(tl, "_run_commands", lambda commands, *args: commands)
    script = tmp_path / folder / "two_nodes.py"
    tl.launch_loopback_nodes(script, nnodes=2, nproc_per_node=1, timeout=300)
    assert capsys.readouterr().out.replace(str(tmp_path), "<tmp>") == stored
    with pytest.raises(SettingError, match="nnodes=0: give a whole number >= 1"):
        tl.launch_loopback_nodes(script, nnodes=0)
    with pytest.raises(SettingError, match="nproc_per_node=-1: give a whole number >= 1"):
        tl.launch_loopback_nodes(script, nproc_per_node=-1)


CORE_REPORT = """
import os, sys
print(f"local rank {os.environ['LOCAL_RANK']} sees NeuronCores {os.environ.get('NEURON_RT_VISIBLE_CORES')} "
      f"args {sys.argv[1:]} main {__name__}", flush=True)
"""


@pytest.mark.own_launch("the core each rank of this launch sees")
def test_each_rank_sees_only_its_own_neuroncore(tmp_path, monkeypatch, capsys):
    """The real mechanism, on CPU: a job-wide NEURON_RT_VISIBLE_CORES (what a kernel inherits)
    is replaced in every rank by that rank's one core."""
    script = tmp_path / "cores.py"
    script.write_text(CORE_REPORT)
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-7")
    result = tl.launch(script, ["--flag", "x"], device="cpu", neuron_cores="4-5", timeout=None)  # no limit
    assert result.command[-7:-3] == ["--tee=3", "-m", "trnlab.rank_cores", "4-5"]  # 2 ranks: one per named core
    assert result.ok, str(result)
    assert result.lines(0)[-1] == "local rank 0 sees NeuronCores 4 args ['--flag', 'x'] main __main__"
    assert result.lines(1)[-1] == "local rank 1 sees NeuronCores 5 args ['--flag', 'x'] main __main__"
    assert "--nproc-per-node=2 --tee=3 -m trnlab.rank_cores 4-5 " in capsys.readouterr().out


@pytest.mark.own_launch("two launches on a fake trn2: the cores each gets")
def test_on_neuron_launch_leaves_all_cores_to_torchneuron_and_splits_only_a_subset(fake_neuron, tmp_path,
                                                                                     monkeypatch):
    """Under a fake trn2 (4 NeuronCores; the ranks run on this CPU): on all
    cores, plain torchrun (TorchNeuron's process group gives rank i core i when the variable is
    unset, which a CPU rank cannot show: it sees no value); on a subset, each rank gets its core."""
    script = tmp_path / "cores.py"
    script.write_text(CORE_REPORT)
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    result = tl.launch(script, nproc_per_node=2, timeout=120, echo=False)
    assert result.ok, str(result)
    assert "trnlab.rank_cores" not in result.command
    assert [result.lines(r)[-1].split(" args")[0] for r in (0, 1)] == [
        "local rank 0 sees NeuronCores None", "local rank 1 sees NeuronCores None"]
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2-3")
    assert "trnlab.rank_cores" not in tl._launch_command(script, nproc_per_node=2, device="cpu")[0]  # CPU: no subset
    result = tl.launch(script, timeout=120, echo=False)  # one process per visible core: 2
    assert result.command[-3:] == ["trnlab.rank_cores", "2-3", str(script)]
    assert [result.lines(r)[-1].split(" args")[0] for r in (0, 1)] == [
        "local rank 0 sees NeuronCores 2", "local rank 1 sees NeuronCores 3"]


def test_dry_run_on_a_fake_trn2_adds_rank_cores_only_for_a_subset(fake_neuron, monkeypatch, capsys):
    from trnlab.__main__ import main

    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    assert main(["launch", "--dry-run", "train.py"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "torchrun --standalone --nproc-per-node=4 train.py"
    assert main(["launch", "--dry-run", "--neuron-cores", "2-3", "train.py"]) == 0  # 2 ranks: one per named core
    assert capsys.readouterr().out.splitlines()[0] == (
        "torchrun --standalone --nproc-per-node=2 -m trnlab.rank_cores 2-3 train.py")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "1-3")
    assert main(["launch", "--dry-run", "train.py"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "torchrun --standalone --nproc-per-node=3 -m trnlab.rank_cores 1-3 train.py")


def test_an_empty_core_list_is_refused_with_what_to_give(nothing_starts):
    # It used to end in "nproc=0: give a whole number >= 1", which names no core list.
    with pytest.raises(SettingError, match=r"neuron_cores=\[\] names no core: list the cores .* or leave "
                                                r"neuron_cores out"):
        tl.launch("train.py", neuron_cores=[], device="cpu")


def _torchrun_summary(failures, root):
    """torchrun's closing summary (torch.distributed.elastic's ChildFailedError) for ``failures``: rank -> exit."""
    def entry(index, rank):
        return (f"[{index}]:\n  time      : 2026-12-06_16:00:19\n  host      : here\n  rank      : {rank} (local_rank: "
                f"{rank})\n  exitcode  : {failures[rank]} (pid: {100 + rank})\n  error_file: <N/A>\n")
    others = [rank for rank in failures if rank != root]
    return ("rank_scripts.py FAILED\n" + "-" * 20 + "\nFailures:\n"
            + ("".join(entry(i + 1, r) for i, r in enumerate(others)) or "  <NO_OTHER_FAILURES>\n")
            + "-" * 20 + "\nRoot Cause (first observed failure):\n" + entry(0, root) + "=" * 20 + "\n")


PEER_TRACEBACK = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1, in <module>\n"
                  "[rank0]: torch.distributed.DistBackendError: Connection closed by peer\n")


@pytest.mark.parametrize("failures, root", [({1: 3}, 1),          # torchrun saw rank 1 gone, and stopped rank 0
                                            ({0: 1, 1: 3}, 0),    # it saw both: the first by its clock, rank 0
                                            ({1: 3, 0: 1}, 1)])
def test_the_rank_that_died_without_a_word_is_the_root_cause_whichever_torchrun_saw_first(failures, root, tmp_path):
    """Rank 1 exits (status 3) without a traceback; rank 0 raises about it. However torchrun's summary lists them,
    the report names rank 1 and shows rank 0's traceback."""
    printed = tmp_path / "printed.txt"
    printed.write_text("[rank0]: rank 0 up\n[rank1]: rank 1 up\n" + PEER_TRACEBACK + _torchrun_summary(failures, root))
    command = [sys.executable, "-c", f"import sys; sys.stdout.write(open({str(printed)!r}).read()); sys.exit(1)"]
    result = tl._run_commands([command], {}, timeout=60, grace=5, echo=False)
    assert (result.failed_rank, result.rank_exit_status) == (1, 3)
    assert str(result) == "rank 1 failed (exit status 3); torchrun stopped the other ranks"
    assert result.traceback.splitlines() == ["(rank 1 printed no traceback; rank 0's:)",
                                             *[line[len("[rank0]: "):] for line in PEER_TRACEBACK.splitlines()]]


def test_max_restarts_is_passed_to_torchrun_and_a_restart_is_reported_by_rank():
    cmd = tl.torchrun_command("train.py", nproc_per_node=2, python="torchrun", tee=False, max_restarts=1)
    assert cmd == ["torchrun", "--standalone", "--nproc-per-node=2", "--max-restarts=1", "train.py"]
    assert "--max-restarts=0" not in tl.torchrun_command("train.py", nproc_per_node=2, max_restarts=0)
    with pytest.raises(SettingError, match=r"max_restarts=-1: give a whole number >= 0"):
        tl.torchrun_command("train.py", nproc_per_node=2, max_restarts=-1)
    assert tl.RESTART_ENV == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    result = tl.LaunchResult(commands=[cmd], returncode=0, seconds=3.0, restarts=[(1, -9)])
    assert str(result) == ("the run finished (exit status 0) in 3.0 s, after rank 1 failed (exit status -9: SIGKILL) "
                           "and torchrun restarted every rank")
