"""A model as the planner reads it: its config, its parameters, and the piece of each one rank holds.
:func:`model_spec` builds the model on the meta device once (exact shapes, no memory); :func:`parameter_shards` splits
every parameter as Transformers does: the model's TP plan, then FSDP2 on dim 0, padded."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from trnlab.instances import PlanError
from trnlab.mesh import tp_misfits, tp_sizes_that_fit
from trnlab.models import (SHIPPED_MODELS, config_from_dict, is_config, load_config, model_name, read_config_file,
                           shipped_config, text_config)

__all__ = ["REQUIRED_FIELDS", "ModelSpec", "TensorShard", "config_and_label", "model_spec", "parameter_shards",
           "tp_problem"]


# Model configs

#: Fields the planner reads from a config; a config without one of them cannot be planned.
REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "vocab_size")

#: Appended to a "lacks ..." message: what the planner needs.
_NEEDS = (f": the planner needs {', '.join(REQUIRED_FIELDS + ('model_type',))} (head_dim defaults to "
          f"hidden_size / num_attention_heads).")


def _check_fields(config, where: str):
    """The config, if it has every field the planner reads; else a PlanError naming the missing ones."""
    missing = [f for f in REQUIRED_FIELDS if getattr(text_config(config), f, None) is None]
    if missing:
        raise PlanError(f"{where} lacks {', '.join(missing)}")
    return config


def config_and_label(model=None) -> tuple:
    """``(config, label)`` for ``model`` as the planner reads it: the config and the name its plans show.
    ``model``: a config, a dict, a shipped name (``"Qwen/Qwen3-8B"``, offline), a folder or config JSON, a hub name or
    ``None`` (the course model). A config missing a field of :data:`REQUIRED_FIELDS` raises :class:`PlanError`."""
    if is_config(model):
        config = _check_fields(model, f"config {type(model).__name__}")
        return config, str(getattr(model, "name_or_path", "") or model.model_type)
    if isinstance(model, dict):
        return config_from_dict(dict(model), "the config dict", REQUIRED_FIELDS, _NEEDS), "config dict"
    name = model_name(None if model is None else str(model))
    shipped = shipped_config(name)
    if shipped is not None:
        return shipped, shipped.name_or_path
    path = Path(name).expanduser()
    if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
        config = read_config_file(path if path.is_file() else path / "config.json", REQUIRED_FIELDS, _NEEDS)
        config.name_or_path = str(path)
        return config, str(path)
    if path.is_dir():
        raise PlanError(f"{path} has no config.json")
    try:
        config = load_config(name)   # offline-aware: fails fast without the hub
    except (OSError, ValueError) as exc:
        raise PlanError(f"no config for {name!r}: it is not one of the shipped configs "
                        f"({', '.join(SHIPPED_MODELS)}), not a local folder or config.json, and "
                        f"the hub did not give it ({exc})") from exc
    return _check_fields(config, f"config of {name!r}"), name


# Parameters as Transformers shards them

#: TP styles (Transformers' ALL_PARALLEL_STYLES) -> which dim of a weight they split.
#: "first": dim 0 of a 1-D/2-D weight (Shard(ndim - 2)); "last": the last dim; None: replicated.
_COLWISE = {"colwise", "colwise_rep", "colwise_gather_output", "packed_colwise"}
_ROWWISE = {"rowwise", "rowwise_split_input", "rowwise_rep", "packed_rowwise"}
_REPLICATED = {"replicated_with_grad_allreduce", "replicate", "all_reduce", "sequence_parallel",
               "local_params"}


def _tp_split_dim(style: str | None, param_name: str, ndim: int) -> int | None:
    """The dim a TP style splits a weight along (None: replicated); an unknown style is a PlanError."""
    if style is None or style in _REPLICATED:
        return None
    if style in _COLWISE:
        return (ndim - 2) % ndim          # ColwiseParallel.shard_param: Shard(ndim - 2)
    if style in _ROWWISE:
        return None if param_name.endswith("bias") else ndim - 1   # bias replicated
    if style == "embedding_rowwise":
        return 0
    if style == "embedding_colwise":
        return 1
    raise PlanError(f"TP style {style!r} (on {param_name}) is not modelled by the planner "
                    f"(dense models only: colwise, rowwise, embedding, replicated styles)")


def _generic(name: str) -> str:
    """A parameter name with its layer numbers as ``*``, the way TP plans name them."""
    # Transformers' replace_layer_number_by_wildcard: "layers.3.mlp" -> "layers.*.mlp".
    return re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name)


def _style_of(param_name: str, plan: dict) -> str | None:
    """The TP style the model's plan gives a parameter, or None."""
    # Transformers' _get_parameter_plan: the parameter's own rule, else its module's.
    generic = _generic(param_name)
    if generic in plan:
        return plan[generic]
    module = generic.rsplit(".", 1)[0] if "." in generic else None
    return plan.get(module) if module else None


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs from a model, read once from the model built on the meta device.
    ``params``: ``(name, shape, tp_style, layer or None)`` per parameter (tied weights once); ``keep_full``: what
    FSDP keeps gathered after forward; ``dims``: hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, ..."""

    params: tuple
    keep_full: frozenset
    dims: dict

    @property
    def parameter_count(self) -> int:
        """Parameters of the whole model (tied weights once)."""
        return sum(math.prod(shape) for _name, shape, _style, _layer in self.params)

    def shards(self, tp: int, fsdp: int) -> list[TensorShard]:
        """The piece of every parameter one rank holds under ``(tp, fsdp)`` (the largest rank's, padded)."""
        out = []
        for name, shape, style, _layer in self.params:
            dim = _tp_split_dim(style, name, len(shape)) if tp > 1 else None
            tp_shape = list(shape)
            if dim is not None:
                tp_shape[dim] = -(-shape[dim] // tp)
            local = list(tp_shape)
            if fsdp > 1 and local:
                local[0] = -(-local[0] // fsdp)   # FSDP2: Shard(0) of the local piece, padded to ceil
            out.append(TensorShard(name, tuple(shape), style if tp > 1 else None, tuple(tp_shape), tuple(local)))
        return out


@lru_cache(maxsize=32)
def _spec_from_json(config_json: str, model_type: str) -> ModelSpec:
    """Build the model on the meta device from its config values and read its :class:`ModelSpec` (cached)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **json.loads(config_json))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    plan = dict(model.tp_plan or {})
    fsdp_plan = dict(model.fsdp_plan or {})
    text = text_config(config)
    params = []
    for name, p in model.named_parameters():   # tied weights appear once
        layer = re.search(r"\.layers\.(\d+)\.", name)
        params.append((name, tuple(p.shape), _style_of(name, plan), int(layer.group(1)) if layer else None))
    keep = set()
    for module_name, style in fsdp_plan.items():
        if style != "keep_full_weight" or "*" in module_name:
            continue
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            continue
        ids = {id(p) for p in module.parameters()}
        keep |= {n for n, p in model.named_parameters() if id(p) in ids}
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    dims = {"hidden": text.hidden_size, "intermediate": text.intermediate_size,
            "layers": text.num_hidden_layers, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "vocab": text.vocab_size, "q_dim": heads * head_dim, "kv_dim": kv_heads * head_dim,
            "max_position_embeddings": getattr(text, "max_position_embeddings", None), "has_tp_plan": bool(plan)}
    return ModelSpec(tuple(params), frozenset(keep), dims)


def model_spec(config, tp_size: int = 1) -> ModelSpec:
    """The :class:`ModelSpec` of a config (cached), refusing ``tp_size`` > 1 for a model without a TP plan."""
    values = config.to_dict()   # to_dict() writes the name as "_name_or_path": not part of the shapes
    for key in ("_name_or_path", "transformers_version", "architectures", "distributed_config", "model_type"):
        values.pop(key, None)
    spec = _spec_from_json(json.dumps(values, sort_keys=True, default=str), config.model_type)
    if tp_size > 1 and not spec.dims["has_tp_plan"]:
        raise PlanError(f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan): use tp_size=1")
    return spec


@dataclass(frozen=True)
class TensorShard:
    """One parameter: full shape, TP style, and the piece one rank holds (largest rank, FSDP-padded)."""

    name: str
    shape: tuple
    tp_style: str | None
    tp_shape: tuple      # after tensor parallelism (ceil: the first ranks hold the bigger piece)
    local_shape: tuple   # after FSDP2 on dim 0 of the TP piece, padded: ceil(rows / fsdp) rows

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def local_numel(self) -> int:
        return math.prod(self.local_shape)

    @property
    def tp_numel(self) -> int:
        return math.prod(self.tp_shape)

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "tp_style": self.tp_style,
                "tp_shape": list(self.tp_shape), "local_shape": list(self.local_shape)}


def parameter_shards(config=None, tp_size: int = 1, fsdp_size: int = 1) -> list[TensorShard]:
    """Every parameter of the model and the piece of it one rank holds under ``(tp_size, fsdp_size)``.
    Split by the model's ``tp_plan`` (colwise: output rows, rowwise: input columns, embedding and lm_head: vocabulary,
    norms replicated), then by FSDP2 on dim 0, padded to ``ceil(rows / fsdp_size)``. Tied embeddings appear once."""
    config, _ = config_and_label(config)
    return model_spec(config, tp_size).shards(tp_size, fsdp_size)


# Can the model take a tensor-parallel size

def _tp_dims(d: dict) -> dict:
    """The planner's dims under the config names :mod:`trnlab.mesh` checks tensor parallelism with."""
    return {"num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"],
            "intermediate_size": d["intermediate"]}


def tp_problem(dims: dict, tp: int, world: int | None = None, where: str = "") -> str | None:
    """Why a model (its :attr:`ModelSpec.dims`) cannot take tensor-parallel size ``tp``, or None.
    Each TP rank needs whole heads and an equal MLP slice; with ``world`` the suggested sizes also divide the world."""
    tp_dims = _tp_dims(dims)
    bad = [f"{label} = {value}" for _, label, value in tp_misfits(tp_dims, tp)]
    if not bad:
        return None
    ok = tp_sizes_that_fit(tp_dims, world or dims["kv_heads"])
    on = f" on {where} ({world} ranks), with fsdp_size = {world} // tp_size" if world else ""
    return (f"tp_size={tp} does not divide the model's {', '.join(bad)}: each tensor-parallel rank must get "
            f"whole heads and an equal slice. Use tp_size in {ok}{on}.")
