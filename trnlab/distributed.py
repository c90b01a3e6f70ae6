"""The sharded model of claim 10: what surrounds ``from_pretrained(distributed_config=...)`` and ``Trainer``.
Notebook 05's script (copied to ``tests/scripts/train_sharded.py``) makes those calls in each rank; this module holds
the logic around them, in a rank and outside (:func:`pad_vocabulary`, :func:`read_run`, the one-process reference)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from trnlab import compat, models
from trnlab.rank_cores import format_core_list
from trnlab.settings import progress_bars

__all__ = ["quiet_rank_output", "pad_vocabulary", "mesh_position", "parameter_placements", "rank_report",
           "global_batches", "shard_of_batch", "build_trainer", "train_single_process",
           "reshard", "batch_loss", "greedy_text", "save_sharded", "write_json", "read_run"]

# Inside a rank: load and describe

def quiet_rank_output() -> None:
    """Silence what would garble four ranks' streamed log and teaches nothing here.
    Progress bars, DTensor's strided-shard all-gather note and FSDP2's returns-a-view warning."""
    import logging

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def _check_multiple(multiple) -> int:
    """``multiple`` as a positive int, or a ValueError that says what to pass."""
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"multiple must be a positive whole number of rows (e.g. 64, or any multiple of "
                         f"tp_size * fsdp_size), not {multiple!r}: the vocabulary is only ever padded, never cut")
    return multiple


def _check_output_folder(output_dir: Path, overwrite: bool) -> None:
    """Refuse a file, the bundled model, or a folder that already holds files (unless ``overwrite``)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"{str(output_dir)!r} is a file, not a folder: pass a new folder for the padded "
                              "model (save_pretrained writes config.json, the weights and the tokenizer there)")
    if output_dir.exists() and models.is_bundled(output_dir):
        raise FileExistsError(f"{str(output_dir)!r} is the course's bundled model: pass a new folder for the "
                              "padded copy (the bundled one is never overwritten)")
    if output_dir.is_dir() and not overwrite and any(output_dir.iterdir()):
        held = sorted(p.name for p in output_dir.iterdir())
        raise FileExistsError(f"{str(output_dir)!r} already holds {', '.join(held[:4])}"
                              f"{', ...' if len(held) > 4 else ''}: pass a new (or empty) folder, or "
                              "overwrite=True to replace what is there")


def pad_vocabulary(name, output_dir, multiple: int = 64, seed: int = 0, overwrite: bool = False) -> str:
    """A copy of model ``name`` whose vocabulary is padded up to a multiple of ``multiple``; returns its folder.
    Uneven vocabulary shards of tied embeddings make sharded training silently diverge (Transformers 5.24, FSDP2). Returns
    ``name`` when it divides already; refuses a non-empty ``output_dir`` unless ``overwrite=True``."""
    multiple = _check_multiple(multiple)
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


def _mesh_of(model):
    """The model's (pp, fsdp, tp) device mesh (Transformers keeps it on the model)."""
    mesh = compat.model_device_mesh(model)
    if mesh is None:
        raise ValueError("this model is not sharded: load it under torchrun with from_pretrained(..., "
                         "distributed_config=DistributedConfig(tp_size=..., fsdp_size=...))")
    return mesh


def mesh_position(model) -> dict:
    """This rank's place: ``rank``, ``world_size``, ``fsdp`` and ``tp`` coordinates.
    The ``fsdp`` coordinate is the data-parallel rank: ranks that share it must see the same batch."""
    import torch.distributed as dist

    mesh = _mesh_of(model)
    names = mesh.mesh_dim_names
    coordinate = dict(zip(names, mesh.get_coordinate()))
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "fsdp": coordinate.get("fsdp", 0), "tp": coordinate.get("tp", 0),
            "fsdp_size": mesh.size(names.index("fsdp")) if "fsdp" in names else 1,
            "tp_size": mesh.size(names.index("tp")) if "tp" in names else 1}


def _index_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2,5-6': which rows or columns of the full weight a rank holds."""
    return format_core_list(indices) or "-"


def _chunk(indices: list[int], parts: int, which: int) -> list[int]:
    # DTensor and FSDP2 split like torch.chunk: ceil-sized pieces, the last one shorter.
    size = -(-len(indices) // parts)
    return indices[which * size:(which + 1) * size]


def _held_indices(param) -> tuple[str, str]:
    """Rows and columns of the full weight that this rank's shard is (all ranks call together).
    Worked out from the placements, then checked against the gathered full weight ("?" if they differ)."""
    from torch.distributed.tensor import Shard
    _StridedShard = compat.strided_shard_class()
    mesh = param.device_mesh
    coordinate = mesh.get_coordinate()
    held = [list(range(n)) for n in param.shape]
    steps = list(enumerate(param.placements))
    ordered = ([s for s in steps if not isinstance(s[1], _StridedShard)]
               + [s for s in steps if isinstance(s[1], _StridedShard)])
    for mesh_dim, placement in ordered:
        if isinstance(placement, (Shard, _StridedShard)):
            held[placement.dim] = _chunk(held[placement.dim], mesh.size(mesh_dim), coordinate[mesh_dim])
    full = param.full_tensor().detach()
    expected = full[held[0]] if full.dim() == 1 else full[held[0]][:, held[1]]
    if expected.shape != param.to_local().shape or not torch.equal(expected, param.to_local().detach()):
        return "?", "?"
    return _index_ranges(held[0]), (_index_ranges(held[1]) if len(held) > 1 else "-")


def parameter_placements(model, with_indices: bool = True) -> list[dict]:
    """One row per parameter of this rank: shapes, placements, bytes held, rows/cols held.
    ``_StridedShard`` is FSDP splitting a dimension TP split already; a missing mesh dimension is a full copy.
    ``with_indices`` adds the ranges of the full weight held here (all ranks must call it together)."""
    from torch.distributed.tensor import DTensor

    rows = []
    for name, param in model.named_parameters():
        if isinstance(param, DTensor):
            local = param.to_local()
            placements = {dim: str(p) for dim, p in zip(param.device_mesh.mesh_dim_names, param.placements)}
        else:
            local, placements = param, {}
        row = {"name": name, "shape": list(param.shape), "local_shape": list(local.shape),
               "placements": placements, "local_bytes": local.numel() * local.element_size(),
               "full_bytes": param.numel() * param.element_size()}
        if with_indices and isinstance(param, DTensor):
            row["rows"], row["cols"] = _held_indices(param)
        rows.append(row)
    return rows


def rank_report(model) -> dict:
    """This rank's position, its parameters' placements, and the parameter bytes it holds.
    ``full_bytes`` is the single-process size of the same parameters (tied weights once)."""
    params = parameter_placements(model)
    return {**mesh_position(model), "parameters": params,
            "local_bytes": sum(p["local_bytes"] for p in params),
            "full_bytes": sum(p["full_bytes"] for p in params)}


# Data: every TP pair sees the same rows, each FSDP rank its own slice

def global_batches(dataset: list[dict], batch_size: int, steps: int) -> list[dict]:
    """``steps`` batches of ``batch_size`` rows, taken in order (cycling), stacked.
    No shuffling, so the sharded run and the single-process reference see identical data."""
    if not dataset:
        raise ValueError("dataset is empty: build it with trnlab.data.packed_dataset(...)")
    out = []
    for step in range(steps):
        rows = [dataset[(step * batch_size + i) % len(dataset)] for i in range(batch_size)]
        out.append({key: torch.stack([r[key] for r in rows]) for key in rows[0]})
    return out


def shard_of_batch(batch: dict, dp_rank: int, dp_size: int) -> dict:
    """The rows of ``batch`` that data-parallel rank ``dp_rank`` (of ``dp_size``) trains on.
    An equal contiguous slice of the global batch; both TP ranks of one FSDP rank get the same slice."""
    size = len(batch["input_ids"])
    if size % dp_size:
        raise ValueError(f"batch of {size} rows does not split over {dp_size} data-parallel ranks: "
                         f"use a batch size that is a multiple of fsdp_size={dp_size}")
    per = size // dp_size
    return {key: value[dp_rank * per:(dp_rank + 1) * per] for key, value in batch.items()}


# Training: Trainer where Accelerate takes the sharded model, a minimal loop on CPU

def build_trainer(model, dataset: list[dict], *, steps: int, batch_size: int, dp_size: int,
                  learning_rate: float, output_dir):
    """A ``Trainer`` around ``model`` with the recipe of notebook 05's script, for the one-process reference.
    ``batch_size`` is the global batch: each of the ``dp_size`` data-parallel ranks gets ``batch_size // dp_size``."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(output_dir), report_to=[], save_strategy="no", max_steps=steps,
        per_device_train_batch_size=batch_size // dp_size, learning_rate=learning_rate,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, logging_steps=1,
        dataloader_drop_last=True, optim="adamw_torch", use_cpu=model.device.type == "cpu",
        train_sampling_strategy="sequential", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    trainer.remove_callback(PrinterCallback)  # it prints every log dict, timings included; callers log losses
    return trainer


def _logged_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def train_single_process(model, dataset: list[dict], *, steps: int, batch_size: int,
                         learning_rate: float = 1e-3, output_dir=None) -> list[float]:
    """The one-process reference: ``Trainer`` with the same recipe, data and global batch; its losses."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trnlab-reference-") as scratch:
        trainer = build_trainer(model, dataset, steps=steps, batch_size=batch_size, dp_size=1,
                                learning_rate=learning_rate, output_dir=output_dir or scratch)
        trainer.train()
    return _logged_losses(trainer)


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
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    reshard(model)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def save_sharded(model, tokenizer, output_dir) -> Path:
    """Save the sharded model as one ordinary checkpoint (call in every rank).
    Rank 0 writes the gathered ``model.safetensors`` and the tokenizer; it loads with plain ``from_pretrained``."""
    import torch.distributed as dist

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


# Outside the run: read what it wrote (the tables and plots are in trnlab.plots)

def read_run(output_dir) -> dict:
    """Read what a run wrote: ``{"ranks": [rank0, rank1, ...], **run.json}``."""
    output_dir = Path(output_dir)
    ranks = sorted((json.loads(p.read_text()) for p in output_dir.glob("rank*.json")),
                   key=lambda r: r["rank"])
    if not ranks:
        raise FileNotFoundError(f"no rank*.json in {output_dir}: did the run finish? (see its log)")
    run_file = output_dir / "run.json"
    return {"ranks": ranks, **(json.loads(run_file.read_text()) if run_file.exists() else {})}
