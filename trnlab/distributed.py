"""The sharded model of claim 10: what surrounds ``from_pretrained(distributed_config=...)`` and ``Trainer``.
Notebook 05's script makes those calls in each rank; this module holds the logic around them, in a rank and outside."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import logging
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from trnlab import _compat, models
from trnlab._compat import cpu_mesh_as_multi_device, is_parallelism_refusal  # a rank script calls them
from trnlab.rank_cores import _format_core_list
from trnlab.settings import SettingError, progress_bars, whole_number

__all__ = ["CheckpointError", "Parity", "batch_loss", "check_checkpoint", "checkpoints", "compare_runs",
           "cpu_mesh_as_multi_device", "finish", "global_batches", "greedy_text", "is_parallelism_refusal",
           "latest_checkpoint", "pad_vocabulary", "parity_recorder", "quiet_rank_output", "rank_report", "read_run",
           "reshard", "save_sharded", "sharded_checkpoints", "train_single_process", "write_json"]


def quiet_rank_output() -> None:
    """Silence what garbles four ranks' log: progress bars, DTensor's all-gather note, FSDP2's view warning."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def finish(code: int = 0) -> None:
    """Close the process groups and end the rank before interpreter teardown, which can abort it (pytorch#190489)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check_output_folder(output_dir: Path, overwrite: bool) -> None:
    """Refuse a file, the bundled model, or a folder that already holds files (unless ``overwrite``)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"{str(output_dir)!r} is a file, not a folder: pass a new folder for the padded "
                              "model (save_pretrained writes config.json, the weights and the tokenizer there)")
    if output_dir.exists() and models._is_bundled(output_dir):
        raise FileExistsError(f"{str(output_dir)!r} is the course's bundled model: pass a new folder for the "
                              "padded copy (the bundled one is never overwritten)")
    if output_dir.is_dir() and not overwrite and any(output_dir.iterdir()):
        held = sorted(p.name for p in output_dir.iterdir())
        raise FileExistsError(f"{str(output_dir)!r} already holds {', '.join(held[:4])}"
                              f"{', ...' if len(held) > 4 else ''}: pass a new (or empty) folder, or "
                              "overwrite=True to replace what is there")


def pad_vocabulary(name, output_dir, multiple: int = 64, seed: int = 0, overwrite: bool = False) -> str:
    """A copy of model ``name`` whose vocabulary is padded up to a multiple of ``multiple``; returns its folder.
    Uneven vocabulary shards of tied embeddings make sharded training silently diverge (Transformers 5.24, FSDP2).
    Returns ``name`` when it divides already; refuses a non-empty ``output_dir`` unless ``overwrite=True``."""
    whole_number("multiple", multiple)  # rows: e.g. 64, or any multiple of tp_size * fsdp_size
    name = models.model_name(name)
    vocab = models.load_config(name).vocab_size
    if vocab % multiple == 0:
        return name
    output_dir = Path(output_dir).expanduser()
    _check_output_folder(output_dir, overwrite)
    torch.manual_seed(seed)
    model = models.load_model(name, device="cpu", dtype=torch.float32)
    model.resize_token_embeddings(pad_to_multiple_of=multiple)
    padded = model.config.vocab_size
    if padded < vocab or padded % multiple:  # resize rounds up; a change there must not cut rows
        raise RuntimeError(f"resize_token_embeddings gave {padded} rows for {vocab} and multiple={multiple}")
    with progress_bars(False):
        model.save_pretrained(output_dir)
    models.load_tokenizer(name).save_pretrained(output_dir)
    saved = models.load_config(output_dir).vocab_size  # save_pretrained only logs its errors: read back
    if saved != padded:
        raise RuntimeError(f"the padded model was not saved to {str(output_dir)!r} (its config says {saved} rows)")
    print(f"vocabulary padded from {vocab} to {padded} rows (a multiple of {multiple})")
    return str(output_dir)


def _mesh_position(model) -> dict:
    """This rank's place: ``rank``, ``world_size``, ``fsdp`` and ``tp`` coordinates (and the mesh's sizes).
    The ``fsdp`` coordinate is the data-parallel rank: ranks that share it must see the same batch."""
    mesh = _compat.model_device_mesh(model)
    if mesh is None:
        raise SettingError("this model is not sharded: load it under torchrun with from_pretrained(..., "
                           "distributed_config=DistributedConfig(tp_size=..., fsdp_size=...))")
    names = mesh.mesh_dim_names
    coordinate = dict(zip(names, mesh.get_coordinate()))
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "fsdp": coordinate.get("fsdp", 0), "tp": coordinate.get("tp", 0),
            "fsdp_size": mesh.size(names.index("fsdp")) if "fsdp" in names else 1,
            "tp_size": mesh.size(names.index("tp")) if "tp" in names else 1}


def _index_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2,5-6': which rows or columns of the full weight a rank holds."""
    return _format_core_list(indices) or "-"


def _chunk(indices: list[int], parts: int, which: int) -> list[int]:
    # DTensor and FSDP2 split like torch.chunk: ceil-sized pieces, the last one shorter.
    size = -(-len(indices) // parts)
    return indices[which * size:(which + 1) * size]


def _held_indices(param) -> tuple[str, str]:
    """Rows and columns of the full weight that this rank's shard is (all ranks call together).
    Worked out from the placements, then checked against the gathered full weight ("?" if they differ)."""
    from torch.distributed.tensor import Shard
    _StridedShard = _compat.strided_shard_class()
    mesh = param.device_mesh
    coordinate = mesh.get_coordinate()
    held = [list(range(n)) for n in param.shape]
    # Plain shards first, then the strided ones (FSDP splitting what TP split already).
    for mesh_dim, placement in sorted(enumerate(param.placements), key=lambda s: isinstance(s[1], _StridedShard)):
        if isinstance(placement, (Shard, _StridedShard)):
            held[placement.dim] = _chunk(held[placement.dim], mesh.size(mesh_dim), coordinate[mesh_dim])
    full = param.full_tensor().detach()
    expected = full[held[0]] if full.dim() == 1 else full[held[0]][:, held[1]]
    if expected.shape != param.to_local().shape or not torch.equal(expected, param.to_local().detach()):
        return "?", "?"
    return _index_ranges(held[0]), (_index_ranges(held[1]) if len(held) > 1 else "-")


def rank_report(model) -> dict:
    """This rank's position, and per parameter its shapes, placements, bytes and the rows/cols of the full weight held.
    ``full_bytes`` is the one-process size (tied weights once); all ranks call it together (it gathers each weight)."""
    from torch.distributed.tensor import DTensor

    params = []
    for name, param in model.named_parameters():
        local, placements, held = param, {}, {}
        if isinstance(param, DTensor):
            local = param.to_local()
            placements = {dim: str(p) for dim, p in zip(param.device_mesh.mesh_dim_names, param.placements)}
            held = dict(zip(("rows", "cols"), _held_indices(param)))
        params.append({"name": name, "shape": list(param.shape), "local_shape": list(local.shape),
                       "placements": placements, "local_bytes": local.numel() * local.element_size(),
                       "full_bytes": param.numel() * param.element_size(), **held})
    return {**_mesh_position(model), "parameters": params,
            "local_bytes": sum(p["local_bytes"] for p in params),
            "full_bytes": sum(p["full_bytes"] for p in params)}


def global_batches(dataset: list[dict], batch_size: int, steps: int) -> list[dict]:
    """``steps`` batches of ``batch_size`` rows, taken in order (cycling), stacked.
    No shuffling, so the sharded run and the single-process reference see identical data."""
    if not dataset:
        raise SettingError("dataset is empty: build it with trnlab.packed_dataset(...)")
    out = []
    for step in range(steps):
        rows = [dataset[(step * batch_size + i) % len(dataset)] for i in range(batch_size)]
        out.append({key: torch.stack([r[key] for r in rows]) for key in rows[0]})
    return out


def train_single_process(model, dataset: list[dict], *, steps: int, batch_size: int,
                         learning_rate: float = 1e-3, output_dir=None) -> list[float]:
    """The one-process reference: ``Trainer`` with the same recipe, data and global batch; its losses.
    The recipe is notebook 05's script's; ``batch_size`` rows a step, taken in order."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    with tempfile.TemporaryDirectory(prefix="trnlab-reference-") as scratch:
        args = TrainingArguments(
            output_dir=str(output_dir or scratch), report_to=[], save_strategy="no", max_steps=steps,
            per_device_train_batch_size=batch_size, learning_rate=learning_rate,
            lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, logging_steps=1,
            dataloader_drop_last=True, optim="adamw_torch", use_cpu=model.device.type == "cpu",
            train_sampling_strategy="sequential", disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=dataset)
        trainer.remove_callback(PrinterCallback)  # it prints every log dict, timings included; callers log losses
        trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def reshard(model) -> None:
    """Put every FSDP-managed module back to its shards (a no-op for unsharded models).
    Call it after a forward without backward: FSDP2 reshards ``keep_full_weight`` modules only in backward, so the next
    training step would compute with stale weights."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def batch_loss(model, batch: dict) -> float:
    """The loss of ``model`` on ``batch`` without training (every rank passes the same batch)."""
    model.eval()
    with torch.no_grad():
        loss = model(**batch).loss.item()
    reshard(model)
    model.train()
    return loss


def greedy_text(model, tokenizer, prompt: str, max_new_tokens: int = 20) -> str:
    """Greedy continuation of ``prompt``; sharded models need every rank to call it together."""
    model.eval()
    # On a device mesh generate all-reduces "finished?" flags on input_ids' device, and the STAND-IN neuron process
    # group (whether TorchNeuron's does is not documented) takes neuron tensors only: inputs on the model's device.
    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    reshard(model)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def save_sharded(model, tokenizer, output_dir) -> Path:
    """Save the sharded model as one ordinary checkpoint (call in every rank).
    Rank 0 writes the gathered ``model.safetensors`` and the tokenizer; it loads with plain ``from_pretrained``."""
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    if dist.get_rank() == 0:
        tokenizer.save_pretrained(output_dir)
    dist.barrier()
    return output_dir


def write_json(data: dict, path) -> Path:
    """Write ``data`` as JSON (each rank writes its own file; the notebook reads them all)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def read_run(output_dir) -> dict:
    """Read what a run wrote: ``{"ranks": [rank0, rank1, ...], **run.json}``."""
    output_dir = Path(output_dir)
    ranks = sorted((json.loads(p.read_text()) for p in output_dir.glob("rank*.json")), key=lambda r: r["rank"])
    if not ranks:
        raise FileNotFoundError(f"no rank*.json in {output_dir}: did the run finish? (see its log)")
    run_file = output_dir / "run.json"
    return {"ranks": ranks, **(json.loads(run_file.read_text()) if run_file.exists() else {})}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def parity_recorder(names, record: list):
    """A ``Trainer`` callback: per optimizer step, this rank's loss, local gradient norm and updates of ``names``.
    Each step appends ``{"step", "loss", "grad_norm", "update": {name: norm}}`` to ``record``, for :func:`compare_runs`."""
    from transformers import TrainerCallback

    class ParityRecorder(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads = [_local(p.grad).detach().float() for p in model.parameters() if p.grad is not None]
            params = dict(model.named_parameters())
            self.before = {name: _local(params[name]).detach().float().cpu().clone() for name in names}
            record.append({"step": state.global_step + 1, "grad_norm": math.sqrt(sum(g.square().sum().item()
                                                                                     for g in grads))})

        def on_optimizer_step(self, args, state, control, model=None, **kwargs):
            params = dict(model.named_parameters())
            record[-1]["update"] = {name: (_local(params[name]).detach().float().cpu() - old).norm().item()
                                    for name, old in self.before.items()}

        def on_log(self, args, state, control, logs=None, **kwargs):
            if record and "loss" in (logs or {}):
                record[-1]["loss"] = logs["loss"]

    return ParityRecorder()


@dataclasses.dataclass
class Parity:
    """What :func:`compare_runs` found: how many values it compared, the largest relative difference, the first miss."""

    compared: int
    largest: float
    tolerance: float
    first_difference: str | None = None

    @property
    def ok(self) -> bool:
        return self.compared > 0 and self.first_difference is None

    def __str__(self) -> str:
        if self.first_difference:
            return f"differ first at {self.first_difference} (tolerance {self.tolerance:g}, relative)"
        return (f"{self.compared} values (per rank and step: loss, gradient norm, updates) within {self.tolerance:g}, "
                f"relative; largest difference {self.largest:.1e}")


def compare_runs(a: dict, b: dict, tolerance: float = 1e-4) -> Parity:
    """Compare two runs' :func:`parity_recorder` records (``read_run`` of each) rank by rank, step by step.
    Both must have the same ranks and steps; the first value off by more than ``tolerance`` (relative) is named."""
    if len(a["ranks"]) != len(b["ranks"]):
        raise SettingError(f"the runs have {len(a['ranks'])} and {len(b['ranks'])} ranks: compare runs of one mesh")
    found = Parity(0, 0.0, tolerance)
    for ra, rb in zip(a["ranks"], b["ranks"]):
        sa, sb = ra.get("parity", []), rb.get("parity", [])
        if not sa or len(sa) != len(sb):
            raise SettingError(f"rank {ra['rank']} recorded {len(sa)} and {len(sb)} steps: run both with the same "
                               "--steps (the script records them with trnlab.distributed.parity_recorder)")
        for x, y in zip(sa, sb):
            values = [("loss", x["loss"], y["loss"]), ("gradient norm", x["grad_norm"], y["grad_norm"])]
            values += [(f"update of {name}", x["update"][name], y["update"][name]) for name in x["update"]]
            for what, u, v in values:
                difference = abs(u - v) / max(abs(u), abs(v), 1e-12)
                found.compared, found.largest = found.compared + 1, max(found.largest, difference)
                if difference > tolerance and found.first_difference is None:
                    found.first_difference = f"rank {ra['rank']}, step {x['step']}, {what}: {u:.6g} against {v:.6g}"
    return found


# Checkpoints of a sharded run. Transformers 5.25's Trainer saves only the weights of a model sharded at load time
# and cannot load them back; torch.distributed.checkpoint saves every rank's shards of the model and the optimizer,
# and reloads them on another mesh too (tests/test_checkpoints.py).
SHARDS = "sharded"  # in each checkpoint-N: torch.distributed.checkpoint's files, one per rank and .metadata
MANIFEST = "manifest.json"  # written last: each file's size and sha256, the mesh, the parameters' shapes
_LOCK = ".trnlab-run.lock"  # held by rank 0 while a run writes the folder


class CheckpointError(RuntimeError):
    """A checkpoint this run cannot resume from or would overwrite; the message names the file and what to do."""


def _rank() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _agreed(value):
    """Rank 0's ``value``, on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gathered(value) -> list:
    """Every rank's ``value``, in rank order, on every rank."""
    if not dist.is_initialized():
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _step(folder: Path) -> int:
    return int(folder.name.removeprefix("checkpoint-"))


def checkpoints(output_dir) -> list[Path]:
    """The ``checkpoint-N`` folders of ``output_dir``, oldest first."""
    found = Path(output_dir).glob("checkpoint-*")
    return sorted((p for p in found if p.is_dir() and p.name.removeprefix("checkpoint-").isdigit()), key=_step)


def check_checkpoint(folder) -> dict:
    """The manifest of a complete, unchanged checkpoint (call in every rank: each reads its share of the files).
    Raises :class:`CheckpointError` naming a missing, truncated or changed file."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise CheckpointError(f"{folder} has no {MANIFEST}: it is not a checkpoint this course's runs wrote, or "
                              "its save did not finish")
    manifest = json.loads((folder / MANIFEST).read_text())
    rank, world = _rank()
    problems = []
    for name in sorted(manifest["files"])[rank::world]:
        size, digest = manifest["files"][name]
        path = folder / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != size:
            problems.append(f"{path} is {path.stat().st_size:,} bytes, {size:,} when it was saved: truncated?")
        elif _sha256(path) != digest:
            problems.append(f"{path} changed since it was saved (its sha256 differs)")
    problems = sorted(sum(_gathered(problems), []))
    if problems:
        raise CheckpointError(f"{folder} is damaged: {'; '.join(problems)}. Nothing was loaded; move it out of the "
                              "folder to resume from the checkpoint before it")
    return manifest


def latest_checkpoint(output_dir, required: bool = True) -> str | None:
    """The newest checkpoint of ``output_dir``, checked (call in every rank), for ``train(resume_from_checkpoint=)``.
    One whose save did not finish (no manifest) is renamed ``*.incomplete``, not deleted; a damaged one is refused.
    None is refused unless ``required=False`` (a restart before the first save: it starts again from step 0)."""
    folders = checkpoints(output_dir)
    if not folders and not required:
        return None
    if not folders:
        raise CheckpointError(f"{output_dir} holds no checkpoint-N folder to resume from: run without --resume "
                              "first, with --save-steps, or give the --out of the run to resume")
    newest = folders[-1]
    if not (newest / MANIFEST).is_file():
        if _rank()[0] == 0:
            newest.rename(newest.with_name(newest.name + ".incomplete"))
            print(f"[trnlab] {newest} has no {MANIFEST} (its save did not finish): renamed "
                  f"{newest.name}.incomplete, resuming from the one before", flush=True)
        if dist.is_initialized():
            dist.barrier()
        return latest_checkpoint(output_dir, required)
    check_checkpoint(newest)
    return str(newest)


def _full_shapes(model) -> dict[str, list[int]]:
    return {name: list(p.shape) for name, p in model.named_parameters()}  # a DTensor's shape is the full one


def _mesh_text(model) -> str:
    """``tp 2 x fsdp 2``: the model's mesh, or ``one process``."""
    mesh = _compat.model_device_mesh(model)
    sizes = dict(zip(getattr(mesh, "mesh_dim_names", None) or (), getattr(mesh, "shape", ())))
    return f"tp {sizes.get('tp', 1)} x fsdp {sizes.get('fsdp', 1)}" if sizes else "one process"


def _lock_folder(output_dir: Path):
    """An open file holding ``output_dir``'s lock while this process lives, or ``(None, who holds it)``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    lock = open(output_dir / _LOCK, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        return None, holder
    lock.seek(0), lock.truncate()
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}"), lock.flush()
    return lock, None


def _space_problem(output_dir: Path, step: int) -> str | None:
    """Why checkpoint ``step`` would not fit on ``output_dir``'s disk, judged by the last one's size; else ``None``."""
    done = [p for p in checkpoints(output_dir) if (p / MANIFEST).is_file()]
    if not done:
        return None  # nothing to judge by: a full disk fails the first save, which resuming then skips
    need = sum(size for size, _ in json.loads((done[-1] / MANIFEST).read_text())["files"].values())
    free = shutil.disk_usage(output_dir).free
    if need * 1.1 <= free:
        return None
    return (f"checkpoint-{step} needs about {need / 2**20:,.1f} MiB (as {done[-1].name}), and {output_dir} has "
            f"{free / 2**20:,.1f} MiB free: nothing was written. Free some space, then resume from {done[-1].name}")


def sharded_checkpoints(trainer):
    """Let ``trainer`` checkpoint and resume a model sharded at load time (call in every rank, before ``train``).
    Each ``checkpoint-N`` gets the model's and optimizer's shards (``torch.distributed.checkpoint``), the scheduler,
    each rank's RNG and a manifest; ``train(resume_from_checkpoint=)`` loads them, on this mesh or another."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from transformers import TrainerCallback

    output_dir, rank = Path(trainer.args.output_dir), _rank()[0]

    class ShardedCheckpoints(TrainerCallback):
        resume_from = lock = None

        def resuming(self, path, model=None):  # what Trainer calls first to load a checkpoint's weights
            if self.resume_from == Path(path):
                return
            self.resume_from = Path(path)
            manifest = check_checkpoint(self.resume_from)
            theirs, ours = manifest["parameters"], _full_shapes(trainer.model)
            if theirs != ours:
                name = next((n for n in ours if theirs.get(n) != ours[n]), None) or next(n for n in theirs)
                raise CheckpointError(f"{self.resume_from} holds another model ({manifest['model']}): {name} is "
                                      f"{theirs.get(name)} there, {ours.get(name)} here. Resume with --model "
                                      f"{manifest['model']}, or start a new run in another --out")
            newer = _agreed([p.name for p in checkpoints(output_dir) if _step(p) > _step(self.resume_from)])
            if newer:
                raise CheckpointError(f"{output_dir} holds {', '.join(newer)}, newer than {self.resume_from.name}: "
                                      "training on would overwrite it. Resume from the newest, or copy this one "
                                      "to another --out")
            self.written_on = manifest["mesh"]

        def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            if self.resume_from is None:
                if args.save_strategy != "no" and (done := _agreed([p.name for p in checkpoints(output_dir)])):
                    raise CheckpointError(f"{output_dir} already holds {', '.join(done)}: pass --resume to go on "
                                          "from the newest, or give a new run another --out")
                return
            model_state, optim_state = get_state_dict(model, optimizer)
            state_dict = {"model": model_state, "optim": optim_state}
            dcp.load(state_dict, checkpoint_id=self.resume_from / SHARDS)
            set_state_dict(model, optimizer, model_state_dict=state_dict["model"],
                           optim_state_dict=state_dict["optim"])
            lr_scheduler.load_state_dict(torch.load(self.resume_from / "scheduler.pt", weights_only=True))
            if rank == 0:
                print(f"[trnlab] resumed from {self.resume_from.name} (step {_step(self.resume_from)}), written on "
                      f"{self.written_on}, on {_mesh_text(model)}", flush=True)

        def on_step_end(self, args, state, control, **kwargs):
            if control.should_save and (problem := _agreed(_space_problem(output_dir, state.global_step)
                                                           if rank == 0 else None)):
                raise CheckpointError(problem)

        def on_save(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            folder, start = output_dir / f"checkpoint-{state.global_step}", time.perf_counter()
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder / SHARDS)
            _, world = _rank()
            # Trainer's own name and keys, so Trainer restores the RNG where its data order needs it
            rng_name = f"rng_state_{rank}.pth" if world > 1 else "rng_state.pth"
            torch.save({"python": random.getstate(), "numpy": np.random.get_state(),
                        "cpu": torch.random.get_rng_state()}, folder / rng_name)
            mine = [rng_name, *(p.relative_to(folder).as_posix() for p in (folder / SHARDS).glob(f"__{rank}_*"))]
            if rank == 0:
                torch.save(lr_scheduler.state_dict(), folder / "scheduler.pt")
                mine += [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                         and not p.name.startswith(("rng_state", "__")) and p.name != MANIFEST]
            mine = [(n, [(folder / n).stat().st_size, _sha256(folder / n)]) for n in mine]
            parts = _gathered((mine, round(time.perf_counter() - start, 3)))
            if rank == 0:
                manifest = {"step": state.global_step, "model": getattr(model, "name_or_path", ""),
                            "world_size": world, "mesh": _mesh_text(model),
                            "files": dict(pair for files, _ in parts for pair in files),
                            "save_seconds": [seconds for _, seconds in parts],  # per rank: its shards, RNG, sha256
                            "parameters": _full_shapes(model)}
                (folder / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1))
                (folder / (MANIFEST + ".tmp")).replace(folder / MANIFEST)  # all or nothing
            if dist.is_initialized():
                dist.barrier()

    callback = ShardedCheckpoints()
    if rank == 0:  # two runs writing one folder would overwrite each other's checkpoints
        callback.lock, holder = _lock_folder(output_dir)
    if (holder := _agreed(holder if rank == 0 else None)) is not None:
        raise CheckpointError(f"{output_dir} is in use by another run ({holder}): wait for it to end, or give this "
                              "run another --out")
    _compat.on_trainer_resume(trainer, callback.resuming)
    trainer.add_callback(callback)
    return callback
