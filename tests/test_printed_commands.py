"""Every command notebooks 05 and 06 and the README print for a learner to type runs, as printed, on the STAND-IN neuron
device (the trn2 path); each is read from the text (a fenced block), not copied here. The page's and the README's, which
a laptop runs too, are also checked as printed for CPU: parsed into the torchrun command `launch` builds there and
the mesh that each rank's first step, check_mesh, gives (examples/train.py trains on CPU gloo in
tests/test_checkpoints.py and notebook 07). So are the cluster lines, for their 64 processes a node. Only what a real
cluster has is replaced, and each test says what: the hub model Qwen/Qwen3-8B (unreachable here) by
tools/build_model.py's other tiny Qwen3 (4 key/value heads, so tp=4 still splits it), a node's 64 processes by 2 (4
ranks, on 2 cores), node 0's address by 127.0.0.1 and its port by a free one, the DLAMI's environment by this one.
Every other argument stays. The Slurm script is submitted with sbatch to a real two-node Slurm on this machine
(tests/slurm_cluster.py), once as printed and once with rank 1 SIGKILLed, so the script requeues the job. Each command
runs in a folder holding `examples/` (the repository's) and `padded-model/` (notebook 05's padded copy of the bundled
model). The ranks import Transformers, then train 2 steps."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trnlab
from tests.slurm_cluster import job_id, slurm  # noqa: F401 (a fixture)
from tests.test_checkpoints import _losses
from tests.test_standin import needs_compiler
from trnlab.__main__ import main
from trnlab.launcher import check_mesh

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"05": ROOT / "notebooks" / "05_distributed.ipynb", "06": ROOT / "notebooks" / "06_planning.ipynb",
           "README": ROOT / "README.md"}
HUB_MODEL = "Qwen/Qwen3-8B"
TRAIN_DEFAULTS = {"model": None, "tp-size": "2", "batch-size": "8"}  # examples/train.py's, for what a line leaves out
RANKS = {"cpu": "cpu", "standin": "neuron"}  # the device each rank trained on


def _prose(path: Path) -> str:
    """The text a learner reads: the README, or a notebook's markdown cells."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def printed_commands(source: str) -> list[str]:
    """The commands ``source`` prints in fenced blocks: each torchrun or launch line, each Slurm script whole."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", _prose(SOURCES[source]), re.S):
        if block.startswith("#!/bin/bash"):
            found.append(block)
            continue
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment explains; it is not typed
            if line.startswith(("torchrun ", "python -m trnlab launch ", "python -c ")):
                found.append(line)
    return found


def _one(source: str, pattern: str) -> str:
    matches = [c for c in printed_commands(source) if re.search(pattern, c)]
    assert len(matches) == 1, (source, pattern, printed_commands(source))
    return matches[0]


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Where a learner runs the commands: examples/ (the repository's) and notebook 05's padded-model/."""
    path = tmp_path_factory.mktemp("learner")
    (path / "examples").symlink_to(ROOT / "examples")
    made = subprocess.run(_one("05", r"^python -c .*padded-model"), shell=True, cwd=path, env=_env("cpu", path),
                          capture_output=True, text=True, timeout=300)  # section 1's line that makes the copy
    assert made.returncode == 0 and (path / "padded-model" / "config.json").is_file(), made.stderr[-4000:]
    built = ROOT / "build" / "other-qwen3"  # make test builds it before the tests: reused when built since the recipe
    config = built / "config.json"
    if config.is_file() and config.stat().st_mtime > (ROOT / "tools" / "build_model.py").stat().st_mtime:
        (path / "other-model").symlink_to(built)
    else:
        sys.path.insert(0, str(ROOT / "tools"))
        from build_model import main as build_model
        assert build_model(["--other", "--output", str(path / "other-model")]) == 0
    return path


def _env(device: str, folder: Path) -> dict[str, str]:
    """This venv's python and torchrun first on PATH, the worktree's trnlab, one thread a rank; the device."""
    env = {**os.environ, "PATH": f"{folder / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
                                 f"{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("TRNLAB_NEURON_STANDIN", None)
    if device == "standin":
        env["TRNLAB_NEURON_STANDIN"] = "1"
    return env


def _run(commands: list[str], folder: Path, device: str, timeout: int = 400) -> str:
    """Run the shell ``commands`` at once (one per node) in ``folder``; each must exit 0. Their output, joined."""
    procs = [subprocess.Popen(command, shell=True, cwd=folder, env=_env(device, folder), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for command in commands]
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, out[-4000:]
        outputs.append(out)
    return "\n".join(outputs)


def _trained(device: str, tp: int, fsdp: int, rows: int) -> str:
    """What examples/train.py's rank 0 prints at the end of a run."""
    return (f"trained 2 steps on a {tp} x {fsdp} (tp x fsdp) mesh of {RANKS[device]} ranks, {rows} row(s) per FSDP "
            "rank a step")


def _hub_to_other(command: str, folder: Path) -> str:
    assert f"--model {HUB_MODEL}" in command, command
    return command.replace(f"--model {HUB_MODEL}", f"--model {folder / 'other-model'}")


def test_every_printed_distributed_command_is_one_this_file_runs():
    assert printed_commands("05") == [
        "torchrun --nproc_per_node=4 examples/train.py",
        "python -c \"from trnlab import distributed as td; td.pad_vocabulary(None, 'padded-model', multiple=64)\"",
        "torchrun --nproc_per_node=4 examples/train.py --model padded-model",
        *[f"torchrun --nnodes=2 --node-rank={i} --master-addr=10.0.0.1 --master-port=29500 --nproc-per-node=64 "
          f"examples/train.py --model {HUB_MODEL} --tp-size 4 --batch-size 32" for i in (0, 1)],
        printed_commands("05")[-1]]
    assert printed_commands("05")[-1].startswith("#!/bin/bash\n#SBATCH")
    assert printed_commands("06") == [f"torchrun --nproc-per-node=64 examples/train.py --model {HUB_MODEL} "
                                      "--tp-size 4 --batch-size 16"]
    assert printed_commands("README") == ["python -m trnlab launch --nproc-per-node 2 examples/train.py --tp-size 2",
                                          "python -m trnlab launch --neuron-cores 2-3 examples/train.py --tp-size 2"]


@pytest.mark.own_launch("notebook 05's commands, run as printed")
@needs_compiler
def test_the_pages_command_refuses_the_unpadded_model_then_trains_the_padded_one(folder):
    """05: the page's command, then with section 3's padded copy, on the stand-in (~50 s)."""
    bare = _one("05", r"train\.py$")
    run = subprocess.run(bare, shell=True, cwd=folder, env=_env("standin", folder), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0 and "vocab_size=761 does not divide by tp_size * fsdp_size = 4" in run.stderr
    assert "pad_vocabulary" in run.stderr  # the error names its fix
    out = _run([_one("05", r"--model padded-model$")], folder, "standin")
    assert _trained("standin", 2, 2, 4) in out


def _mesh_as_printed(line: str, monkeypatch) -> dict:
    """What each rank's first step, examples/train.py's check_mesh, gives the torchrun ``line`` as printed: WORLD_SIZE
    is --nnodes x --nproc-per-node, as torchrun sets it; a refusal raises."""
    launcher, script = line.split(" examples/train.py")
    given = {name.replace("_", "-"): value for name, value in re.findall(r"--([\w-]+)=(\S+)", launcher)}
    monkeypatch.setenv("WORLD_SIZE", str(int(given.get("nnodes", 1)) * int(given["nproc-per-node"])))
    args = {**TRAIN_DEFAULTS, **dict(re.findall(r"--([\w-]+) (\S+)", script))}
    assert set(args) == set(TRAIN_DEFAULTS), line
    return check_mesh(trnlab.model_name(args["model"]), int(args["tp-size"]), batch_size=int(args["batch-size"]))


@pytest.mark.usefixtures("no_accelerator")
def test_on_cpu_the_pages_and_the_readmes_commands_give_their_mesh_as_printed(folder, monkeypatch, capsys):
    """05's two commands and the README's two lines on a laptop: the torchrun command `launch` builds (--dry-run),
    then each rank's mesh check; the stand-in runs train them to the end."""
    monkeypatch.chdir(folder)
    with pytest.raises(trnlab.PlanError, match=r"vocab_size=761 does not divide by tp_size \* fsdp_size = 4: .*"
                                               r"pad_vocabulary"):
        _mesh_as_printed(_one("05", r"train\.py$"), monkeypatch)
    assert _mesh_as_printed(_one("05", r"--model padded-model$"), monkeypatch) == {
        "tp_size": 2, "fsdp_size": 2, "rank_batch_size": 4}
    cores = {"--nproc-per-node 2": "", "--neuron-cores 2-3": "-m trnlab.rank_cores 2-3 "}
    for line, option in zip(printed_commands("README"), cores):
        command, *argv = shlex.split(line)[3:]  # after python -m trnlab
        assert option in line and main([command, "--dry-run", *argv]) == 0
        torchrun, plan = capsys.readouterr().out.splitlines()
        assert torchrun == f"torchrun --standalone --nproc-per-node=2 {cores[option]}examples/train.py --tp-size 2"
        assert plan.startswith("# 2 process(es) on cpu, backend gloo")
        assert _mesh_as_printed(torchrun, monkeypatch) == {"tp_size": 2, "fsdp_size": 1, "rank_batch_size": 8}


@pytest.mark.own_launch("notebook 05's two node lines, run as printed")
@needs_compiler
def test_the_two_node_lines_run_as_a_loopback_rehearsal(folder):
    """05: both nodes' lines at once on 127.0.0.1, 2 processes each instead of 64, the other tiny model (~20 s)."""
    port = _free_port()
    nodes = [_hub_to_other(line, folder).replace("--master-addr=10.0.0.1", "--master-addr=127.0.0.1")
             .replace("--master-port=29500", f"--master-port={port}")
             .replace("--nproc-per-node=64", "--nproc-per-node=2")
             for line in printed_commands("05") if "--nnodes=2" in line]
    assert len(nodes) == 2
    out = _run(nodes, folder, "standin")
    assert _trained("standin", 4, 1, 32) in out


def _slurm_job(folder: Path, wrap: str = "") -> str:
    """Notebook 05's batch script with only the cluster's parts changed, each named; ``wrap`` goes before the rank
    script (a test's wrapper: never the learner's)."""
    script = _one("05", r"^#!/bin/bash")
    activate = re.search(r"^source (\S+)$", script, re.M)
    assert activate and activate.group(1) == "/opt/aws_neuronx_venv_torch_neuronx_2_14_0/bin/activate"  # the DLAMI's
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    job = (_hub_to_other(script, folder)  # the model: the other tiny Qwen3 for the unreachable hub model
           .replace(activate.group(1), str(Path(sys.prefix) / "bin" / "activate"))  # the venv: this one
           .replace("--nproc-per-node=64", "--nproc-per-node=2")  # the processes: 2 a node, not a trn2's 64
           .replace("--master-port=29500", f"--master-port={_free_port()}")  # the port: a free one on this machine
           .replace(" examples/train.py ", f" {wrap}examples/train.py "))
    assert sum(a != b for a, b in zip(script.splitlines(), job.splitlines())) == 2  # the venv line and srun's line
    return job


def _submit(slurm, folder: Path, name: str, job: str, **env) -> tuple[str, Path]:
    """sbatch ``job`` from its own folder ``name`` (the examples and the models beside it); its number and output."""
    where = folder / name
    where.mkdir()
    (where / "examples").symlink_to(ROOT / "examples")
    (where / "job.sbatch").write_text(job)
    submitted = slurm.run("sbatch", "job.sbatch", cwd=where,
                          env={**_env("standin", folder), "SLURM_CONF": slurm.env["SLURM_CONF"], **env})
    assert submitted.returncode == 0, submitted.stderr
    number = job_id(submitted.stdout)
    return number, where / f"trnlab-{number}.out"  # #SBATCH --output=%x-%j.out, in the submitting folder


def _ranks_on_two_nodes(output: str) -> list[tuple[str, ...]]:
    return sorted(set(re.findall(r"^rank (\d) of 4 \(node (\d)\): (\S+), backend (\w+), (\S+)$", output, re.M)))


RANKS_ON_TWO_NODES = [(str(r), str(r // 2), f"neuron:{r % 2}", "neuron", "DistributedType.MULTI_NEURON")
                      for r in range(4)]


@pytest.fixture(scope="module")
def slurm_job(folder, slurm):
    """The batch script's job, uninterrupted, on the stand-in: its sacct row, output and folder."""
    number, output = _submit(slurm, folder, "slurm-clean", _slurm_job(folder))
    try:
        finished = slurm.wait_for_job(number, timeout=400)
    finally:
        slurm.run("scancel", number)  # nothing is left running if the wait failed
    return finished, output.read_text(), output.parent


@needs_compiler
def test_the_slurm_script_runs_under_a_real_slurm_on_two_nodes(slurm_job):
    """05: the batch script, submitted with sbatch as printed, on tests/slurm_cluster.py's two nodes (stand-in)."""
    finished, output, where = slurm_job
    assert (finished["JobName"], finished["State"], finished["ExitCode"], finished["NNodes"], finished["NodeList"]) \
        == ("trnlab", "COMPLETED", "0:0", "2", "trnlab-node[0-1]"), output[-4000:]
    assert _trained("standin", 4, 1, 32).replace("2 steps", "4 steps") in output
    assert _ranks_on_two_nodes(output) == RANKS_ON_TWO_NODES, output[-4000:]
    assert sorted(p.name for p in (where / "outputs").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


@pytest.mark.own_launch("a job whose rank is killed: its requeue")
@needs_compiler
def test_a_killed_rank_fails_the_slurm_step_and_the_requeued_job_resumes_with_the_same_losses(folder, slurm, slurm_job):
    """05: rank 1 SIGKILLed after step 3 fails the step (srun --kill-on-bad-exit); the script requeues the job, and
    the second start (SLURM_RESTART_COUNT=1) resumes from checkpoint-2 and ends with the uninterrupted job's losses."""
    wrapper = f"{ROOT / 'tests' / 'scripts' / 'paused_rank.py'} "  # rank 1 waits after step 3, for the kill
    number, output = _submit(slurm, folder, "slurm-killed", _slurm_job(folder, wrap=wrapper), PAUSE_AT="1:3")
    try:
        paused = None
        deadline = time.monotonic() + 300
        while paused is None and time.monotonic() < deadline and slurm.queued(number):
            text = output.read_text() if output.exists() else ""
            paused = re.search(r"rank 1 \(pid (\d+)\) logged step 3", text)
            time.sleep(0.2)
        assert paused, output.read_text()[-4000:] if output.exists() else slurm.queued(number)
        os.kill(int(paused.group(1)), signal.SIGKILL)  # the nodes are this machine: the rank's pid is ours to kill
        # Slurm holds the requeued job for the credential lifetime (CRED_EXPIRE) and then starts it by itself.
        # Released early (scontrol update StartTime=now), its second start raced the first one's clean-up here and
        # was killed ("Job credential revoked").
        deadline = time.monotonic() + 120
        while slurm.queued(number) != "PENDING BeginTime" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert slurm.queued(number) == "PENDING BeginTime", output.read_text()[-4000:]
        finished = slurm.wait_for_job(number, timeout=400)
        shown = slurm.run("scontrol", "show", "job", number).stdout  # slurmctld keeps a finished job for MinJobAge
    finally:
        slurm.run("scancel", number)
    text = output.read_text()  # --open-mode=append: both starts, in one file
    assert (finished["State"], finished["ExitCode"]) == ("COMPLETED", "0:0"), text[-4000:]
    assert re.search(r"\bRestarts=1\b", shown) and re.search(r"\bRequeue=1\b", shown), shown
    first, second = text.split(paused.group(0))
    assert "[trnlab] resumed from" not in first
    assert "[trnlab] resumed from checkpoint-2 (step 2), written on tp 4 x fsdp 1, on tp 4 x fsdp 1" in second
    assert _ranks_on_two_nodes(second) == RANKS_ON_TWO_NODES, second[-4000:]
    clean, resumed = _losses(slurm_job[2] / "outputs"), _losses(output.parent / "outputs")
    assert [step for step, _ in resumed] == [1, 2, 3, 4]
    assert all(abs(a - b) <= 1e-6 for (_, a), (_, b) in zip(clean, resumed)), (clean, resumed)


@pytest.mark.own_launch("notebook 06's command, run as printed")
@needs_compiler
def test_notebook_06s_command_runs_with_four_processes(folder):
    """06: one node, 4 processes instead of 64, the other tiny model (~20 s)."""
    line = _hub_to_other(_one("06", r"^torchrun"), folder).replace("--nproc-per-node=64", "--nproc-per-node=4")
    out = _run([line], folder, "standin")
    assert _trained("standin", 4, 1, 16) in out


@pytest.mark.own_launch("the README's launch lines, run as printed")
@needs_compiler
def test_the_readmes_launch_lines_run_as_printed(folder):
    """README: both `python -m trnlab launch` lines, unchanged, on the stand-in (~25 s for the two)."""
    for line in printed_commands("README"):
        out = _run([line], folder, "standin")
        assert _trained("standin", 2, 1, 8) in out, line
        assert "the run finished (exit status 0)" in out


@pytest.mark.parametrize("source, world_size, fsdp_size", [("05", 128, 32), ("06", 64, 16)])
def test_each_cluster_line_gives_its_mesh_as_printed(monkeypatch, source, world_size, fsdp_size):
    """05's two node lines and 06's line, 64 processes a node and Qwen/Qwen3-8B as printed: the mesh and rows that
    each rank's check_mesh gives them; the runs above use fewer processes."""
    lines = [line for line in printed_commands(source) if re.match(r"torchrun .*--nproc-per-node=64 ", line)]
    assert len(lines) == {"05": 2, "06": 1}[source]
    for line in lines:
        assert f"--model {HUB_MODEL} " in line
        assert _mesh_as_printed(line, monkeypatch) == {"tp_size": 4, "fsdp_size": fsdp_size, "rank_batch_size": 1}
        assert os.environ["WORLD_SIZE"] == str(world_size)


def test_check_mesh_refuses_what_would_leave_a_rank_without_rows_or_split_a_key_value_head(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "128")
    with pytest.raises(trnlab.SettingError, match=r"--batch-size 8 does not split over fsdp_size=32 ranks: give a "
                                                  r"multiple of 32"):
        check_mesh("Qwen/Qwen3-8B", 4, batch_size=8)  # notebook 05's old cluster line: 8 // 32 = 0 rows
    with pytest.raises(trnlab.PlanError, match=r"key/value heads = 2.*Use tp_size in \[1, 2\]"):
        check_mesh(None, 4, batch_size=32)  # the bundled model's 2 key/value heads refuse tp=4
