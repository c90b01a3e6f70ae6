"""Plan a real run: the bytes one rank holds (:func:`plan_memory`) and the ``(tp, fsdp)`` mesh that fits a Trainium
instance, with why (:func:`plan_mesh`). Parameters are split exactly as Transformers shards them (the model built on the
meta device); activations are estimates (the ``*_FORMULA`` constants). Notebook 06 and ``python -m trnlab plan``."""

from __future__ import annotations

import bisect
import json
import math
import re
from collections import namedtuple
from dataclasses import dataclass, field, replace
from functools import lru_cache

from trnlab.launcher import (GiB, INSTANCES, Instance, _divisors, _tp_dimensions, _tp_problem as _launcher_tp_problem,
                             _tp_sizes_that_fit, get_instance, validate_parallel_sizes)
from trnlab.models import SHIPPED_MODELS, load_config
from trnlab.settings import _DEFAULT_INSTANCE, PlanError, whole_number

__all__ = ["BACKWARD_PER_FORWARD", "CHECKPOINTING", "INFERENCE_ACTIVATION_FORMULA", "SELECTIVE_ACTIVATION_FORMULA",
           "TRAIN_ACTIVATION_FORMULA", "MemoryPlan", "MeshCandidate", "MeshPlan", "TensorShard", "format_plan",
           "plan_memory", "plan_mesh", "plot_memory_plan", "recompute_fraction"]


def _config(model):
    """The config a plan reads, its fields checked; a model that is neither here nor on the hub is a PlanError."""
    try:
        return load_config(model, required=True)
    except OSError as exc:
        raise PlanError(f"no config for {model!r}: it is not one of the shipped configs ({', '.join(SHIPPED_MODELS)}), "
                        f"not a local folder holding config.json, and the hub did not give it ({exc})") from exc


def _choice(value, table: dict, error: str):
    """``table[value]`` (a string stripped and lowered first), else a PlanError saying ``error``."""
    try:
        return table[value.strip().lower() if isinstance(value, str) else value]
    except (KeyError, TypeError):
        raise PlanError(error) from None


# The model as Transformers shards it

#: TP styles (Transformers' ALL_PARALLEL_STYLES) by the dim of a weight they split; the others are replicated.
_COLWISE = {"colwise", "colwise_rep", "colwise_gather_output", "packed_colwise"}
_ROWWISE = {"rowwise", "rowwise_split_input", "rowwise_rep", "packed_rowwise"}
_REPLICATED = {"replicated_with_grad_allreduce", "replicate", "all_reduce", "sequence_parallel", "local_params"}


def _tp_split_dim(style: str | None, param_name: str, ndim: int) -> int | None:
    """The dim a TP style splits a weight along (None: replicated); an unknown style is a PlanError."""
    if style is None or style in _REPLICATED:
        return None
    if style in _COLWISE:
        return (ndim - 2) % ndim          # ColwiseParallel.shard_param: Shard(ndim - 2)
    if style in _ROWWISE:
        return None if param_name.endswith("bias") else ndim - 1   # bias replicated
    if style in ("embedding_rowwise", "embedding_colwise"):
        return int(style == "embedding_colwise")
    raise PlanError(f"TP style {style!r} (on {param_name}) is not modelled by the planner "
                    f"(dense models only: colwise, rowwise, embedding, replicated styles)")


def _style_of(param_name: str, plan: dict) -> str | None:
    """The TP style the model's plan gives a parameter (its own rule, else its module's), or None."""
    # Transformers' replace_layer_number_by_wildcard ("layers.3.mlp" -> "layers.*.mlp"), then _get_parameter_plan.
    generic = re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), param_name)
    return plan.get(generic) or plan.get(generic.rsplit(".", 1)[0])


#: One parameter: full shape, TP style, and the piece one rank holds (the largest rank's): ``tp_shape`` after tensor
#: parallelism (ceil: the first ranks hold the bigger piece), ``local_shape`` after FSDP2 on its dim 0, padded to ceil.
TensorShard = namedtuple("TensorShard", "name shape tp_style tp_shape local_shape")
#: What the planner reads once from the model built on the meta device: ``params`` as ``(name, shape, tp_style, layer
#: or None)`` (tied weights once), ``keep_full`` (what FSDP keeps gathered), ``dims`` (hidden, heads, ...).
_ModelSpec = namedtuple("_ModelSpec", "params keep_full dims")


def _shards(spec: _ModelSpec, tp: int, fsdp: int) -> list[TensorShard]:
    """The piece of every parameter one rank holds under ``(tp, fsdp)`` (the largest rank's, padded)."""
    out = []
    for name, shape, style, _layer in spec.params:
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
def _spec_from_json(config_json: str, model_type: str) -> _ModelSpec:
    """Build the model on the meta device from its config values and read its :class:`_ModelSpec` (cached)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **json.loads(config_json))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    plan, text = dict(model.tp_plan or {}), config.get_text_config()
    params = []
    for name, p in model.named_parameters():   # tied weights appear once
        layer = re.search(r"\.layers\.(\d+)\.", name)
        params.append((name, tuple(p.shape), _style_of(name, plan), int(layer.group(1)) if layer else None))
    keep = set()
    for module_name, style in (model.fsdp_plan or {}).items():
        if style == "keep_full_weight" and "*" not in module_name:
            try:
                ids = {id(p) for p in model.get_submodule(module_name).parameters()}
            except AttributeError:
                continue
            keep |= {n for n, p in model.named_parameters() if id(p) in ids}
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    dims = {"hidden": text.hidden_size, "intermediate": text.intermediate_size,
            "layers": text.num_hidden_layers, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "vocab": text.vocab_size, "q_dim": heads * head_dim, "kv_dim": kv_heads * head_dim,
            "max_position_embeddings": getattr(text, "max_position_embeddings", None), "has_tp_plan": bool(plan)}
    return _ModelSpec(tuple(params), frozenset(keep), dims)


def _model_spec(config) -> _ModelSpec:
    """The :class:`_ModelSpec` of a config (cached on its values)."""
    values = config.to_dict()   # to_dict() writes the name as "_name_or_path": not part of the shapes
    for key in ("_name_or_path", "transformers_version", "architectures", "distributed_config", "model_type"):
        values.pop(key, None)
    return _spec_from_json(json.dumps(values, sort_keys=True, default=str), config.model_type)


def _tp_problem(config, tp: int, world: int | None = None, where: str = "") -> str | None:
    """The launcher's tensor-parallel check, its advice said for a plan ``on {where}``."""
    return _launcher_tp_problem(config, tp, world, f" on {where} ({world} ranks), with fsdp_size = {world} // tp_size"
                                if world else "")


# The memory of one rank

_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}   # bytes per element
_DTYPE_NAMES = {**{name: name for name in _DTYPES}, "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

#: What a rank's memory is made of, in table order: ``{component: (label, short label for a column)}``.
_COMPONENTS = {"parameters": ("parameters (this rank's shards)", "params"), "gradients": ("gradients", "grads"),
               "optimizer": ("optimizer state (AdamW moments + step)", "optim"),
               "fsdp_buffers": ("FSDP all-gather buffers (estimate)", "fsdp buf"),
               "activations": ("activations (estimate)", "activ."), "kv_cache": ("static KV cache", "kv cache")}

#: The training activation estimate of :func:`plan_memory`. T = batch*seq tokens of this rank's micro-batch, b = dtype
#: bytes, h = hidden_size, q = heads*head_dim, kv = kv_heads*head_dim, i = intermediate_size, V = vocab_size, L = layers.
TRAIN_ACTIVATION_FORMULA = (
    "per layer, bytes saved for backward = T*[(8 + 4b)*h + ((4 + 3b)*(q + kv) + 4b*i + 8*heads + "
    "4*kv_heads)/tp + 8] (counted on Qwen3 with SDPA attention: RMSNorm saves its input upcast to "
    "fp32; the h-wide residual-stream tensors are whole on every TP rank, head- and MLP-wide ones "
    "are split by tp); x L layers, or with gradient checkpointing T*b*h per layer (each layer's "
    "input) + one layer recomputed; plus the loss head T*[(4 + 2b)*h + V*(b + 8)] (logits in the "
    "compute dtype, their fp32 copy and fp32 log-probs: lm_head gathers all V logits on every TP rank)")
#: The inference activation estimate :func:`plan_memory` computes (symbols as in :data:`TRAIN_ACTIVATION_FORMULA`).
INFERENCE_ACTIVATION_FORMULA = (
    "generate's prefill under no_grad frees each layer's temporaries: about one layer's worth, "
    "T*b*(2h + max(2q + 2kv, 3i)/tp), plus the last position's logits batch*V*(b + 4) "
    "(generate keeps an fp32 copy); attention assumed fused (SDPA/flash: no T x T score matrix)")
#: Selective checkpointing as the planner models it: TorchTitan's layer-level selective AC, ``selective_ac_option = "2"``.
#: An assumption: the option AWS's ``qwen3_8b_tp4_fsdp16_sac`` config sets was not found.
SELECTIVE_ACTIVATION_FORMULA = (
    "selective checkpointing (every k-th layer checkpointed, k = checkpoint_every, TorchTitan's "
    "layer-level selective AC): c = floor(L/k) layers keep only their input T*b*h, the other L - c keep "
    "their per-layer bytes, plus one checkpointed layer recomputed at a time: (L - c)*per_layer + c*T*b*h "
    "+ per_layer (an upper bound: by the time the lowest checkpointed layers are recomputed, the layers "
    "above them have freed theirs)")

#: Activation checkpointing modes, least recompute first.
CHECKPOINTING = ("none", "selective", "full")
_CHECKPOINTING_NAMES = {False: "none", None: "none", "none": "none", "no": "none", "off": "none", "false": "none",
                        True: "full", "full": "full", "true": "full", "selective": "selective", "sac": "selective"}
#: The usual estimate: a backward costs about twice its forward (2N forward and 4N backward FLOPs
#: per token for N parameters), so a training step costs about 1 + 2 forwards.
BACKWARD_PER_FORWARD = 2

_WORKLOADS = {"inference": "inference", "generate": "inference", "train": "train", "training": "train"}
_MASTER = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}
_OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0}   # fp32/bf16 state tensors per parameter
_FSDP_BUFFER_NOTE = ("fsdp_buffers: 2 gathered layers (current + prefetched) + the keep_full_weight modules "
                     "(final norm, lm_head/tied embedding) in the compute dtype")


def _checkpointing_mode(value) -> str:
    """``"none"``, ``"selective"`` or ``"full"`` for what ``gradient_checkpointing=`` accepts (False/True too)."""
    return _choice(value, _CHECKPOINTING_NAMES, f"gradient_checkpointing={value!r}: use False/'none', 'selective' or "
                   "True/'full'")


def _checkpointed_layers(layers: int, mode: str, every: int = 2) -> int:
    """How many decoder layers recompute their forward in backward: 0, ``layers // every`` or all."""
    mode = _checkpointing_mode(mode)
    return 0 if mode == "none" else layers if mode == "full" else layers // every


def _checkpointing_label(mode: str, every: int = 2) -> str:
    """How a checkpointing mode reads in a plan: ``"full activation checkpointing"``, for example."""
    if mode == "selective":
        return f"selective activation checkpointing ({_nth_layer(every)})"
    return ("no" if mode == "none" else "full") + " activation checkpointing"


def _nth_layer(every: int) -> str:
    """``"every 2nd layer"``, ``"every 3rd layer"``: which layers selective checkpointing wraps."""
    suffix = "th" if 10 <= every % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(every % 10, "th")
    return f"every {every}{suffix} layer"


def recompute_fraction(config=None, seq: int = 2048, gradient_checkpointing="full", *, checkpoint_every: int = 2) -> float:
    """Extra compute of a training step from activation checkpointing, as a fraction of the step.
    A step costs about 3 forwards (:data:`BACKWARD_PER_FORWARD`); checkpointing adds the checkpointed layers' forward."""
    d = _model_spec(_config(config)).dims
    h, q, kv, i = d["hidden"], d["q_dim"], d["kv_dim"], d["intermediate"]
    # Per token: 2 FLOPs per weight of the matmuls, causal attention (QK^T and AV over seq/2 keys on average).
    layer, head = 2 * (h * (q + 2 * kv) + q * h + 3 * h * i) + 2 * 2 * q * seq / 2, 2 * h * d["vocab"]
    recomputed = _checkpointed_layers(d["layers"], gradient_checkpointing, checkpoint_every) * layer
    return recomputed / ((1 + BACKWARD_PER_FORWARD) * (d["layers"] * layer + head))


@dataclass
class MemoryPlan:
    """Bytes one rank holds for a model, a mesh and a workload (:func:`plan_memory` makes it); ``str()`` is the table.
    ``components`` maps each component to bytes and ``total`` is their sum; ``fsdp_buffers`` and ``activations`` are
    estimates (see ``notes``), the rest exact for Transformers' sharding."""

    model: str
    tp_size: int
    fsdp_size: int
    workload: str
    batch: int
    seq: int
    dtype: str
    master_weights: str
    optimizer: str
    gradient_checkpointing: bool
    checkpointing: str            # "none", "selective" or "full" (gradient_checkpointing: any of the last two)
    checkpoint_every: int         # selective: every k-th layer checkpointed
    cache_length: int
    parameter_count: int          # the whole model (tied weights once)
    local_parameter_count: int    # held by this rank
    components: dict
    activation_detail: dict       # per_layer, layers, head (bytes)
    notes: list
    shards: list = field(repr=False)

    @property
    def total(self) -> int:
        return sum(self.components.values())

    @property
    def training_state(self) -> int:
        """Parameters + gradients + optimizer state of this rank (the exactly-predicted part)."""
        return sum(self.components[k] for k in ("parameters", "gradients", "optimizer"))

    @property
    def mesh(self) -> str:
        return f"tp={self.tp_size} x fsdp={self.fsdp_size}"

    @property
    def checkpointing_label(self) -> str:
        """``"no activation checkpointing"``, or ``"selective activation checkpointing (every 2nd layer)"``, ..."""
        return _checkpointing_label(self.checkpointing, self.checkpoint_every)

    def fits(self, budget_bytes: int, headroom: float = 0.1) -> bool:
        """Whether :attr:`total` fits ``budget_bytes`` with ``headroom`` (a fraction) kept free."""
        return self.total <= budget_bytes * (1 - headroom)

    def __str__(self) -> str:
        lines = [f"{'component':<42} {'bytes':>18} {'GiB':>9}"]
        lines += [f"{_COMPONENTS[k][0]:<42} {v:>18,} {v / GiB:>9.3f}" for k, v in self.components.items()]
        return "\n".join(lines + [f"{'total per rank':<42} {self.total:>18,} {self.total / GiB:>9.3f}"])

    def summary(self, shards: bool = False) -> dict:
        """JSON-ready: settings, bytes per component, total (and every tensor's shard if ``shards``)."""
        out = {k: v for k, v in vars(self).items() if k not in ("activation_detail", "notes", "shards")}
        out.update(training_state_bytes=self.training_state, total_bytes=self.total,
                   total_gib=round(self.total / GiB, 4), activation_detail=self.activation_detail, notes=self.notes)
        return {**out, "shards": [s._asdict() for s in self.shards]} if shards else out


def plan_memory(config=None, tp_size: int = 1, fsdp_size: int = 1, *, workload: str = "inference",
                batch: int = 1, seq: int = 2048, dtype="bfloat16", master_weights: str = "fp32",
                optimizer: str = "adamw", gradient_checkpointing: bool | str = False,
                cache_length: int | None = None, checkpoint_every: int = 2) -> MemoryPlan:
    """The bytes one rank holds for ``config`` (``None``: the course model) on a ``tp_size x fsdp_size`` mesh.
    ``batch`` sequences of ``seq`` tokens per FSDP rank: weights, gradients and AdamW state exact, FSDP buffers and
    activations estimated (the ``*_FORMULA`` constants), the static KV cache of ``cache_length`` (default ``seq``)."""
    config = _config(config)
    workload = _choice(str(workload), _WORKLOADS, f"workload={workload!r}: use 'inference' or 'train'")
    for name, value in (("tp_size", tp_size), ("fsdp_size", fsdp_size), ("batch", batch), ("seq", seq),
                        ("checkpoint_every", checkpoint_every)):
        whole_number(name, value, error=PlanError)
    mode = _checkpointing_mode(gradient_checkpointing)
    master = _choice(str(master_weights), _MASTER, f"master_weights={master_weights!r}: use 'fp32' or 'bf16'")
    opt = _choice(str(optimizer), {k: k for k in _OPTIMIZERS},
                  f"optimizer={optimizer!r}: the planner knows {', '.join(_OPTIMIZERS)}")
    dtype = _choice(str(dtype).replace("torch.", ""), _DTYPE_NAMES, f"dtype {dtype!r}: use one of bfloat16, float16, "
                    "float32")
    b, spec = _DTYPES[dtype], _model_spec(config)
    if tp_size > 1 and not spec.dims["has_tp_plan"]:
        raise PlanError(f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan): use tp_size=1")
    if tp_size > 1 and (problem := _tp_problem(config, tp_size)):
        raise PlanError(problem)
    cache_length = whole_number("cache_length", seq if cache_length is None else cache_length, error=PlanError)
    shards, d, train = _shards(spec, tp_size, fsdp_size), spec.dims, workload == "train"
    local = sum(math.prod(s.local_shape) for s in shards)
    param_bytes = (4 if master == "fp32" else 2) if train else b
    comp, notes = dict.fromkeys(_COMPONENTS, 0), []
    comp["parameters"] = local * param_bytes
    if train:   # one gradient per parameter; AdamW: 2 moments per parameter (zeros_like) + one fp32 step per tensor
        comp["gradients"] = local * param_bytes
        comp["optimizer"] = _OPTIMIZERS[opt] * local * param_bytes + (4 * len(shards) if opt != "sgd" else 0)
    if fsdp_size > 1:
        comp["fsdp_buffers"] = _fsdp_buffer_bytes(spec, shards, b, param_bytes if train else 0)
        notes.append(_FSDP_BUFFER_NOTE + ("; + one layer of unsharded gradients" if train else "") + " (estimate).")
    if train:
        comp["activations"], detail = _train_activation_bytes(d, batch * seq, b, tp_size, mode, checkpoint_every)
        notes.append("activations (estimate): " + TRAIN_ACTIVATION_FORMULA
                     + ("; " + SELECTIVE_ACTIVATION_FORMULA if mode == "selective" else "") + ".")
    else:
        h, q, kv, i, kv_heads = d["hidden"], d["q_dim"], d["kv_dim"], d["intermediate"], -(-d["kv_heads"] // tp_size)
        per_layer, head = batch * seq * b * (2 * h + max(2 * q + 2 * kv, 3 * i) / tp_size), batch * d["vocab"] * (b + 4)
        comp["activations"], detail = int(per_layer + head), {"per_layer": int(per_layer), "layers": int(per_layer),
                                                               "head": int(head)}
        comp["kv_cache"] = batch * cache_length * d["layers"] * kv_heads * d["head_dim"] * 2 * b
        notes += ["activations (estimate): " + INFERENCE_ACTIVATION_FORMULA + ".",
                  f"kv_cache: batch {batch} x {cache_length} positions x {d['layers']} layers x {kv_heads} kv heads "
                  f"per TP rank x head_dim {d['head_dim']} x 2 (keys, values) x {b} bytes."]
    if fsdp_size > 1:
        notes.append(f"FSDP is data parallelism: each of the {fsdp_size} FSDP ranks holds the activations"
                     + (" and KV cache" if not train else "") + f" of its own micro-batch ({batch} x {seq}).")
    if d["max_position_embeddings"] and max(seq, cache_length if not train else 0) > d["max_position_embeddings"]:
        notes.append(f"seq/cache_length exceed max_position_embeddings={d['max_position_embeddings']}.")
    return MemoryPlan(
        model=str(config.name_or_path or config.model_type), tp_size=tp_size, fsdp_size=fsdp_size, workload=workload,
        batch=batch, seq=seq, dtype=dtype, master_weights=master, optimizer=opt,
        gradient_checkpointing=train and mode != "none", checkpointing=mode if train else "none",
        checkpoint_every=checkpoint_every, cache_length=cache_length if not train else 0,
        parameter_count=sum(math.prod(shape) for _n, shape, _s, _l in spec.params), local_parameter_count=local,
        components=comp, activation_detail=detail, notes=notes, shards=shards)


def _fsdp_buffer_bytes(spec: _ModelSpec, shards: list[TensorShard], b: int, grad_bytes: int = 0) -> int:
    """FSDP2's gathered weights (estimate): the biggest layer twice plus the keep_full_weight modules, in
    ``b`` bytes; ``grad_bytes`` > 0 (training) adds one layer of unsharded gradients in that dtype."""
    by_name = {s.name: math.prod(s.tp_shape) for s in shards}
    layer_numel: dict[int, int] = {}
    for name, _shape, _style, layer in spec.params:
        if layer is not None:
            layer_numel[layer] = layer_numel.get(layer, 0) + by_name[name]
    biggest = max(layer_numel.values(), default=0)
    return (2 * biggest + sum(by_name[n] for n in spec.keep_full)) * b + biggest * grad_bytes


def _train_activation_bytes(d: dict, tokens: int, b: int, tp: int, mode: str, every: int = 2) -> tuple[int, dict]:
    """Training activations (:data:`TRAIN_ACTIVATION_FORMULA`) and their detail for ``tokens`` tokens of this rank."""
    split = (4 + 3 * b) * (d["q_dim"] + d["kv_dim"]) + 4 * b * d["intermediate"] + 8 * d["heads"] + 4 * d["kv_heads"]
    per_layer = tokens * ((8 + 4 * b) * d["hidden"] + split / tp + 8)
    recomputed = _checkpointed_layers(d["layers"], mode, every)
    # checkpointed layers keep their input; the others everything; one recomputed layer at a time
    layers = ((d["layers"] - recomputed) * per_layer + recomputed * tokens * b * d["hidden"]
              + (per_layer if recomputed else 0))
    head = tokens * ((4 + 2 * b) * d["hidden"] + d["vocab"] * (b + 8))
    return int(layers + head), {"per_layer": int(per_layer), "layers": int(layers), "head": int(head)}


# Choosing the mesh

@dataclass
class MeshCandidate:
    """One (tp, fsdp) mesh on the instance: rejected (why), or its plan and whether it fits.
    ``replicas`` > 1: a serving layout of that many independent copies of the mesh (inference)."""

    tp_size: int
    fsdp_size: int
    plan: MemoryPlan | None = None
    fits: bool = False
    rejected: str = ""
    replicas: int = 1

    @property
    def valid(self) -> bool:
        return not self.rejected

    def summary(self) -> dict:
        out = {"tp_size": self.tp_size, "fsdp_size": self.fsdp_size, "valid": self.valid, "fits": self.fits,
               "replicas": self.replicas, **({"rejected": self.rejected} if self.rejected else {})}
        if self.plan is not None:
            out.update(checkpointing=self.plan.checkpointing, components=dict(self.plan.components),
                       total_bytes=self.plan.total, total_gib=round(self.plan.total / GiB, 4))
        return out


@dataclass
class MeshPlan:
    """What :func:`plan_mesh` found: every mesh tried, the recommended one and why; ``str()`` is the table of meshes.
    ``checkpointing`` is the activation checkpointing of the recommendation (and of every row); ``tried`` lists the
    (mesh, checkpointing) steps the planner took, in order."""

    model: str
    instance: Instance
    nodes: int
    workload: str
    headroom: float
    candidates: list
    recommended: MeshCandidate
    reason: str
    settings: dict = field(default_factory=dict)
    checkpointing: str = "none"
    tried: list = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.instance.logical_cores * self.nodes

    @property
    def budget(self) -> int:
        """Usable bytes per core: HBM per logical core minus the headroom."""
        return int(self.instance.hbm_per_core * (1 - self.headroom))

    @property
    def plans(self) -> dict:
        """``{"tp=.. x fsdp=..": MemoryPlan}`` for every valid mesh (for :func:`plot_memory_plan`)."""
        return {c.plan.mesh: c.plan for c in self.candidates if c.plan is not None}

    def __str__(self) -> str:
        every = self.settings.get("checkpoint_every", 2)
        lines = [f"{'tp':>3} {'fsdp':>5}  " + " ".join(f"{short:>9}" for _, short in _COMPONENTS.values())
                 + f" {'total':>9}  verdict   (GiB per rank"
                 + (f", {_checkpointing_label(self.checkpointing, every)})" if self.workload == "train" else ")")]
        for c in self.candidates:
            if c.plan is None:
                lines.append(f"{c.tp_size:>3} {c.fsdp_size:>5}  rejected: {c.rejected}")
                continue
            values = " ".join(f"{c.plan.components[k] / GiB:>9.2f}" for k in _COMPONENTS)
            mark = ("fits" if c.fits else "too big") + (f" ({c.replicas} replicas)" if c.replicas > 1 else "")
            mark += "  <- recommended" if c is self.recommended else ""
            lines.append(f"{c.tp_size:>3} {c.fsdp_size:>5}  {values} {c.plan.total / GiB:>9.2f}  {mark}")
        return "\n".join(lines)

    def summary(self) -> dict:
        """JSON-ready: instance, nodes, budget, every candidate, the recommendation and its reason."""
        rec = self.recommended
        return {"model": self.model, "instance": self.instance.to_dict(), "nodes": self.nodes,
                "world_size": self.world_size, "workload": self.workload, "headroom": self.headroom,
                "budget_bytes": self.budget, "settings": dict(self.settings), "checkpointing": self.checkpointing,
                "recommended": {"tp_size": rec.tp_size, "fsdp_size": rec.fsdp_size, "replicas": rec.replicas,
                                "checkpointing": rec.plan.checkpointing, "plan": rec.plan.summary()},
                "reason": self.reason, "tried": [dict(t) for t in self.tried],
                "candidates": [c.summary() for c in self.candidates]}


@dataclass
class _Job:
    """One planning question: a workload of a model on ``nodes`` of an instance, with :func:`plan_memory`'s keywords
    (``kw``) and the checkpointing modes to try, least recompute first."""

    config: object
    inst: Instance
    nodes: int
    workload: str
    headroom: float
    kw: dict
    modes: tuple

    @property
    def world(self) -> int:
        return self.inst.logical_cores * self.nodes

    @property
    def where(self) -> str:
        """``"trn2.48xlarge"`` or ``"4 x trn2.48xlarge"``."""
        return f"{self.nodes} x {self.inst.name}" if self.nodes > 1 else self.inst.name

    @property
    def budget(self) -> int:
        return int(self.inst.hbm_per_core * (1 - self.headroom))

    def planned(self, cand: MeshCandidate, mode: str) -> MeshCandidate:
        """The candidate with its memory plan and whether it fits (a rejected one as it is)."""
        if cand.rejected:
            return cand
        plan = plan_memory(self.config, cand.tp_size, cand.fsdp_size, workload=self.workload,
                           **{**self.kw, "gradient_checkpointing": mode})
        return MeshCandidate(cand.tp_size, cand.fsdp_size, plan, plan.fits(self.inst.hbm_per_core, self.headroom),
                             replicas=cand.replicas)


@dataclass
class _Choice:
    """What :func:`_search` found: the mesh, its checkpointing, and every step tried before it."""

    candidate: MeshCandidate
    mode: str
    tried: list
    kind: str    # "fsdp-only", "tp-in-chip", "tp-across-chips", "replicas", "given"
    passed_over: list = field(default_factory=list)  # in-chip meshes between tp=1 and the chip's TP that fit too


def _across_hosts(inst: Instance, tp: int) -> str:
    """Why a TP group may not span hosts."""
    return (f"tp_size={tp} would split a TP group across hosts ({inst.cores_per_host} cores per "
            f"host): TP all-reduces twice per layer, and Neuron keeps it within a chip ('Keep TP4 within a chip')")


def _given_mesh(job: _Job, tp_size: int | None, fsdp_size: int | None) -> tuple[int, int]:
    """The one mesh ``tp_size``/``fsdp_size`` name, checked: the model's heads first, then the launch."""
    for name, value in (("tp_size", tp_size), ("fsdp_size", fsdp_size)):
        if value is not None:
            whole_number(name, value, error=PlanError)
    world, where = job.world, job.where
    ok_tps = _tp_sizes_that_fit(_tp_dimensions(job.config), world)
    if tp_size is not None and _tp_problem(job.config, tp_size):
        if world % tp_size == 0 and fsdp_size in (None, world // tp_size):   # the launcher's message, as launch says it
            validate_parallel_sizes(world, tp_size, world // tp_size, model_config=job.config)
        # The heads come first: a launch-size message would hide why this tp cannot work at all.
        raise PlanError(_tp_problem(job.config, tp_size, world, where))
    if tp_size is None:
        if world % fsdp_size:
            raise PlanError(f"fsdp_size={fsdp_size} does not divide the {world} ranks of {where}: give "
                            f"--tp too, or use fsdp_size in {[world // t for t in ok_tps]}.")
        tp_size = world // fsdp_size
    if fsdp_size is None:
        if world % tp_size:
            raise PlanError(f"tp_size={tp_size} does not divide the {world} ranks of {where}: use tp_size "
                            f"in {ok_tps}, or give --fsdp and --nodes for another world size.")
        fsdp_size = world // tp_size
    validate_parallel_sizes(world, tp_size, fsdp_size, model_config=job.config)
    if job.inst.cores_per_host % tp_size:
        raise PlanError(_across_hosts(job.inst, tp_size))
    return tp_size, fsdp_size


def _mesh_candidates(job: _Job) -> list[MeshCandidate]:
    """Every (tp, world // tp) mesh, rejected ones with the launcher's reason; no plans yet."""
    out = []
    for tp in _divisors(job.world):
        try:
            validate_parallel_sizes(job.world, tp, job.world // tp, model_config=job.config)
            rejected = _across_hosts(job.inst, tp) if job.inst.cores_per_host % tp else ""
        except PlanError as exc:
            rejected = str(exc)
        out.append(MeshCandidate(tp, job.world // tp, rejected=rejected))
    return out


def _search(job: _Job, given: tuple | None = None) -> _Choice | None:
    """Walk the planner's ladder (see :func:`plan_mesh`); the first step that fits, or None."""
    tried, chip = [], job.inst.cores_per_chip

    def attempt(cand: MeshCandidate, mode: str, kind: str) -> _Choice | None:
        planned = job.planned(cand, mode)
        tried.append({"tp_size": cand.tp_size, "fsdp_size": cand.fsdp_size, "replicas": cand.replicas,
                      "checkpointing": mode, "total_bytes": planned.plan.total, "fits": planned.fits})
        return _Choice(planned, mode, tried, kind) if planned.fits else None

    if given is not None:
        return next((hit for mode in job.modes if (hit := attempt(MeshCandidate(*given), mode, "given"))), None)
    valid = [c for c in _mesh_candidates(job) if c.valid]
    in_chip = [c for c in valid if c.tp_size <= chip]
    if job.workload == "inference":
        # Serving: independent replicas without FSDP (FSDP would all-gather every layer for every token).
        for cand in in_chip:
            if hit := attempt(MeshCandidate(cand.tp_size, 1, replicas=job.world // cand.tp_size), "none", "replicas"):
                return hit
    # FSDP alone, then TP filling the chip ("Keep TP4 within a chip"): in_chip is in ascending tp.
    steps = [c for c in in_chip if c.tp_size == 1] + [c for c in in_chip if c.tp_size > 1][-1:]
    for mode in job.modes:
        for cand in steps:
            if hit := attempt(cand, mode, "fsdp-only" if cand.tp_size == 1 else "tp-in-chip"):
                if hit.kind == "tp-in-chip":  # the ladder skips 1 < tp < chip: say which of those fit too
                    middle = (job.planned(c, mode) for c in in_chip if 1 < c.tp_size < cand.tp_size)
                    hit.passed_over = [m for m in middle if m.fits]
                return hit
    for mode in job.modes:           # last resort: TP across chips
        for cand in (c for c in valid if c.tp_size > chip):
            if hit := attempt(cand, mode, "tp-across-chips"):
                return hit
    return None


# When nothing fits: what would

#: Node counts tried when looking for "more nodes" (beyond 8, the usual cluster sizes).
_NODE_COUNTS = (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)


def _what_would_fit(job: _Job) -> list[tuple[dict, _Choice]]:
    """``(flags, choice)`` per fix that fits: more nodes, a larger instance, a smaller batch, heavier checkpointing;
    if none does, batch 1 and full checkpointing, here or elsewhere, with the sequence halved until one fits."""
    batch, seq = job.kw["batch"], job.kw["seq"]
    heavier = CHECKPOINTING[CHECKPOINTING.index(job.modes[-1]) + 1:] if job.workload == "train" else ()
    bigger = sorted((o for o in INSTANCES.values() if o.hbm_total > job.inst.hbm_total * job.nodes),
                    key=lambda o: (o.hbm_per_core, o.hbm_total))

    def fits(**flags):   # (flags, choice) if the job fits with these flags of `plan`, else None
        kw = {**job.kw, **{k: flags[k] for k in ("batch", "seq") if k in flags}}
        modes = (flags["checkpointing"],) if "checkpointing" in flags else job.modes
        hit = _search(replace(job, inst=INSTANCES[flags.get("instance", job.inst.name)],
                              nodes=flags.get("nodes", job.nodes), kw=kw, modes=modes))
        return (flags, hit) if hit else None

    def elsewhere(**flags):   # the fewest more nodes, and the smallest larger instance (not monotone: each tried)
        one_node = {"nodes": 1} if job.nodes > 1 else {}
        return [next(filter(None, (fits(**flags, nodes=n) for n in _NODE_COUNTS if n > job.nodes)), None),
                next(filter(None, (fits(**flags, instance=o.name, **one_node) for o in bigger)), None)]

    def largest_batch(top: int, **flags):   # memory grows with the batch: bisect for the largest that fits
        sized = lambda b: fits(**flags, **({"batch": b} if b != batch else {}))  # noqa: E731
        largest = bisect.bisect(range(1, top + 1), False, key=lambda b: sized(b) is None)
        return sized(largest) if largest else None

    found = elsewhere() + [largest_batch(batch - 1)]
    found.append(next(filter(None, (largest_batch(batch, checkpointing=m) for m in heavier)), None))
    lean = {**({"batch": 1} if batch > 1 else {}), **({"checkpointing": "full"} if heavier else {})}
    short = seq if lean else seq // 2
    while not any(found) and short >= 128:
        flags = {**lean, **({"seq": short} if short < seq else {})}
        here = fits(**flags)
        found, short = ([here] if here else elsewhere(**flags)), short // 2
    return [f for f in found if f]


def _layout(c: MeshCandidate) -> str:
    """``"tp=4 x fsdp=16 with selective activation checkpointing (every 2nd layer)"``, or ``"32 replicas of tp=2"``."""
    return ((f"{c.replicas} replicas of tp={c.tp_size}" if c.replicas > 1 else c.plan.mesh)
            + f" with {c.plan.checkpointing_label}" * c.plan.gradient_checkpointing)


def _budget(job: _Job) -> str:
    """The usable bytes per core, the headroom said as the planner's assumption."""
    return (f"{job.budget / GiB:.1f} GiB usable per core ({job.inst.hbm_per_core / GiB:.0f} GiB of HBM minus the "
            f"planner's assumed {job.headroom:.0%} headroom; the runtime's own overhead is not published)")


def _no_fit_error(job: _Job, given, cands: list) -> PlanError:
    """A workload no mesh fits: the leanest mesh's bytes against the budget, then the flags of each fix found."""
    p = min((c.plan for c in cands if c.plan is not None), key=lambda plan: plan.total)
    other_mesh = _search(job) if given is not None else None   # the mesh given does not fit; another does
    fixes = []
    for flags, hit in [({}, other_mesh)] if other_mesh else _what_would_fit(job):
        c, said = hit.candidate, " ".join(f"--{k} {v}" for k, v in flags.items())
        if given is not None:   # a mesh given on the command line: name the one that fits
            said += f" --tp {c.tp_size} --fsdp {c.fsdp_size}" if c.replicas == 1 else " without --tp/--fsdp"
        fixes.append(f"{said.strip()} ({_layout(c)}: {c.plan.total / GiB:.1f} GiB per core)")
    ckpt = f" even with {p.checkpointing_label}" * p.gradient_checkpointing
    return PlanError(
        f"{p.model} {'training' if p.workload == 'train' else 'inference'} (micro-batch {p.batch} x {p.seq} per rank) "
        + (f"does not fit {p.mesh} on {job.where}{ckpt}: it needs" if given is not None else
           f"fits no mesh on {job.where}{ckpt}: the leanest, {p.mesh}, needs")
        + f" {p.total / GiB:.1f} GiB per core, {_budget(job)}. What would fit: " + ("; ".join(fixes) or
        f"nothing the planner tried (batch 1, full checkpointing, seq down to 128, {_NODE_COUNTS[-1]} nodes, the "
        "largest instance): plan a smaller model") + ".")


# The reason, in words

#: AWS's published layout for Qwen3-8B training on one trn2.48xlarge: TorchTitan config qwen3_8b_tp4_fsdp16_sac
#: (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training/torchtitan/tutorials/tutorial-basic-training.html).
_AWS_QWEN3_8B = ("Qwen/Qwen3-8B", _DEFAULT_INSTANCE, 4, 16, "selective")


def _reason(choice: _Choice, job: _Job) -> str:
    """The plan in words: the layout and its bytes against the budget, then one sentence per reason for it."""
    c, mode, chip, tp = choice.candidate, choice.mode, job.inst.cores_per_chip, choice.candidate.tp_size
    layers, every = _model_spec(job.config).dims["layers"], c.plan.checkpoint_every
    if choice.kind == "replicas":
        why = ("Serving uses no FSDP (it would all-gather every layer for every new token): each replica is its own "
               f"DistributedConfig(tp_size={tp}) holding the whole model, on the fewest cores of one chip it fits.")
    elif tp == 1:
        why = ("FSDP alone fits: no tensor parallelism (Neuron's training best practices: start with the least model "
               "parallelism that leaves memory headroom).")
    elif tp <= chip:
        why = (f"tp={tp} keeps each TP group inside one chip ({chip} logical cores), so its all-reduces stay on the "
               "chip (Neuron: \"Keep TP4 within a chip\"" + (", FSDP between chips)." if c.fsdp_size > 1 else ")."))
    else:
        why = (f"tp={tp} spans {tp // chip} chips, against Neuron's \"Keep TP4 within a chip\": "
               + ("you asked for it." if choice.kind == "given" else "no mesh with TP inside a chip fits."))
    if choice.passed_over:
        why += (" " + ", ".join(f"{p.plan.mesh} ({p.plan.total / GiB:.2f} GiB)" for p in choice.passed_over) + " would "
                "fit too, but the planner passes over TP smaller than a chip: a layout rule, not a measured speed-up.")
    if c.plan.gradient_checkpointing:
        extra = recompute_fraction(job.config, c.plan.seq, mode, checkpoint_every=every)
        why += (f" Checkpointing recomputes {_checkpointed_layers(layers, mode, every)} of {layers} layers' forward in "
                f"backward: about {extra:.0%} more compute per step (estimate from FLOPs).")
    if (c.plan.model, job.where, tp, c.fsdp_size, mode) == _AWS_QWEN3_8B:
        why += (" It is the mesh of AWS's published layout for Qwen/Qwen3-8B on a trn2.48xlarge (TorchTitan config "
                "qwen3_8b_tp4_fsdp16_sac) by construction, since the ladder follows that layout: not an independent "
                f"confirmation; '{_nth_layer(every)}' is the planner's assumption.")
    head = {"replicas": "Recommended for serving", "given": "Planned the mesh you gave"}.get(choice.kind, "Recommended")
    return f"{head}: {_layout(c)}, {c.plan.total / GiB:.2f} of {_budget(job)}.\n{why}"


def plan_mesh(config=None, instance=_DEFAULT_INSTANCE, workload: str = "inference", *, batch: int = 1,
              seq: int | None = None, headroom: float = 0.1, nodes: int = 1, tp_size: int | None = None,
              fsdp_size: int | None = None, dtype="bfloat16", master_weights: str = "fp32",
              optimizer: str = "adamw", gradient_checkpointing: bool | str | None = None,
              cache_length: int | None = None, checkpoint_every: int = 2) -> MeshPlan:
    """Choose the ``DistributedConfig(tp_size, fsdp_size)`` and activation checkpointing of a run on an instance.
    Per checkpointing mode (least recompute first; None: all): FSDP alone, TP filling one chip, TP across chips; serving
    tries replicas first. ``tp_size``/``fsdp_size`` plan only that mesh; ``seq`` defaults to 2048. Raises PlanError."""
    inst = get_instance(instance)
    config = _config(config)
    whole_number("nodes", nodes, error=PlanError)
    if not 0 <= headroom < 1:
        raise PlanError(f"headroom={headroom!r}: a fraction in [0, 1)")
    limit = _model_spec(config).dims["max_position_embeddings"]
    seq = min(2048, limit or 2048) if seq is None else seq
    kw = dict(batch=batch, seq=seq, dtype=dtype, master_weights=master_weights, optimizer=optimizer,
              cache_length=cache_length, checkpoint_every=checkpoint_every)
    probe = plan_memory(config, workload=workload, **kw)   # checks the inputs
    label, workload, train = probe.model, probe.workload, probe.workload == "train"
    auto = train and (gradient_checkpointing is None or str(gradient_checkpointing).lower() == "auto")
    modes = CHECKPOINTING if auto else (_checkpointing_mode(gradient_checkpointing) if train else "none",)
    for name, value in (("seq", seq), ("cache_length", cache_length)):
        if limit and value is not None and value > limit:
            raise PlanError(f"{name}={value}: the model takes at most {limit} positions ({label}'s "
                            f"max_position_embeddings): use {name} <= {limit}")
    job = _Job(config, inst, nodes, workload, headroom, kw, modes)
    given = _given_mesh(job, tp_size, fsdp_size) if tp_size is not None or fsdp_size is not None else None
    choice = _search(job, given)
    cands = [MeshCandidate(*given)] if given is not None else _mesh_candidates(job)
    if given is None and not any(c.valid for c in cands):
        raise PlanError(f"no mesh of {job.world} ranks on {job.where} suits {label}: "
                        + " | ".join(sorted({c.rejected for c in cands})))
    if given is None and not train:   # serving replicas first
        cands = [MeshCandidate(c.tp_size, 1, replicas=job.world // c.tp_size) for c in cands
                 if c.valid and c.tp_size <= inst.cores_per_chip] + cands
    cands = [job.planned(c, choice.mode if choice else modes[-1]) for c in cands]
    if choice is None:
        raise _no_fit_error(job, given, cands)
    # The listed row of the chosen mesh (MeshPlan's table marks the recommended row by identity).
    choice.candidate = next(c for c in cands if (c.tp_size, c.fsdp_size, c.replicas) == (
        choice.candidate.tp_size, choice.candidate.fsdp_size, choice.candidate.replicas))
    settings = {**kw, "dtype": probe.dtype, "gradient_checkpointing": "auto" if auto else modes[0]}
    return MeshPlan(model=label, instance=inst, nodes=nodes, workload=workload, headroom=headroom, candidates=cands,
                    recommended=choice.candidate, reason=_reason(choice, job), settings=settings,
                    checkpointing=choice.mode, tried=choice.tried)


# Text and picture

def _memory_line(m: MemoryPlan) -> str:
    """One paragraph: model, mesh, workload, parameters held, total per rank."""
    what = (f"training (micro-batch {m.batch} x {m.seq} tokens per rank, {m.master_weights} master weights, "
            f"{m.optimizer}, compute {m.dtype}{', ' + m.checkpointing_label if m.gradient_checkpointing else ''})"
            if m.workload == "train" else
            f"inference ({m.batch} x {m.seq} tokens per rank, {m.dtype}, static cache of {m.cache_length} positions)")
    return (f"{m.model} on {m.mesh}, {what}: each rank holds {m.local_parameter_count:,} of "
            f"{m.parameter_count:,} parameters; {m.total / GiB:.2f} GiB per rank in all.")


def format_plan(plan: MeshPlan | MemoryPlan, *, shards: bool = False) -> str:
    """A plan as text: a MeshPlan's instance, reason, meshes and recommended components, or a MemoryPlan's components.
    Both end with the notes; ``shards=True`` adds one line per tensor of this rank."""
    if isinstance(plan, MeshPlan):
        inst, memory = plan.instance, plan.recommended.plan
        where = f"{plan.nodes} x {inst.name}" if plan.nodes > 1 else inst.name
        parts = [f"{plan.model}, {plan.workload} on {where}: {plan.world_size} logical NeuronCores "
                 f"({inst.cores_per_chip} per chip), {inst.hbm_per_core / GiB:.0f} GiB HBM each "
                 f"({plan.budget / GiB:.1f} GiB usable with {plan.headroom:.0%} headroom).\n{plan.reason}",
                 "", str(plan), "", f"recommended mesh, per rank: {_memory_line(memory)}", str(memory)]
    else:
        parts, memory = [_memory_line(plan), str(plan)], plan
    parts += [""] + [f"note: {n}" for n in memory.notes]
    if shards:
        parts += ["", f"{'tensor':<48} {'shape':>16} {'tp style':>24} {'on this rank':>16}"]
        parts += [f"{s.name:<48} {str(s.shape):>16} {str(s.tp_style or '-'):>24} {str(s.local_shape):>16}"
                  for s in memory.shards]
    return "\n".join(parts)


def plot_memory_plan(plan: MeshPlan):
    """Stacked bars of bytes per rank by component, one bar per valid mesh of ``plan``; returns the figure.
    The HBM per core and the usable budget are drawn as lines."""
    import matplotlib.pyplot as plt

    plans, hbm, budget = plan.plans, plan.instance.hbm_per_core / GiB, plan.budget / GiB
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(plans) + 1.5) + 3.2, 4.2))
    labels, bottoms = list(plans), [0.0] * len(plans)
    for n, (key, (label, _)) in enumerate(_COMPONENTS.items()):
        if any(values := [plans[mesh].components[key] / GiB for mesh in labels]):
            ax.bar(labels, values, bottom=bottoms, color=plt.get_cmap("tab10").colors[n], label=label)
            bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.axhline(hbm, color="black", lw=1, label=f"HBM per core ({hbm:.0f} GiB)")
    ax.axhline(budget, color="red", ls="--", lw=1, label=f"usable ({budget:.1f} GiB)")
    ax.set_ylim(0, max(bottoms + [hbm, budget]) * 1.15)
    ax.set(ylabel="GiB per rank (NeuronCore)", xlabel="mesh")
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(f"{plan.model}, {plan.workload} on {plan.instance.name}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig
