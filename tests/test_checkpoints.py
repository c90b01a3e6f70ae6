"""Checkpoints of a sharded run: examples/train.py on 2 ranks as tp 1 x fsdp 2, on CPU gloo, saves checkpoint-2 and -4;
a rank SIGKILLed after step 3 is restarted by torchrun (``launch --max-restarts 1``) and resumes from checkpoint-2 with
the uninterrupted run's losses; checkpoint-2 resumes on the other mesh of 2 ranks, tp 2 x fsdp 1; checkpoint-4's
model.safetensors loads in one process and generates what the ranks did. The two launches are shared by every test
that reads them. 2 ranks show each of these. Notebook 07 runs them on 4 ranks, tp 2 x fsdp 2, in both of its passes,
and its checked cells show the same on the stand-in: the shards, the steps, the same losses to 1e-6 and the same
text after the restart, and (its stored run) checkpoint-4 in one process. The Slurm tests of
tests/test_printed_commands.py resume a tp 4 x fsdp 1 run on the stand-in.
Bad input (no checkpoint, a damaged one, another model, one folder for two runs, a full disk) runs in one process."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trnlab
from trnlab import distributed as td
from trnlab.models import _BUNDLED_MODEL_DIR

BUNDLED = str(_BUNDLED_MODEL_DIR)  # every test here, whatever TRNLAB_MODEL the suite runs with

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ["examples/train.py", "--dtype", "float32", "--steps", "4", "--save-steps", "2"]
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process says so


def _env(**extra) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}
    env.pop("TRNLAB_NEURON_STANDIN", None)
    env.pop("TRNLAB_MODEL", None)
    return env


def _launch(args: list[str], kill_after: str | None = None, **extra) -> str:
    """``python -m trnlab launch ARGS`` in the repository; with ``kill_after``, SIGKILL the pid of the line that matches
    it. Its output; the run must exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "trnlab", "launch", "--timeout", "600", *args], cwd=ROOT,
                            env=_env(**extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if kill_after and (found := re.search(kill_after, line)):
            os.kill(int(found.group(1)), signal.SIGKILL)
    out = "".join(lines)
    assert proc.wait(timeout=60) == 0, out[-6000:]
    return out


def _losses(run: Path) -> list[tuple[int, float]]:
    state = json.loads((td.checkpoints(run)[-1] / "trainer_state.json").read_text())
    return [(entry["step"], entry["loss"]) for entry in state["log_history"] if "loss" in entry]


@pytest.fixture(scope="session")
def padded(tmp_path_factory) -> Path:
    """The bundled model, its vocabulary padded to 768 rows so 2 ranks split it evenly (notebook 05)."""
    return Path(td.pad_vocabulary(BUNDLED, tmp_path_factory.mktemp("padded") / "model"))


@pytest.fixture(scope="session")
def runs(padded, tmp_path_factory) -> dict:
    """One uninterrupted run and one whose rank 1 is SIGKILLed after step 3."""
    folder = tmp_path_factory.mktemp("checkpoints")
    model = ["--model", str(padded), "--tp-size", "1"]  # 1 x 2: FSDP, its optimizer state sharded too
    clean = _launch(["--nproc-per-node", "2", *TRAIN, *model, "--out", str(folder / "clean")])
    killed = _launch(["--max-restarts", "1", "--nproc-per-node", "2", "tests/scripts/paused_rank.py", *TRAIN, *model,
                      "--out", str(folder / "killed")], kill_after=r"rank 1 \(pid (\d+)\) logged step 3",
                     PAUSE_AT="1:3")
    return {"folder": folder, "clean": clean, "killed": killed, "model": padded}


def test_each_checkpoint_holds_every_ranks_shards_and_a_manifest_of_them(runs):
    checkpoint = runs["folder"] / "clean" / "checkpoint-2"
    manifest = td.check_checkpoint(checkpoint)
    assert manifest["mesh"] == "tp 1 x fsdp 2" and manifest["world_size"] == 2 and manifest["step"] == 2
    shards = sorted(p.name for p in (checkpoint / td.SHARDS).iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert {f"rng_state_{r}.pth" for r in range(2)} | {"scheduler.pt", "model.safetensors", "trainer_state.json",
                                                       "sharded/__1_0.distcp"} <= set(manifest["files"])
    assert [p.name for p in td.checkpoints(runs["folder"] / "clean")] == ["checkpoint-2", "checkpoint-4"]
    assert len(manifest["save_seconds"]) == 2 and all(seconds > 0 for seconds in manifest["save_seconds"])


def test_a_killed_rank_is_restarted_and_the_run_resumes_with_the_same_losses(runs):
    clean, killed = _losses(runs["folder"] / "clean"), _losses(runs["folder"] / "killed")
    assert [step for step, _ in clean] == [1, 2, 3, 4]
    assert [step for step, _ in killed] == [1, 2, 3, 4]
    assert all(abs(a - b) <= 1e-6 for (_, a), (_, b) in zip(clean, killed)), (clean, killed)
    out = runs["killed"]
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 " in out and "--max-restarts=1" in out
    assert "[trnlab] resumed from checkpoint-2 (step 2), written on tp 1 x fsdp 2, on tp 1 x fsdp 2" in out
    assert re.search(r"\[trnlab\] the run finished \(exit status 0\) in [\d.]+ s, after rank 1 failed \(exit status "
                     r"-9: SIGKILL\) and torchrun restarted every rank", out), out[-3000:]
    assert "trained 4 steps on a 1 x 2 (tp x fsdp) mesh of cpu ranks" in out
    assert _greedy(out) == _greedy(runs["clean"])


def _greedy(out: str) -> str:
    return re.search(r"greedy: (.*)", out).group(1)


@pytest.mark.own_launch("a resume on another mesh, read by this test alone")
def test_checkpoint_2_resumes_on_another_mesh(runs, tmp_path):
    shutil.copytree(runs["folder"] / "clean" / "checkpoint-2", tmp_path / "checkpoint-2")
    out = _launch(["--nproc-per-node", "2", *TRAIN, "--model", str(runs["model"]), "--tp-size", "2", "--resume",
                   "--out", str(tmp_path)])
    assert "[trnlab] resumed from checkpoint-2 (step 2), written on tp 1 x fsdp 2, on tp 2 x fsdp 1" in out
    clean, other = _losses(runs["folder"] / "clean"), _losses(tmp_path)
    assert [s for s, _ in other] == [1, 2, 3, 4]
    assert all(abs(a - b) <= 1e-5 * abs(a) for (_, a), (_, b) in zip(clean, other)), (clean, other)


def test_the_last_checkpoint_loads_in_one_process_and_generates_what_the_ranks_did(runs):
    from transformers import AutoModelForCausalLM

    from trnlab import training

    model = AutoModelForCausalLM.from_pretrained(runs["folder"] / "clean" / "checkpoint-4", dtype=torch.float32)
    text = td.greedy_text(model, trnlab.load_tokenizer(str(runs["model"])), training.NEW_FACT_PROMPT)
    assert repr(text) == _greedy(runs["clean"])


# Bad input, in one process: the same callback and checks as the ranks', on the bundled model.

def _trainer(out: Path, name=BUNDLED, steps: int = 2):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from trnlab import training

    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    dataset = training.packed_dataset(trnlab.load_tokenizer(name), training.training_texts(), 96)
    args = TrainingArguments(str(out), max_steps=steps, per_device_train_batch_size=2, save_strategy="steps",
                             save_steps=1, save_only_model=True, use_cpu=True, report_to="none", logging_steps=1,
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    callback = td.sharded_checkpoints(trainer)
    return trainer, callback


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """A one-process run of 2 steps with checkpoint-1 and checkpoint-2 (its lock released)."""
    out = tmp_path_factory.mktemp("one-process") / "run"
    trainer, callback = _trainer(out)
    trainer.train()
    callback.lock.close()
    return out


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns(".trnlab-run.lock"))
    return to


def test_one_process_resumes_with_the_same_losses(one_process, tmp_path):
    out = _copy(one_process, tmp_path / "run")
    shutil.rmtree(out / "checkpoint-2")
    trainer, callback = _trainer(out)
    trainer.train(resume_from_checkpoint=td.latest_checkpoint(out))
    assert _losses(out) == _losses(one_process) and len(_losses(out)) == 2


def test_resume_with_no_checkpoint_says_what_to_do(tmp_path):
    with pytest.raises(td.CheckpointError, match=r"holds no checkpoint-N folder to resume from: run without --resume"):
        td.latest_checkpoint(tmp_path)


def test_a_new_run_refuses_a_folder_that_holds_checkpoints(one_process, tmp_path):
    out = _copy(one_process, tmp_path / "run")
    before = (out / "checkpoint-2" / "model.safetensors").read_bytes()
    trainer, _ = _trainer(out)
    with pytest.raises(td.CheckpointError, match=r"already holds checkpoint-1, checkpoint-2: pass --resume"):
        trainer.train()
    assert (out / "checkpoint-2" / "model.safetensors").read_bytes() == before


def test_a_damaged_checkpoint_is_refused_by_name_and_left_as_it_is(one_process, tmp_path):
    out = _copy(one_process, tmp_path / "run")
    shard = out / "checkpoint-2" / td.SHARDS / "__0_0.distcp"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(td.CheckpointError, match=rf"{re.escape(str(shard))} is {size // 2:,} bytes, {size:,} when it "
                                                 r"was saved: truncated\?.*move it out of the folder"):
        td.latest_checkpoint(out)
    assert shard.stat().st_size == size // 2 and td.check_checkpoint(out / "checkpoint-1")
    state = out / "checkpoint-2" / "trainer_state.json"
    shard.unlink()
    state.write_text(state.read_text().replace('"global_step": 2', '"global_step": 3'))
    with pytest.raises(td.CheckpointError, match=rf"{re.escape(str(shard))} is missing; "
                                                 rf"{re.escape(str(state))} changed since it was saved"):
        td.check_checkpoint(out / "checkpoint-2")


def test_an_unfinished_save_is_set_aside_and_the_one_before_resumes(one_process, tmp_path, capsys):
    out = _copy(one_process, tmp_path / "run")
    (out / "checkpoint-2" / td.MANIFEST).unlink()
    assert td.latest_checkpoint(out) == str(out / "checkpoint-1")
    assert (out / "checkpoint-2.incomplete" / "model.safetensors").is_file()  # renamed, nothing deleted
    assert "its save did not finish): renamed checkpoint-2.incomplete" in capsys.readouterr().out


def test_a_restart_whose_only_checkpoint_is_unfinished_starts_again_from_step_0(one_process, tmp_path):
    out = _copy(one_process, tmp_path / "run")
    shutil.rmtree(out / "checkpoint-2")
    (out / "checkpoint-1" / td.MANIFEST).unlink()  # the first save was cut short
    checkpoint = td.latest_checkpoint(out, required=False)  # what examples/train.py asks when restarted
    assert checkpoint is None and (out / "checkpoint-1.incomplete").is_dir() and not td.checkpoints(out)
    trainer, _ = _trainer(out)
    trainer.train(resume_from_checkpoint=checkpoint)  # the new-run refusal no longer sees a checkpoint
    assert _losses(out) == _losses(one_process)


def test_resuming_an_older_checkpoint_would_overwrite_a_newer_one_and_is_refused(one_process, tmp_path):
    out = _copy(one_process, tmp_path / "run")
    trainer, _ = _trainer(out)
    with pytest.raises(td.CheckpointError, match=r"holds checkpoint-2, newer than checkpoint-1: training on would "
                                                 "overwrite it"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-1"))


def test_a_checkpoint_of_another_model_is_refused(padded, one_process, tmp_path):
    out = _copy(one_process, tmp_path / "run")
    shutil.rmtree(out / "checkpoint-2")
    trainer, _ = _trainer(out, name=str(padded))
    with pytest.raises(td.CheckpointError, match=rf"holds another model \({re.escape(BUNDLED)}\): "
                                                 r"model.embed_tokens.weight is \[761, 192\] there, \[768, 192\] "
                                                 rf"here. Resume with --model {re.escape(BUNDLED)}, or start a new run"):
        trainer.train(resume_from_checkpoint=td.latest_checkpoint(out))


def test_two_runs_cannot_write_one_folder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; from trnlab import "
                               "distributed as td; lock, _ = td._lock_folder(Path(sys.argv[1])); print('held', "
                               "flush=True); sys.stdin.read()", str(tmp_path)], cwd=ROOT, env=_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(td.CheckpointError, match=rf"is in use by another run \(pid {holder.pid} on .*\): wait"):
            _trainer(tmp_path)
    finally:
        holder.communicate("", timeout=60)
    _trainer(tmp_path)[1].lock.close()  # free again once the other run ended


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MiB filesystem (tmpfs): one checkpoint of the bundled model (about 31 MiB) fits, a second does not."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_checkpoint_that_would_not_fit_on_the_disk_is_refused_before_writing(small_disk):
    trainer, callback = _trainer(small_disk / "run")
    with pytest.raises(td.CheckpointError, match=r"checkpoint-2 needs about [\d.]+ MiB \(as checkpoint-1\), and .* "
                                                 r"MiB free: nothing was written. Free some space, then resume"):
        trainer.train()
    callback.lock.close()
    assert [p.name for p in td.checkpoints(small_disk / "run")] == ["checkpoint-1"]
    td.check_checkpoint(small_disk / "run" / "checkpoint-1")


@pytest.mark.own_launch("the README's command, run as printed")
def test_the_readmes_launch_cost_command_splits_each_ranks_cpu_seconds(padded):
    """README, "Tests": `python tools/launch_cost.py -- examples/train.py --model M`, M the padded model (~10 s)."""
    done = subprocess.run([sys.executable, "tools/launch_cost.py", "--", "examples/train.py", "--model", str(padded)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = re.findall(r"^ +(\d) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", done.stdout, re.M)
    assert [rank for rank, *_ in rows] == ["0", "1", "2", "3"], done.stdout  # each rank wrote its marks before finish()
    assert all(float(imports) > 0.1 and float(setup) > 0 and float(training) > 0
               for _, _, imports, setup, training, _ in rows), done.stdout
    assert re.search(r"^rank 0's slowest top-level imports \(cumulative s\): .*\btransformers [\d.]+", done.stdout, re.M)
