"""Plan a real run: bytes per NeuronCore, and the right (tp, fsdp) mesh for a Trainium instance.

Notebook 05 trains the tiny course model on a 2 x 2 mesh of CPU processes. Before running a
real Qwen3 model on a trn2 or trn3 instance, the same questions have numbers for answers:
how many bytes does each rank hold, and which ``DistributedConfig(tp_size, fsdp_size)`` fits?

* :func:`plan_memory` estimates the bytes on **one rank** for a model config and a mesh:
  parameters split exactly the way Transformers shards them (the model's TP plan, then FSDP2
  on dim 0), gradients and AdamW state for training, FSDP all-gather buffers, activations
  (an estimate, formula in its docstring; none, selective or full activation checkpointing)
  and the static KV cache for generation.
* :data:`INSTANCES` lists HBM per logical NeuronCore and cores per instance (Neuron docs).
* :func:`plan_mesh` lays the job out the way Neuron's training best practices do: FSDP alone
  if it fits, else tensor parallelism inside one chip ("Keep TP4 within a chip") with FSDP
  between chips, the least activation checkpointing that fits, TP across chips only as a last
  resort; serving uses independent replicas without FSDP. Meshes the model cannot take are
  rejected (:func:`trnlab.mesh.validate_parallel_sizes`). When nothing fits it says what
  would (more nodes, a larger instance, a smaller batch, checkpointing), computed, not guessed.
* ``python -m trnlab plan --model Qwen/Qwen3-8B --instance trn2.48xlarge [--train]`` prints
  the same; it works offline for the Qwen3 configs shipped in ``trnlab/assets/configs``.

The parameter and training-state figures are exact for the sharding Transformers does
(``tests/test_planning.py`` and ``tests/test_distributed.py`` compare them with what real ranks
hold); activations are an estimate. Used by notebook 06 ("Plan a real run").
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from trnlab.deprecation import SummaryDict, warn_deprecated
from trnlab.instances import (  # noqa: F401  (re-exported: trnlab.planning.INSTANCES etc. keep working)
    INSTANCES, LNC_URL, TORCHNEURON_QUICKSTART_URL, TRAINIUM2_URL, TRAINIUM3_URL, TRN2_ARCH_URL, TRN3_ARCH_URL,
    UNSUPPORTED_INSTANCES, GiB, Instance, InstanceError, PlanError, get_instance)

from trnlab.mesh import LaunchConfigError, divisors, tp_misfits, tp_sizes_that_fit, validate_parallel_sizes
from trnlab.models import (  # noqa: F401  (CONFIG_DIR, SHIPPED_MODELS re-exported)
    CONFIG_DIR, SHIPPED_MODELS, config_from_dict, load_config, model_name, read_config_file, shipped_config,
    text_config)
from trnlab.settings import DEFAULT_INSTANCE

__all__ = [
    "PlanError",
    "Instance",
    "INSTANCES",
    "UNSUPPORTED_INSTANCES",
    "SHIPPED_MODELS",
    "CONFIG_DIR",
    "TensorShard",
    "MemoryPlan",
    "MeshCandidate",
    "MeshPlan",
    "config_and_label",
    "get_instance",
    "parameter_shards",
    "plan_memory",
    "parameter_bytes",
    "gradient_bytes",
    "optimizer_bytes",
    "fsdp_buffer_bytes",
    "train_activation_bytes",
    "inference_activation_bytes",
    "kv_cache_bytes",
    "plan_mesh",
    "CHECKPOINTING",
    "checkpointing_mode",
    "checkpointed_layers",
    "recompute_fraction",
    "BACKWARD_PER_FORWARD",
    "SELECTIVE_ACTIVATION_FORMULA",
    "AWS_QWEN3_8B_RECIPE",
    "TRAINING_BEST_PRACTICES_URL",
    "TORCHTITAN_TUTORIAL_URL",
    "REQUIRED_FIELDS",
    "DTYPE_BYTES",
    "COMPONENTS",
    "COMPONENT_LABELS",
    "TRAIN_ACTIVATION_FORMULA",
    "INFERENCE_ACTIVATION_FORMULA",
    "ACTIVATION_FORMULA",
    "format_plan",
    "plot_memory_plan",
]

#: Neuron's training guidance the mesh advice follows.
TRAINING_BEST_PRACTICES_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training/best-practices.html"
#: Neuron's TorchTitan training tutorial (the layer-level selective checkpointing the planner models).
TORCHTITAN_TUTORIAL_URL = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training/torchtitan/tutorials/"
                           "tutorial-basic-training.html")


# ---------------------------------------------------------------------------------------------
# Model configs
# ---------------------------------------------------------------------------------------------

#: Fields the planner reads from a config; a config without one of them cannot be planned.
REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "vocab_size")

#: Bytes per element of each dtype name the planner accepts.
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "").lower()
    name = _DTYPE_NAMES.get(name, name)
    if name not in DTYPE_BYTES:
        raise PlanError(f"dtype {dtype!r}: use one of bfloat16, float16, float32")
    return name


#: Appended to a "lacks ..." message: what the planner needs.
_NEEDS = (f": the planner needs {', '.join(REQUIRED_FIELDS + ('model_type',))} (head_dim defaults to "
          f"hidden_size / num_attention_heads).")


def _check_fields(config, where: str):
    missing = [f for f in REQUIRED_FIELDS if getattr(text_config(config), f, None) is None]
    if missing:
        raise PlanError(f"{where} lacks {', '.join(missing)}")
    return config


def config_and_label(model=None) -> tuple:
    """``(config, label)`` for ``model``, as the planner reads it: :func:`trnlab.models.load_config`,
    plus config JSON files, the planner's field checks, and the name its plans show.

    ``model``: a config, a dict of config values, a shipped name (``"Qwen/Qwen3-8B"``, no network),
    a folder or config JSON file, a hub name, or ``None`` (``$TRNLAB_MODEL`` or the bundled model).
    A config missing a needed field raises :class:`PlanError` naming it.
    """
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):
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


def resolve_config(model=None):
    """Deprecated: ``(config, label)``; use :func:`trnlab.load_config` (the label is ``config.name_or_path``)."""
    warnings.warn("trnlab.planning.resolve_config is deprecated and will be removed in trnlab 0.3: write "
                  "trnlab.load_config(model) instead (it returns the config; its name is config.name_or_path)",
                  FutureWarning, stacklevel=2)
    return config_and_label(model)


# ---------------------------------------------------------------------------------------------
# Parameters as Transformers shards them
# ---------------------------------------------------------------------------------------------

#: TP styles (Transformers' ALL_PARALLEL_STYLES) -> which dim of a weight they split.
#: "first": dim 0 of a 1-D/2-D weight (Shard(ndim - 2)); "last": the last dim; None: replicated.
_COLWISE = {"colwise", "colwise_rep", "colwise_gather_output", "packed_colwise"}
_ROWWISE = {"rowwise", "rowwise_split_input", "rowwise_rep", "packed_rowwise"}
_REPLICATED = {"replicated_with_grad_allreduce", "replicate", "all_reduce", "sequence_parallel",
               "local_params"}


def _tp_split_dim(style: str | None, param_name: str, ndim: int) -> int | None:
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
    # Transformers' replace_layer_number_by_wildcard: "layers.3.mlp" -> "layers.*.mlp".
    return re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name)


def _style_of(param_name: str, plan: dict) -> str | None:
    # Transformers' _get_parameter_plan: the parameter's own rule, else its module's.
    generic = _generic(param_name)
    if generic in plan:
        return plan[generic]
    module = generic.rsplit(".", 1)[0] if "." in generic else None
    return plan.get(module) if module else None


@dataclass(frozen=True)
class _ModelSpec:
    """What the planner needs from a model, read once from the model built on the meta device."""

    params: tuple        # (name, shape, tp_style, layer index or None)
    keep_full: frozenset  # names of params FSDP keeps gathered after forward (keep_full_weight)
    tied: bool
    dims: dict


def _count(shape) -> int:
    return math.prod(shape)


@lru_cache(maxsize=32)
def _spec_from_json(config_json: str, model_type: str) -> _ModelSpec:
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
    tied = bool(getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False)))
    dims = {"hidden": text.hidden_size, "intermediate": text.intermediate_size,
            "layers": text.num_hidden_layers, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "vocab": text.vocab_size, "q_dim": heads * head_dim, "kv_dim": kv_heads * head_dim,
            "max_position_embeddings": getattr(text, "max_position_embeddings", None), "has_tp_plan": bool(plan)}
    return _ModelSpec(tuple(params), frozenset(keep), tied, dims)


def _spec(config) -> _ModelSpec:
    values = config.to_dict()   # to_dict() writes the name as "_name_or_path": not part of the shapes
    for key in ("_name_or_path", "transformers_version", "architectures", "distributed_config", "model_type"):
        values.pop(key, None)
    return _spec_from_json(json.dumps(values, sort_keys=True, default=str), config.model_type)


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
        return _count(self.shape)

    @property
    def local_numel(self) -> int:
        return _count(self.local_shape)

    @property
    def tp_numel(self) -> int:
        return _count(self.tp_shape)

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "tp_style": self.tp_style,
                "tp_shape": list(self.tp_shape), "local_shape": list(self.local_shape)}


def _shards(spec: _ModelSpec, tp: int, fsdp: int) -> list[TensorShard]:
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


def parameter_shards(config=None, tp_size: int = 1, fsdp_size: int = 1) -> list[TensorShard]:
    """Every parameter of the model and the piece of it one rank holds under ``(tp_size, fsdp_size)``.

    Built from the model on the meta device (``AutoModelForCausalLM.from_config`` under
    ``torch.device("meta")``: exact shapes, no memory), split by the model's TP plan
    (``model.tp_plan``: colwise splits the output rows, rowwise the input columns, the
    embedding and lm_head split the vocabulary, every norm weight is replicated), then by FSDP2
    on dim 0 of each TP piece, padded to ``ceil(rows / fsdp_size)``. Tied embeddings appear once.
    Notebook 06 uses it through :func:`plan_memory`, which sums it.
    """
    config, _ = config_and_label(config)
    spec = _spec(config)
    if tp_size > 1 and not spec.dims["has_tp_plan"]:
        raise PlanError(f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan): use tp_size=1")
    return _shards(spec, tp_size, fsdp_size)


# ---------------------------------------------------------------------------------------------
# Memory of one rank
# ---------------------------------------------------------------------------------------------

#: What a rank's memory is made of, in :meth:`MemoryPlan.table` order.
COMPONENTS = ("parameters", "gradients", "optimizer", "fsdp_buffers", "activations", "kv_cache")
#: How tables and plots name each of :data:`COMPONENTS`.
COMPONENT_LABELS = {
    "parameters": "parameters (this rank's shards)",
    "gradients": "gradients",
    "optimizer": "optimizer state (AdamW moments + step)",
    "fsdp_buffers": "FSDP all-gather buffers (estimate)",
    "activations": "activations (estimate)",
    "kv_cache": "static KV cache",
}

#: The activation estimates, as :func:`plan_memory` computes them (also in ``MemoryPlan.notes``).
#: Symbols: T = batch*seq tokens of this rank's micro-batch, b = compute dtype bytes, h = hidden_size,
#: q = heads*head_dim, kv = kv_heads*head_dim, i = intermediate_size, V = vocab_size, L = layers.
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
#: Selective activation checkpointing, as the planner models it (an assumption: which selective option
#: AWS's ``qwen3_8b_tp4_fsdp16_sac`` config sets was not found): TorchTitan's layer-level selective AC
#: (``[activation_checkpoint] mode = "selective"``, ``selective_ac_option = "2"``; TorchTitan also has an
#: op-level option, ``"op"``) wraps every k-th decoder layer in full checkpointing and leaves the others alone.
SELECTIVE_ACTIVATION_FORMULA = (
    "selective checkpointing (every k-th layer checkpointed, k = checkpoint_every, TorchTitan's "
    "layer-level selective AC): c = floor(L/k) layers keep only their input T*b*h, the other L - c keep "
    "their per-layer bytes, plus one checkpointed layer recomputed at a time: (L - c)*per_layer + c*T*b*h "
    "+ per_layer (an upper bound: by the time the lowest checkpointed layers are recomputed, the layers "
    "above them have freed theirs)")
#: Every activation estimate in one text: training, selective checkpointing, inference.
ACTIVATION_FORMULA = ("training: " + TRAIN_ACTIVATION_FORMULA + "; " + SELECTIVE_ACTIVATION_FORMULA
                      + ". Inference: " + INFERENCE_ACTIVATION_FORMULA + ".")

#: Activation checkpointing modes, least recompute first.
CHECKPOINTING = ("none", "selective", "full")
_CHECKPOINTING_NAMES = {False: "none", None: "none", "none": "none", "no": "none", "off": "none", "false": "none",
                        True: "full", "full": "full", "true": "full", "selective": "selective", "sac": "selective"}


def checkpointing_mode(value) -> str:
    """``"none"``, ``"selective"`` or ``"full"`` for what ``gradient_checkpointing=`` accepts
    (``False``/``True`` stay what they were: none and full). Raises :class:`PlanError` otherwise."""
    key = value.strip().lower() if isinstance(value, str) else value
    try:
        return _CHECKPOINTING_NAMES[key]
    except (KeyError, TypeError):
        raise PlanError(f"gradient_checkpointing={value!r}: use False/'none', 'selective' or True/'full'") from None


def checkpointed_layers(layers: int, mode: str, every: int = 2) -> int:
    """How many decoder layers recompute their forward in backward: 0, ``layers // every`` or all."""
    mode = checkpointing_mode(mode)
    return 0 if mode == "none" else layers if mode == "full" else layers // every


def _forward_flops_per_token(d: dict, seq: int, tp: int = 1) -> tuple[float, float]:
    """(one layer, the loss head) forward FLOPs per token: the weight matmuls (2 FLOPs per weight),
    causal attention (QK^T and AV over seq/2 keys on average); split by tp."""
    h, q, kv, i = d["hidden"], d["q_dim"], d["kv_dim"], d["intermediate"]
    layer = 2 * (h * (q + 2 * kv) + q * h + 3 * h * i) + 2 * 2 * q * seq / 2
    return layer / tp, 2 * h * d["vocab"] / tp


#: The usual estimate: a backward costs about twice its forward (2N forward and 4N backward FLOPs
#: per token for N parameters), so a training step costs about 1 + 2 forwards.
BACKWARD_PER_FORWARD = 2


def recompute_fraction(config=None, seq: int = 2048, gradient_checkpointing="full", *, checkpoint_every: int = 2) -> float:
    """Extra compute of a training step from activation checkpointing, as a fraction of the step.

    A step costs about 3 forwards (backward is about twice the forward: the usual 2N forward / 4N
    backward FLOPs per token and parameter); checkpointing adds one forward of each checkpointed
    layer. Counted from the model's matmul and attention FLOPs (:func:`_forward_flops_per_token`).
    Notebook 06 prints it for full and selective checkpointing.
    """
    config, _ = config_and_label(config)
    d = _spec(config).dims
    layer, head = _forward_flops_per_token(d, seq)
    recomputed = checkpointed_layers(d["layers"], gradient_checkpointing, checkpoint_every) * layer
    return recomputed / ((1 + BACKWARD_PER_FORWARD) * (d["layers"] * layer + head))


def _tp_dims(d: dict) -> dict:
    """The planner's dims under the config names :mod:`trnlab.mesh` checks tensor parallelism with."""
    return {"num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"],
            "intermediate_size": d["intermediate"]}


def _tp_problem(d: dict, tp: int, world: int | None = None, where: str = "") -> str | None:
    """Why a model cannot take tensor-parallel size ``tp`` (whole heads, equal MLP slices), or None.
    With ``world`` (ranks on ``where``), the sizes it suggests also divide the world."""
    dims = _tp_dims(d)
    bad = [f"{label} = {value}" for _, label, value in tp_misfits(dims, tp)]
    if not bad:
        return None
    ok = tp_sizes_that_fit(dims, world or d["kv_heads"])
    on = f" on {where} ({world} ranks), with fsdp_size = {world} // tp_size" if world else ""
    return (f"tp_size={tp} does not divide the model's {', '.join(bad)}: each tensor-parallel rank must get "
            f"whole heads and an equal slice. Use tp_size in {ok}{on}.")


def _train_layer_bytes(d: dict, tokens: int, b: int, tp: int) -> float:
    """Bytes one decoder layer saves for backward on one TP rank (TRAIN_ACTIVATION_FORMULA)."""
    split = (4 + 3 * b) * (d["q_dim"] + d["kv_dim"]) + 4 * b * d["intermediate"] + 8 * d["heads"] + 4 * d["kv_heads"]
    return tokens * ((8 + 4 * b) * d["hidden"] + split / tp + 8)


@dataclass
class MemoryPlan:
    """Bytes one rank holds for a model, a mesh and a workload (:func:`plan_memory` makes it).

    ``components`` maps :data:`COMPONENTS` to bytes; ``parameters``, ``gradients`` and
    ``optimizer`` are exact for Transformers' sharding, ``fsdp_buffers`` and ``activations``
    are estimates (see ``notes``). ``total`` is their sum.
    """

    model: str
    tp_size: int
    fsdp_size: int
    workload: str
    batch: int
    seq: int
    dtype: str
    master_weights: str
    optimizer_name: str
    gradient_checkpointing: bool
    cache_length: int
    components: dict
    parameter_count: int          # the whole model (tied weights once)
    local_parameter_count: int    # held by this rank
    shards: list = field(default_factory=list, repr=False)
    notes: list = field(default_factory=list)
    activation_detail: dict = field(default_factory=dict)  # per_layer, layers, head (bytes)
    checkpointing: str = "none"   # "none", "selective" or "full" (gradient_checkpointing: any of the last two)
    checkpoint_every: int = 2     # selective: every k-th layer checkpointed

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
        """``"no activation checkpointing"``, ``"full activation checkpointing"`` or
        ``"selective activation checkpointing (every 2nd layer)"``."""
        return _checkpointing_label(self.checkpointing, self.checkpoint_every)

    def fits(self, budget_bytes: int, headroom: float = 0.1) -> bool:
        """Whether :attr:`total` fits ``budget_bytes`` with ``headroom`` (a fraction) kept free."""
        return self.total <= budget_bytes * (1 - headroom)

    def table(self) -> str:
        """The components as a text table (bytes and GiB)."""
        lines = [f"{'component':<42} {'bytes':>18} {'GiB':>9}"]
        for key in COMPONENTS:
            value = self.components[key]
            lines.append(f"{COMPONENT_LABELS[key]:<42} {value:>18,} {value / GiB:>9.3f}")
        lines.append(f"{'total per rank':<42} {self.total:>18,} {self.total / GiB:>9.3f}")
        return "\n".join(lines)

    def summary(self) -> dict:
        """The plan's headline figures as a dict: model, mesh, workload, parameters held, bytes per rank.

        Until trnlab 0.3 the dict also behaves like :meth:`describe`'s text where a string was
        expected, with a ``FutureWarning`` for all but ``print``/``str``: ``summary()`` returned that text before.
        """
        return SummaryDict("MemoryPlan", self.describe(), {
            "model": self.model, "tp_size": self.tp_size, "fsdp_size": self.fsdp_size, "workload": self.workload,
            "batch": self.batch, "seq": self.seq, "dtype": self.dtype, "parameter_count": self.parameter_count,
            "local_parameter_count": self.local_parameter_count, "total_bytes": self.total,
            "total_gib": round(self.total / GiB, 4)})

    def describe(self) -> str:
        """One paragraph: model, mesh, workload, parameters held, total per rank."""
        what = (f"training (micro-batch {self.batch} x {self.seq} tokens per rank, {self.master_weights} "
                f"master weights, {self.optimizer_name}, compute {self.dtype}"
                f"{', ' + self.checkpointing_label if self.gradient_checkpointing else ''})"
                if self.workload == "train" else
                f"inference ({self.batch} x {self.seq} tokens per rank, {self.dtype}, static cache of "
                f"{self.cache_length} positions)")
        return (f"{self.model} on {self.mesh}, {what}: each rank holds {self.local_parameter_count:,} of "
                f"{self.parameter_count:,} parameters; {self.total / GiB:.2f} GiB per rank in all.")

    def to_dict(self, shards: bool = False) -> dict:
        """JSON-ready: settings, bytes per component, total (and every tensor's shard if ``shards``)."""
        out = {"model": self.model, "tp_size": self.tp_size, "fsdp_size": self.fsdp_size,
               "workload": self.workload, "batch": self.batch, "seq": self.seq, "dtype": self.dtype,
               "master_weights": self.master_weights, "optimizer": self.optimizer_name,
               "gradient_checkpointing": self.gradient_checkpointing, "checkpointing": self.checkpointing,
               "checkpoint_every": self.checkpoint_every, "cache_length": self.cache_length,
               "parameter_count": self.parameter_count, "local_parameter_count": self.local_parameter_count,
               "components": dict(self.components), "training_state_bytes": self.training_state,
               "total_bytes": self.total, "total_gib": round(self.total / GiB, 4),
               "activation_detail": dict(self.activation_detail), "notes": list(self.notes)}
        if shards:
            out["shards"] = [s.to_dict() for s in self.shards]
        return out

    def __str__(self) -> str:
        return self.describe() + "\n" + self.table()


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _checkpointing_label(mode: str, every: int = 2) -> str:
    if mode == "none":
        return "no activation checkpointing"
    if mode == "full":
        return "full activation checkpointing"
    return f"selective activation checkpointing (every {_ordinal(every)} layer)"


_WORKLOADS = {"inference": "inference", "generate": "inference", "train": "train", "training": "train"}
_MASTER = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}
_OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0}   # fp32/bf16 state tensors per parameter


def plan_memory(config=None, tp_size: int = 1, fsdp_size: int = 1, *, workload: str = "inference",
                batch: int = 1, seq: int = 2048, dtype="bfloat16", master_weights: str = "fp32",
                optimizer: str = "adamw", gradient_checkpointing: bool | str = False,
                cache_length: int | None = None, checkpoint_every: int = 2) -> MemoryPlan:
    """Estimate the bytes one rank holds for ``config`` on a ``tp_size x fsdp_size`` mesh.

    ``config``: anything :func:`config_and_label` takes (config, dict, shipped name such as
    ``"Qwen/Qwen3-8B"``, folder, ``None`` for the course model). ``batch`` is the micro-batch of
    **each data-parallel (FSDP) rank**: FSDP is data parallelism, every FSDP rank runs its own
    ``batch`` sequences (the global batch is ``batch * fsdp_size``), and the TP ranks of one FSDP
    rank share it. ``seq`` is tokens per sequence.

    * parameters: every tensor split as :func:`parameter_shards` says, in ``dtype`` for
      inference and in the master-weight dtype (``master_weights="fp32"`` or ``"bf16"``) for
      training. Exact for Transformers' ``DistributedConfig`` (FSDP2 padding included).
    * gradients (training): one per parameter shard, in the parameter's dtype.
    * optimizer (training): AdamW keeps 2 moments per parameter, created like the parameter
      (``torch.optim.AdamW``: ``zeros_like``), so fp32 with fp32 master weights; plus one fp32
      ``step`` scalar per tensor. ``optimizer="sgd"``: none.
    * fsdp_buffers (estimate, fsdp_size > 1): FSDP2 all-gathers each layer before using it, two
      layers at a time (current + prefetched), and keeps the ``keep_full_weight`` modules (final
      norm, lm_head / tied embedding) gathered from forward to backward; in ``dtype``. Training
      adds one layer's unsharded gradients before the reduce-scatter.
    * activations (an estimate; T = batch*seq, b = dtype bytes, h, q = heads*head_dim,
      kv = kv_heads*head_dim, i = intermediate_size, V = vocab). Training, per layer, the bytes
      saved for backward ``T*((8 + 4b)*h + ((4 + 3b)*(q + kv) + 4b*i + 8*heads + 4*kv_heads)/tp + 8)``
      (counted exactly on Qwen3 with SDPA in fp32 and bf16: RMSNorm keeps an fp32 copy of its
      input), times the layers; with ``gradient_checkpointing=True`` (or ``"full"``) each layer
      keeps only its input ``T*b*h`` and one layer is recomputed at a time; with
      ``gradient_checkpointing="selective"`` every ``checkpoint_every``-th layer is checkpointed
      that way and the others keep everything (TorchTitan's layer-level selective AC,
      :data:`SELECTIVE_ACTIVATION_FORMULA`); plus the loss head
      ``T*((4 + 2b)*h + V*(b + 8))`` (logits, their fp32 copy, fp32 log-probs: the full vocabulary
      on every TP rank). TP splits the head- and MLP-wide tensors, not the h-wide residual
      stream; FSDP does not split activations: each FSDP rank holds those of its own
      micro-batch. Inference (generate's prefill, no_grad): one layer's temporaries
      ``T*b*(2h + max(2q + 2kv, 3i)/tp)`` plus the last position's logits ``batch*V*(b + 4)``.
      The formulas are :data:`TRAIN_ACTIVATION_FORMULA` and :data:`INFERENCE_ACTIVATION_FORMULA`.
    * kv_cache (inference): the static cache ``batch * cache_length * layers * kv_heads/tp *
      head_dim * 2 (keys, values) * b``. ``cache_length`` defaults to ``seq``; ``generate(...,
      cache_implementation="static")`` allocates ``max_length - 1`` = prompt + new tokens - 1.

    Returns a :class:`MemoryPlan` (``.components``, ``.total``, ``.table()``, ``.summary()``, ``.describe()``,
    ``.to_dict()``). Used by :func:`plan_mesh`, notebook 06 and ``python -m trnlab plan``.
    """
    config, label = config_and_label(config)
    workload_key = _workload(workload)
    for name, value in (("tp_size", tp_size), ("fsdp_size", fsdp_size), ("batch", batch), ("seq", seq),
                        ("checkpoint_every", checkpoint_every)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanError(f"{name}={value!r}: a whole number >= 1")
    mode = checkpointing_mode(gradient_checkpointing)
    master, opt = _master_weights(master_weights), _optimizer(optimizer)
    dtype_name = _dtype_name(dtype)
    b = DTYPE_BYTES[dtype_name]
    spec = _checked_spec(config, tp_size)
    cache_length = seq if cache_length is None else cache_length
    if not isinstance(cache_length, int) or cache_length < 1:
        raise PlanError(f"cache_length={cache_length!r}: a whole number >= 1")

    shards = _shards(spec, tp_size, fsdp_size)
    local = sum(s.local_numel for s in shards)
    train = workload_key == "train"
    param_bytes = DTYPE_BYTES[master] if train else b
    comp, notes = dict.fromkeys(COMPONENTS, 0), []
    comp["parameters"] = parameter_bytes(shards, param_bytes)
    if train:
        comp["gradients"] = gradient_bytes(shards, param_bytes)
        comp["optimizer"] = optimizer_bytes(shards, opt, param_bytes)
    if fsdp_size > 1:
        comp["fsdp_buffers"] = fsdp_buffer_bytes(spec, shards, b, param_bytes if train else 0)
        notes.append(_FSDP_BUFFER_NOTE + ("; + one layer of unsharded gradients" if train else "") + " (estimate).")
    if train:
        comp["activations"], detail = train_activation_bytes(spec.dims, batch * seq, b, tp_size, mode, checkpoint_every)
        notes.append("activations (estimate): " + TRAIN_ACTIVATION_FORMULA
                     + ("; " + SELECTIVE_ACTIVATION_FORMULA if mode == "selective" else "") + ".")
    else:
        comp["activations"], detail = inference_activation_bytes(spec.dims, batch, seq, b, tp_size)
        comp["kv_cache"] = kv_cache_bytes(spec.dims, batch, cache_length, b, tp_size)
        notes += ["activations (estimate): " + INFERENCE_ACTIVATION_FORMULA + ".",
                  _kv_cache_note(spec.dims, batch, cache_length, b, tp_size)]
    notes += _workload_notes(spec.dims, batch, seq, cache_length, fsdp_size, train)
    return MemoryPlan(
        model=label, tp_size=tp_size, fsdp_size=fsdp_size, workload=workload_key, batch=batch, seq=seq,
        dtype=dtype_name, master_weights=master, optimizer_name=opt,
        gradient_checkpointing=train and mode != "none", checkpointing=mode if train else "none",
        checkpoint_every=checkpoint_every,
        cache_length=cache_length if not train else 0, components=comp,
        parameter_count=sum(_count(p[1]) for p in spec.params), local_parameter_count=local,
        shards=shards, notes=notes, activation_detail=detail)


def _workload(workload) -> str:
    key = _WORKLOADS.get(str(workload).lower())
    if key is None:
        raise PlanError(f"workload={workload!r}: use 'inference' or 'train'")
    return key


def _master_weights(master_weights) -> str:
    master = _MASTER.get(str(master_weights).lower())
    if master is None:
        raise PlanError(f"master_weights={master_weights!r}: use 'fp32' or 'bf16'")
    return master


def _optimizer(optimizer) -> str:
    opt = str(optimizer).lower()
    if opt not in _OPTIMIZERS:
        raise PlanError(f"optimizer={optimizer!r}: the planner knows {', '.join(_OPTIMIZERS)}")
    return opt


def _checked_spec(config, tp_size: int) -> _ModelSpec:
    """The model's spec, refusing a ``tp_size`` the model has no plan for or whose heads do not divide."""
    spec = _spec(config)
    if tp_size > 1 and not spec.dims["has_tp_plan"]:
        raise PlanError(f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan): use tp_size=1")
    if tp_size > 1 and _tp_problem(spec.dims, tp_size):
        raise PlanError(_tp_problem(spec.dims, tp_size))
    return spec


# The components of plan_memory, one function each: bytes on one rank (see plan_memory's docstring).

def parameter_bytes(shards: list[TensorShard], param_bytes: int) -> int:
    """This rank's parameter shards, ``param_bytes`` each (the master-weight dtype when training)."""
    return sum(s.local_numel for s in shards) * param_bytes


def gradient_bytes(shards: list[TensorShard], param_bytes: int) -> int:
    """Training: one gradient per parameter shard, in the parameter's dtype."""
    return parameter_bytes(shards, param_bytes)


def optimizer_bytes(shards: list[TensorShard], optimizer: str, param_bytes: int) -> int:
    """Training: the optimizer's state tensors per parameter (AdamW: 2 moments) plus one fp32 step per tensor."""
    optimizer = _optimizer(optimizer)
    steps = 4 * len(shards) if optimizer != "sgd" else 0
    return _OPTIMIZERS[optimizer] * parameter_bytes(shards, param_bytes) + steps


_FSDP_BUFFER_NOTE = ("fsdp_buffers: 2 gathered layers (current + prefetched) + the keep_full_weight modules "
                     "(final norm, lm_head/tied embedding) in the compute dtype")


def fsdp_buffer_bytes(spec: _ModelSpec, shards: list[TensorShard], b: int, grad_bytes: int = 0) -> int:
    """FSDP2's gathered weights (estimate): the biggest layer twice plus the keep_full_weight modules, in
    ``b`` bytes; ``grad_bytes`` > 0 (training) adds one layer of unsharded gradients in that dtype."""
    by_name = {s.name: s for s in shards}
    layer_numel: dict[int, int] = {}
    for name, _shape, _style, layer in spec.params:
        if layer is not None:
            layer_numel[layer] = layer_numel.get(layer, 0) + by_name[name].tp_numel
    biggest = max(layer_numel.values(), default=0)
    kept = sum(by_name[n].tp_numel for n in spec.keep_full)
    return (2 * biggest + kept) * b + biggest * grad_bytes


def train_activation_bytes(d: dict, tokens: int, b: int, tp: int, mode: str, every: int = 2) -> tuple[int, dict]:
    """Training activations (estimate, :data:`TRAIN_ACTIVATION_FORMULA`) and their detail
    (``per_layer``, ``layers``, ``head``) for ``tokens`` tokens of this rank's micro-batch."""
    per_layer = _train_layer_bytes(d, tokens, b, tp)
    recomputed = checkpointed_layers(d["layers"], mode, every)
    # checkpointed layers keep their input; the others everything; one recomputed layer at a time
    layers = ((d["layers"] - recomputed) * per_layer + recomputed * tokens * b * d["hidden"]
              + (per_layer if recomputed else 0))
    head = tokens * ((4 + 2 * b) * d["hidden"] + d["vocab"] * (b + 8))
    return int(layers + head), {"per_layer": int(per_layer), "layers": int(layers), "head": int(head)}


def inference_activation_bytes(d: dict, batch: int, seq: int, b: int, tp: int) -> tuple[int, dict]:
    """Prefill activations under no_grad (estimate, :data:`INFERENCE_ACTIVATION_FORMULA`) and their detail."""
    h, i, q, kv = d["hidden"], d["intermediate"], d["q_dim"], d["kv_dim"]
    per_layer = batch * seq * b * (2 * h + max(2 * q + 2 * kv, 3 * i) / tp)
    head = batch * d["vocab"] * (b + 4)
    return int(per_layer + head), {"per_layer": int(per_layer), "layers": int(per_layer), "head": int(head)}


def kv_cache_bytes(d: dict, batch: int, cache_length: int, b: int, tp: int) -> int:
    """The static KV cache: batch x positions x layers x kv heads per TP rank x head_dim x 2 (keys, values) x b."""
    return batch * cache_length * d["layers"] * -(-d["kv_heads"] // tp) * d["head_dim"] * 2 * b


def _kv_cache_note(d: dict, batch: int, cache_length: int, b: int, tp: int) -> str:
    return (f"kv_cache: batch {batch} x {cache_length} positions x {d['layers']} layers x {-(-d['kv_heads'] // tp)} kv "
            f"heads per TP rank x head_dim {d['head_dim']} x 2 (keys, values) x {b} bytes.")


def _workload_notes(d: dict, batch: int, seq: int, cache_length: int, fsdp_size: int, train: bool) -> list[str]:
    notes = []
    if fsdp_size > 1:
        notes.append(f"FSDP is data parallelism: each of the {fsdp_size} FSDP ranks holds the activations"
                     + (" and KV cache" if not train else "") + f" of its own micro-batch ({batch} x {seq}).")
    if d["max_position_embeddings"] and max(seq, cache_length if not train else 0) > d["max_position_embeddings"]:
        notes.append(f"seq/cache_length exceed max_position_embeddings={d['max_position_embeddings']}.")
    return notes


# ---------------------------------------------------------------------------------------------
# Choosing the mesh
# ---------------------------------------------------------------------------------------------

@dataclass
class MeshCandidate:
    """One (tp, fsdp) mesh on the instance: rejected (why), or its plan and whether it fits.

    ``replicas`` > 1: a serving layout of that many independent copies of the mesh (inference).
    """

    tp_size: int
    fsdp_size: int
    plan: MemoryPlan | None = None
    fits: bool = False
    rejected: str = ""
    replicas: int = 1

    @property
    def valid(self) -> bool:
        return not self.rejected

    @property
    def mesh(self) -> str:
        return f"tp={self.tp_size} x fsdp={self.fsdp_size}"

    def to_dict(self) -> dict:
        out = {"tp_size": self.tp_size, "fsdp_size": self.fsdp_size, "valid": self.valid, "fits": self.fits,
               "replicas": self.replicas}
        if self.rejected:
            out["rejected"] = self.rejected
        if self.plan is not None:
            out["checkpointing"] = self.plan.checkpointing
            out["components"] = dict(self.plan.components)
            out["total_bytes"] = self.plan.total
            out["total_gib"] = round(self.plan.total / GiB, 4)
        return out


@dataclass
class MeshPlan:
    """What :func:`plan_mesh` found: every mesh tried, the recommended one and why.

    ``checkpointing`` is the activation checkpointing of the recommendation (and of every row of
    :meth:`table`); ``tried`` lists the (mesh, checkpointing) steps the planner took, in order.
    """

    model: str
    instance: Instance
    nodes: int
    workload: str
    headroom: float
    candidates: list
    recommended: MeshCandidate | None
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

    def table(self) -> str:
        """Every mesh tried, one line each: per-component GiB, total, fits or why rejected."""
        short = {"parameters": "params", "gradients": "grads", "optimizer": "optim",
                 "fsdp_buffers": "fsdp buf", "activations": "activ.", "kv_cache": "kv cache"}
        head = f"{'tp':>3} {'fsdp':>5}  " + " ".join(f"{short[k]:>9}" for k in COMPONENTS) + f" {'total':>9}  verdict"
        lines = [head + "   (GiB per rank" + (f", {_checkpointing_label(self.checkpointing, self.settings.get('checkpoint_every', 2))})"
                                             if self.workload == "train" else ")")]
        for c in self.candidates:
            if c.plan is None:
                lines.append(f"{c.tp_size:>3} {c.fsdp_size:>5}  rejected: {c.rejected}")
                continue
            values = " ".join(f"{c.plan.components[k] / GiB:>9.2f}" for k in COMPONENTS)
            mark = "fits" if c.fits else "too big"
            if c.replicas > 1:
                mark += f" ({c.replicas} replicas)"
            if c is self.recommended:
                mark += "  <- recommended"
            lines.append(f"{c.tp_size:>3} {c.fsdp_size:>5}  {values} {c.plan.total / GiB:>9.2f}  {mark}")
        return "\n".join(lines)

    def summary(self) -> dict:
        """The search's headline figures as a dict: instance, nodes, budget, the recommended mesh.

        Until trnlab 0.3 the dict also behaves like :meth:`describe`'s text where a string was
        expected, with a ``FutureWarning`` for all but ``print``/``str``: ``summary()`` returned that text before.
        """
        rec = self.recommended
        return SummaryDict("MeshPlan", self.describe(), {
            "model": self.model, "instance": self.instance.name, "nodes": self.nodes, "world_size": self.world_size,
            "workload": self.workload, "headroom": self.headroom, "budget_bytes": self.budget,
            "recommended": None if rec is None else {"tp_size": rec.tp_size, "fsdp_size": rec.fsdp_size,
                                                     "replicas": rec.replicas},
            "checkpointing": self.checkpointing, "candidates": len(self.candidates), "reason": self.reason})

    def describe(self) -> str:
        """Instance, budget per core, and the recommendation with its reason."""
        inst = self.instance
        where = f"{self.nodes} x {inst.name}" if self.nodes > 1 else inst.name
        return (f"{self.model}, {self.workload} on {where}: {self.world_size} logical NeuronCores "
                f"({inst.cores_per_chip} per chip), {inst.hbm_per_core / GiB:.0f} GiB HBM each "
                f"({self.budget / GiB:.1f} GiB usable with {self.headroom:.0%} headroom).\n{self.reason}")

    def to_dict(self) -> dict:
        """JSON-ready: instance, nodes, budget, every candidate, the recommendation and its reason."""
        return {"model": self.model, "instance": self.instance.to_dict(), "nodes": self.nodes,
                "world_size": self.world_size, "workload": self.workload, "headroom": self.headroom,
                "budget_bytes": self.budget, "settings": dict(self.settings), "checkpointing": self.checkpointing,
                "recommended": None if self.recommended is None else
                {"tp_size": self.recommended.tp_size, "fsdp_size": self.recommended.fsdp_size,
                 "replicas": self.recommended.replicas, "checkpointing": self.recommended.plan.checkpointing,
                 "plan": self.recommended.plan.to_dict()},
                "reason": self.reason, "tried": [dict(t) for t in self.tried],
                "candidates": [c.to_dict() for c in self.candidates]}

    def __str__(self) -> str:
        return self.describe() + "\n" + self.table()


def _where(inst: Instance, nodes: int) -> str:
    return f"{nodes} x {inst.name}" if nodes > 1 else inst.name


def _whole(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise PlanError(f"{name}={value!r}: a whole number >= 1")


def _given_mesh(config, inst: Instance, nodes: int, tp_size: int | None, fsdp_size: int | None) -> tuple[int, int]:
    """The one mesh ``tp_size``/``fsdp_size`` name, checked: the model's heads first, then the launch."""
    _whole("tp_size", tp_size)
    _whole("fsdp_size", fsdp_size)
    world, where = inst.logical_cores * nodes, _where(inst, nodes)
    d = _spec(config).dims
    ok_tps = [t for t in divisors(world) if not _tp_problem(d, t)]
    if tp_size is not None and _tp_problem(d, tp_size):
        if world % tp_size == 0 and fsdp_size in (None, world // tp_size):
            try:   # the launcher's own message, as `launch` would print it
                validate_parallel_sizes(world, tp_size, world // tp_size, model_config=config)
            except LaunchConfigError as exc:
                raise PlanError(str(exc)) from exc
        # The heads come first: a launch-size message would hide why this tp cannot work at all.
        raise PlanError(_tp_problem(d, tp_size, world, where))
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
    try:
        validate_parallel_sizes(world, tp_size, fsdp_size, model_config=config)
    except LaunchConfigError as exc:
        raise PlanError(str(exc)) from exc
    if inst.cores_per_host % tp_size:
        raise PlanError(_across_hosts(inst, tp_size))
    return tp_size, fsdp_size


def _across_hosts(inst: Instance, tp: int) -> str:
    return (f"tp_size={tp} would split a TP group across hosts ({inst.cores_per_host} cores per "
            f"host): TP all-reduces twice per layer, and Neuron keeps it within a chip ('Keep TP4 within a chip')")


def _mesh_candidates(config, inst: Instance, nodes: int) -> list[MeshCandidate]:
    """Every (tp, world // tp) mesh, rejected ones with the launcher's reason; no plans yet."""
    world = inst.logical_cores * nodes
    out = []
    for tp in divisors(world):
        try:
            validate_parallel_sizes(world, tp, world // tp, model_config=config)
        except LaunchConfigError as exc:
            out.append(MeshCandidate(tp, world // tp, rejected=str(exc)))
            continue
        if inst.cores_per_host % tp:
            out.append(MeshCandidate(tp, world // tp, rejected=_across_hosts(inst, tp)))
            continue
        out.append(MeshCandidate(tp, world // tp))
    return out


def _planned(config, cand: MeshCandidate, workload: str, mem_kwargs: dict, mode: str,
             budget: int, headroom: float) -> MeshCandidate:
    if cand.rejected:
        return cand
    plan = plan_memory(config, cand.tp_size, cand.fsdp_size, workload=workload,
                       **{**mem_kwargs, "gradient_checkpointing": mode})
    return MeshCandidate(cand.tp_size, cand.fsdp_size, plan=plan, fits=plan.fits(budget, headroom),
                         replicas=cand.replicas)


@dataclass
class _Choice:
    """What :func:`_search` found: the mesh, its checkpointing, and every step tried before it."""

    candidate: MeshCandidate
    mode: str
    tried: list
    kind: str    # "fsdp-only", "tp-in-chip", "tp-across-chips", "replicas", "given"
    passed_over: list = field(default_factory=list)  # in-chip meshes between tp=1 and the chip's TP that fit too


def _attempt(job: tuple, cand: MeshCandidate, mode: str, kind: str) -> _Choice | None:
    """Plan ``cand`` with checkpointing ``mode``, note it in the job's ``tried`` list; the choice if it fits."""
    config, workload, mem_kwargs, budget, headroom, tried = job
    planned = _planned(config, cand, workload, mem_kwargs, mode, budget, headroom)
    tried.append({"tp_size": cand.tp_size, "fsdp_size": cand.fsdp_size, "replicas": cand.replicas,
                  "checkpointing": mode, "total_bytes": planned.plan.total, "fits": planned.fits})
    return _Choice(planned, mode, tried, kind) if planned.fits else None


def _search(config, inst: Instance, nodes: int, workload: str, headroom: float, mem_kwargs: dict,
            modes: tuple, given: tuple | None = None) -> _Choice | None:
    """Walk the planner's ladder (module docstring, :func:`plan_mesh`); the first step that fits, or None."""
    world, chip, budget = inst.logical_cores * nodes, inst.cores_per_chip, inst.hbm_per_core
    tried = []
    job = (config, workload, mem_kwargs, budget, headroom, tried)

    if given is not None:
        for mode in modes:
            hit = _attempt(job, MeshCandidate(*given), mode, "given")
            if hit:
                return hit
        return None
    valid = [c for c in _mesh_candidates(config, inst, nodes) if c.valid]
    in_chip = [c for c in valid if c.tp_size <= chip]
    if workload == "inference":
        # Serving: independent replicas without FSDP (FSDP would all-gather every layer for every token).
        for cand in in_chip:
            hit = _attempt(job, MeshCandidate(cand.tp_size, 1, replicas=world // cand.tp_size), "none", "replicas")
            if hit:
                return hit
    steps = [c for c in in_chip if c.tp_size == 1]
    if any(c.tp_size > 1 for c in in_chip):   # TP fills the chip: "Keep TP4 within a chip"
        steps.append(max((c for c in in_chip if c.tp_size > 1), key=lambda c: c.tp_size))
    for mode in modes:
        for cand in steps:
            hit = _attempt(job, cand, mode, "fsdp-only" if cand.tp_size == 1 else "tp-in-chip")
            if hit:
                if hit.kind == "tp-in-chip":  # the ladder skips 1 < tp < chip: say which of those fit too
                    middle = (_planned(config, c, workload, mem_kwargs, mode, budget, headroom)
                              for c in in_chip if 1 < c.tp_size < cand.tp_size)
                    hit.passed_over = [m for m in middle if m.fits]
                return hit
    for mode in modes:           # last resort: TP across chips
        for cand in (c for c in valid if c.tp_size > chip):
            hit = _attempt(job, cand, mode, "tp-across-chips")
            if hit:
                return hit
    return None


#: Node counts tried when looking for "more nodes" (beyond 8, the usual cluster sizes).
_NODE_COUNTS = (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)


def _head_ok_tps(config, inst: Instance) -> list[int]:
    d = _spec(config).dims
    return [tp for tp in divisors(inst.cores_per_host) if not _tp_problem(d, tp)]


def _scales_with_nodes(config, inst: Instance, workload: str, headroom: float, mem_kwargs: dict, mode: str) -> bool:
    """Whether any node count could fit: more ranks shrink the FSDP-sharded state, never a rank's
    activations or gathered layers, so if even an unbounded FSDP size does not fit, none will."""
    return any(plan_memory(config, tp, 1 << 20, workload=workload, **{**mem_kwargs, "gradient_checkpointing": mode})
               .fits(inst.hbm_per_core, headroom) for tp in _head_ok_tps(config, inst))


def _more_nodes(config, inst, start, workload, headroom, mem_kwargs, modes):
    if not _scales_with_nodes(config, inst, workload, headroom, mem_kwargs, modes[-1]):
        return None
    for n in (c for c in _NODE_COUNTS if c > start):
        hit = _search(config, inst, n, workload, headroom, mem_kwargs, modes)
        if hit:
            return n, hit
    return None


def _largest_batch(config, inst, nodes, workload, headroom, mem_kwargs, modes, upper: int):
    """The largest micro-batch in [1, upper] that fits, by bisection (memory grows with the batch)."""
    if upper < 1:
        return None
    args = (config, inst, nodes, workload, headroom)
    best = _search(*args, {**mem_kwargs, "batch": 1}, modes)
    if best is None:
        return None
    lo, hi, found = 1, upper, (1, best)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        hit = _search(*args, {**mem_kwargs, "batch": mid}, modes)
        if hit:
            lo, found = mid, (mid, hit)
        else:
            hi = mid - 1
    return found


def _say(hit: _Choice, workload: str) -> str:
    c = hit.candidate
    mesh = f"{c.replicas} replicas of tp={c.tp_size}" if c.replicas > 1 else c.mesh
    ckpt = f", {_checkpointing_label(hit.mode, c.plan.checkpoint_every)}" if workload == "train" else ""
    return f"{mesh}{ckpt}, {c.plan.total / GiB:.1f} GiB per core"


def _checkpointing_flag(mode: str) -> str:
    return f"--checkpointing {mode}"


def _what_would_fit(config, inst: Instance, nodes: int, workload: str, headroom: float, mem_kwargs: dict,
                    modes: tuple) -> list[str]:
    """Computed alternatives for a workload that fits no mesh: each one was planned and fits.

    First one change at a time (:func:`_single_changes`); if none fits, a micro-batch of 1 and full
    checkpointing with more scale (:func:`_lean_changes`); then also a shorter sequence (:func:`_shorter_seq`).
    """
    bigger = sorted((o for o in INSTANCES.values() if o.hbm_total > inst.hbm_total * nodes), key=lambda o: o.hbm_total)
    return (_single_changes(config, inst, nodes, workload, headroom, mem_kwargs, modes, bigger)
            or _lean_changes(config, inst, nodes, workload, headroom, mem_kwargs, modes, bigger)
            or _shorter_seq(config, inst, nodes, workload, headroom, mem_kwargs, modes))


def _single_changes(config, inst, nodes, workload, headroom, mem_kwargs, modes, bigger) -> list[str]:
    """More nodes, a larger instance, a smaller batch, heavier checkpointing: each that fits alone."""
    out, where, args = [], _where(inst, nodes), (workload, headroom)
    found = _more_nodes(config, inst, nodes, *args, mem_kwargs, modes)
    if found:
        n, hit = found
        out.append(f"{n} x {inst.name} (--nodes {n}): {_say(hit, workload)}")
    for other in bigger:
        hit = _search(config, other, 1, *args, mem_kwargs, modes)
        if hit:
            out.append(f"one {other.name}: {_say(hit, workload)}")
            break
    found = _largest_batch(config, inst, nodes, *args, mem_kwargs, modes, mem_kwargs["batch"] - 1)
    if found:
        out.append(f"--batch {found[0]} on {where}: {_say(found[1], workload)}")
    heavier = ([m for m in CHECKPOINTING if CHECKPOINTING.index(m) > CHECKPOINTING.index(modes[-1])]
               if workload == "train" else [])
    for mode in heavier:
        found = _largest_batch(config, inst, nodes, *args, mem_kwargs, (mode,), mem_kwargs["batch"])
        if found:
            extra = "" if found[0] == mem_kwargs["batch"] else f" --batch {found[0]}"
            out.append(f"{_checkpointing_flag(mode)}{extra} on {where}: {_say(found[1], workload)}")
            break
    return out


def _lean(mem_kwargs: dict, modes: tuple, workload: str) -> tuple[dict, tuple, str]:
    """The leanest settings: a micro-batch of 1 (and full checkpointing for training), and their flags."""
    train = workload == "train"
    flags = " ".join((["--batch 1"] if mem_kwargs["batch"] > 1 else [])
                     + ([_checkpointing_flag("full")] if train and modes[-1] != "full" else [])) or "the same settings"
    return {**mem_kwargs, "batch": 1}, ("full",) if train else modes, flags


def _lean_changes(config, inst, nodes, workload, headroom, mem_kwargs, modes, bigger) -> list[str]:
    """The leanest settings here, else with more nodes, else on a larger instance (with its nodes)."""
    lean, lean_modes, flags = _lean(mem_kwargs, modes, workload)
    out, args = [], (workload, headroom)
    hit = _search(config, inst, nodes, *args, lean, lean_modes)
    if hit:
        return [f"{flags} on {_where(inst, nodes)}: {_say(hit, workload)}"]
    found = _more_nodes(config, inst, nodes, *args, lean, lean_modes)
    if found:
        n, hit = found
        out.append(f"{flags} on {n} x {inst.name} (--nodes {n}): {_say(hit, workload)}")
    for other in bigger:
        hit = _search(config, other, 1, *args, lean, lean_modes)
        if hit:
            out.append(f"{flags} on one {other.name}: {_say(hit, workload)}")
            break
        found = _more_nodes(config, other, 1, *args, lean, lean_modes)
        if found:
            n, hit = found
            out.append(f"{flags} on {n} x {other.name} (--nodes {n}): {_say(hit, workload)}")
            break
    return out


def _shorter_seq(config, inst, nodes, workload, headroom, mem_kwargs, modes) -> list[str]:
    """The leanest settings with the sequence halved until it fits (down to 128), or what was tried."""
    lean, lean_modes, flags = _lean(mem_kwargs, modes, workload)
    seq = mem_kwargs["seq"] // 2
    while seq >= 128:
        changes = {**lean, "seq": seq}
        if mem_kwargs.get("cache_length") is not None:
            changes["cache_length"] = min(mem_kwargs["cache_length"], seq)
        hit = _search(config, inst, nodes, workload, headroom, changes, lean_modes)
        if hit:
            return [f"{flags} --seq {seq} on {_where(inst, nodes)}: {_say(hit, workload)}"]
        seq //= 2
    return [f"nothing the planner tried (up to {_NODE_COUNTS[-1]} nodes, batch 1"
            + (", full activation checkpointing" if workload == "train" else "") + ", seq down to 128)"]


#: AWS's published layout for Qwen3-8B training on one trn2.48xlarge (TorchTitan Neuron tutorial).
AWS_QWEN3_8B_RECIPE = {"model": "Qwen/Qwen3-8B", "instance": DEFAULT_INSTANCE, "tp_size": 4, "fsdp_size": 16,
                       "checkpointing": "selective", "config": "qwen3_8b_tp4_fsdp16_sac", "source": TORCHTITAN_TUTORIAL_URL}


def _tried_text(tried: list, chosen: dict, workload: str = "train") -> str:
    failed = [t for t in tried if not t["fits"] and t is not chosen]
    if not failed:
        return ""
    by_mode: dict[str, list[str]] = {}
    for t in failed:
        mesh = (f"{t['replicas']} replicas of tp={t['tp_size']}" if t["replicas"] > 1
                else f"tp={t['tp_size']} x fsdp={t['fsdp_size']}")
        by_mode.setdefault(t["checkpointing"], []).append(f"{mesh} needs {t['total_bytes'] / GiB:.1f} GiB")
    if workload != "train":
        return "Tried first: " + ", ".join(v for values in by_mode.values() for v in values) + ". "
    return "Tried first: " + "; ".join(f"{_checkpointing_label(m)}: {', '.join(v)}" for m, v in by_mode.items()) + ". "


def _headline(choice: _Choice, budget: int, train: bool) -> str:
    """The reason's first sentence: the mesh chosen (or given), and its bytes against the budget."""
    best, plan, mode = choice.candidate, choice.candidate.plan, choice.mode
    ckpt = f" with {_checkpointing_label(mode, plan.checkpoint_every)}" if train and mode != "none" else ""
    fits = f"{plan.total / GiB:.2f} of {budget / GiB:.1f} GiB usable per core. "
    if choice.kind == "replicas":
        return (f"Recommended for serving: {best.replicas} independent replicas of DistributedConfig(tp_size="
                f"{best.tp_size}) (tp={best.tp_size} x fsdp=1), " + fits)
    if choice.kind == "given":
        return f"Planned the mesh you gave: tp={best.tp_size} x fsdp={best.fsdp_size}{ckpt}, " + fits
    return f"Recommended: tp={best.tp_size} x fsdp={best.fsdp_size}{ckpt}, " + fits


def _serving_text(choice: _Choice, chip: int) -> str:
    """Why serving replicas take no FSDP, and where each replica's TP group sits."""
    best, plan = choice.candidate, choice.candidate.plan
    why = ("Serving uses no FSDP: FSDP all-gathers every layer on every forward, that is for every new "
           "token; each replica holds the whole model and answers its own requests. ")
    if best.tp_size > 1:
        why += (f"tp={best.tp_size} keeps each replica inside one chip ({chip} logical cores per chip), "
                f"where its all-reduces stay on the chip. ")
    return why + f"Each replica serves {plan.batch} sequence(s) of {plan.cache_length} cache positions."


def _tp_text(choice: _Choice, chip: int) -> str:
    """Why this tensor-parallel size: FSDP alone, TP inside a chip (and what was passed over), or across chips."""
    best = choice.candidate
    if best.tp_size == 1:
        return ("FSDP alone fits: no tensor parallelism (Neuron's training best practices: start with the least "
                "model parallelism that leaves memory headroom). ")
    if best.tp_size > chip:
        return (f"tp={best.tp_size} spans {best.tp_size // chip} chips, against Neuron's advice to keep TP within "
                f"a chip ({chip} logical cores): " + ("you asked for it. " if choice.kind == "given" else
                                                      "no mesh with TP inside a chip fits. "))
    why = (f"tp={best.tp_size} keeps each TP group inside one chip ({chip} logical cores per chip; Neuron's "
           f"training best practices: \"Keep TP4 within a chip\"), so TP's two all-reduces per layer stay "
           f"on the chip" + (", and FSDP goes between the chips. " if best.fsdp_size > 1 else ". "))
    if choice.passed_over:
        fit = ", ".join(f"tp={c.tp_size} x fsdp={c.fsdp_size} ({c.plan.total / GiB:.2f} GiB)"
                        for c in choice.passed_over)
        why += (f"{fit} would fit too, but the planner passes over TP smaller than a chip: after FSDP alone "
                f"its next step is a whole chip of TP (tp={best.tp_size}), following Neuron's \"Keep TP4 within "
                f"a chip\" and AWS's published tp=4 x fsdp=16 recipe for Qwen3-8B; a layout rule, not a measured "
                f"speed-up. ")
    return why


def _sharding_text(choice: _Choice, config, train: bool) -> str:
    """What FSDP shards, what checkpointing recomputes, and each rank's micro-batch."""
    best, plan, mode = choice.candidate, choice.candidate.plan, choice.mode
    why = ""
    if best.fsdp_size > 1:
        why += ("FSDP shards the weights" + (", gradients and optimizer state" if train else "")
                + f" over {best.fsdp_size} ranks and gathers each layer when it runs, overlapping compute. ")
    if train and mode != "none":
        layers = _spec(config).dims["layers"]
        recomputed = checkpointed_layers(layers, mode, plan.checkpoint_every)
        why += (f"Checkpointing recomputes {recomputed} of {layers} layers' forward in backward: about "
                f"{recompute_fraction(config, plan.seq, mode, checkpoint_every=plan.checkpoint_every):.0%} more "
                f"compute per step (estimate from FLOPs). ")
    return why + (f"Each FSDP rank runs its own micro-batch of {plan.batch} x {plan.seq} tokens "
                  f"(global batch {plan.batch * best.fsdp_size * best.replicas}).")


def _recipe_text(choice: _Choice, inst: Instance, label: str, auto: bool) -> str:
    """How the plan compares with AWS's published layout, when it plans that model on that instance."""
    best, plan, mode = choice.candidate, choice.candidate.plan, choice.mode
    recipe = AWS_QWEN3_8B_RECIPE
    same = (best.tp_size, best.fsdp_size, mode) == (recipe["tp_size"], recipe["fsdp_size"], recipe["checkpointing"])
    if same:
        return (f" This is AWS's published layout for {label} on a {inst.name} (TorchTitan config "
                f"{recipe['config']}; which selective option that config sets was not found: 'every "
                f"{_ordinal(plan.checkpoint_every)} layer' is the planner's assumption).")
    if choice.kind == "given":
        because = "you gave the mesh."
    elif not auto:
        because = f"you fixed the checkpointing ({_checkpointing_label(mode, plan.checkpoint_every)})."
    else:
        because = (f"at this workload tp={best.tp_size} x fsdp={best.fsdp_size} with "
                   f"{_checkpointing_label(mode, plan.checkpoint_every).replace('activation ', '')} fits already "
                   f"(less model parallelism or less recompute).")
    return (f" AWS's published layout for {label} on a {inst.name} is tp=4 x fsdp=16 with selective activation "
            f"checkpointing (TorchTitan config {recipe['config']}); here it is not recommended because " + because)


def _reason(choice: _Choice, config, inst: Instance, nodes: int, budget: int, workload: str, label: str,
            auto: bool = True) -> str:
    """The recommendation in words: the mesh, what was tried, why this TP and FSDP, AWS's layout."""
    train, chip = workload == "train", inst.cores_per_chip
    why = _headline(choice, budget, train) + _tried_text(choice.tried, choice.tried[-1], workload)
    if choice.kind == "replicas":
        return why + _serving_text(choice, chip)
    why += _tp_text(choice, chip) + _sharding_text(choice, config, train)
    recipe = AWS_QWEN3_8B_RECIPE
    if train and label == recipe["model"] and inst.name == recipe["instance"] and nodes == 1:
        why += _recipe_text(choice, inst, label, auto)
    return why


def plan_mesh(config=None, instance=DEFAULT_INSTANCE, workload: str = "inference", *, batch: int = 1,
              seq: int = 2048, headroom: float = 0.1, nodes: int = 1, tp_size: int | None = None,
              fsdp_size: int | None = None, dtype="bfloat16", master_weights: str = "fp32",
              optimizer: str = "adamw", gradient_checkpointing: bool | str | None = None,
              cache_length: int | None = None, checkpoint_every: int = 2) -> MeshPlan:
    """Choose the ``DistributedConfig(tp_size, fsdp_size)`` (and the activation checkpointing) for
    ``config`` on ``instance``, the way Neuron's training best practices lay a job out.

    Training climbs a ladder and stops at the first step that fits the HBM per logical core minus
    ``headroom``: for each checkpointing mode, least recompute first (none, selective, full; only
    the one given by ``gradient_checkpointing`` if it is not ``None``), FSDP alone over every rank
    (tp=1), then tensor parallelism filling one chip (tp = its logical cores, 4 on trn2 and trn3:
    "Keep TP4 within a chip") with FSDP between the chips; only if none of those fits, TP across
    chips. Inference first tries independent replicas without FSDP (tp=1, 2, 4 within a chip),
    then the same FSDP ladder. Meshes the model or the launch cannot take are rejected with the
    message of :func:`trnlab.mesh.validate_parallel_sizes`. ``tp_size``/``fsdp_size`` plan
    only that mesh (its heads checked first). ``batch`` is the micro-batch of each FSDP rank.

    Raises :class:`PlanError`: unknown or trn1 instance; bad sizes (``tp_size=0``, a tp the heads
    do not divide by); a given mesh the model or launch cannot take; no mesh fits (the message says
    what would: more nodes, a larger instance, a smaller batch or sequence, checkpointing, each
    computed). Returns a :class:`MeshPlan`. Used by notebook 06 and ``python -m trnlab plan``.
    """
    inst = get_instance(instance)
    config, label = config_and_label(config)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise PlanError(f"nodes={nodes!r}: a whole number >= 1")
    if not 0 <= headroom < 1:
        raise PlanError(f"headroom={headroom!r}: a fraction in [0, 1)")
    workload_key = _workload(workload)
    modes = _modes(gradient_checkpointing, workload_key == "train")
    mem_kwargs = dict(batch=batch, seq=seq, dtype=dtype, master_weights=master_weights, optimizer=optimizer,
                      cache_length=cache_length, checkpoint_every=checkpoint_every)
    plan_memory(config, workload=workload_key, **{**mem_kwargs, "gradient_checkpointing": modes[0]})  # checks inputs
    given = (_given_mesh(config, inst, nodes, tp_size, fsdp_size)
             if tp_size is not None or fsdp_size is not None else None)
    settings = {**mem_kwargs, "dtype": _dtype_name(dtype), "gradient_checkpointing":
                "auto" if len(modes) > 1 else modes[0]}
    choice = _search(config, inst, nodes, workload_key, headroom, mem_kwargs, modes, given)
    cands = _shown_candidates(config, inst, nodes, workload_key, label, given)
    cands = [_planned(config, c, workload_key, mem_kwargs, choice.mode if choice else modes[-1], inst.hbm_per_core,
                      headroom) for c in cands]
    if choice is None:
        raise _no_fit_error(config, inst, nodes, workload_key, headroom, mem_kwargs, modes, given, cands, label)
    best = next((c for c in cands if (c.tp_size, c.fsdp_size, c.replicas) ==
                 (choice.candidate.tp_size, choice.candidate.fsdp_size, choice.candidate.replicas)), None)
    if best is None:
        cands.append(choice.candidate)
        best = choice.candidate
    choice.candidate = best
    budget = int(inst.hbm_per_core * (1 - headroom))
    reason = _reason(choice, config, inst, nodes, budget, workload_key, label, auto=len(modes) > 1)
    return MeshPlan(model=label, instance=inst, nodes=nodes, workload=workload_key, headroom=headroom,
                    candidates=cands, recommended=best, reason=reason, settings=settings,
                    checkpointing=choice.mode, tried=choice.tried)


def _modes(gradient_checkpointing, train: bool) -> tuple:
    """The checkpointing modes to try, least recompute first: all for training with None/"auto", else the one given."""
    if not train:
        return ("none",)
    if gradient_checkpointing is None or str(gradient_checkpointing).lower() == "auto":
        return CHECKPOINTING
    return (checkpointing_mode(gradient_checkpointing),)


def _shown_candidates(config, inst: Instance, nodes: int, workload: str, label: str, given) -> list[MeshCandidate]:
    """The meshes a :class:`MeshPlan` lists (not yet planned): the given one, or every mesh (serving
    replicas first); no valid mesh at all is a :class:`PlanError` with every reason."""
    if given is not None:
        return [MeshCandidate(*given)]
    cands = _mesh_candidates(config, inst, nodes)
    if not any(c.valid for c in cands):
        raise PlanError(f"no mesh of {inst.logical_cores * nodes} ranks on {_where(inst, nodes)} suits {label}: "
                        + " | ".join(sorted({c.rejected for c in cands})))
    if workload != "train":
        chip_tps = [c.tp_size for c in cands if c.valid and c.tp_size <= inst.cores_per_chip]
        world = inst.logical_cores * nodes
        cands = [MeshCandidate(t, 1, replicas=world // t) for t in chip_tps] + cands
    return cands


def _no_fit_error(config, inst: Instance, nodes: int, workload: str, headroom: float, mem_kwargs: dict,
                  modes: tuple, given, cands: list, label: str) -> PlanError:
    """The error for a workload no mesh fits: the leanest mesh's bytes, and what would fit (computed)."""
    train, where = workload == "train", _where(inst, nodes)
    budget = int(inst.hbm_per_core * (1 - headroom))
    leanest = min((c for c in cands if c.plan is not None), key=lambda c: c.plan.total)
    what = f"{'training' if train else 'inference'} (micro-batch {mem_kwargs['batch']} x {mem_kwargs['seq']} per rank)"
    alternatives = _what_would_fit(config, inst, nodes, workload, headroom, mem_kwargs, modes)
    if given is not None:
        other = _search(config, inst, nodes, workload, headroom, mem_kwargs, modes)
        if other is not None:
            alternatives.insert(0, f"--tp {other.candidate.tp_size} --fsdp {other.candidate.fsdp_size} on "
                                   f"{where}: {_say(other, workload)}")
    every = mem_kwargs["checkpoint_every"]
    ckpt = f" even with {_checkpointing_label(modes[-1], every)}" if train and modes[-1] != "none" else ""
    head = (f"{label} {what} does not fit tp={leanest.tp_size} x fsdp={leanest.fsdp_size} on {where}{ckpt}: "
            f"it needs " if given is not None else
            f"{label} {what} fits no mesh on {where}{ckpt}: the leanest, tp={leanest.tp_size} x "
            f"fsdp={leanest.fsdp_size}, needs ")
    return PlanError(
        head + f"{leanest.plan.total / GiB:.1f} GiB per core, {budget / GiB:.1f} GiB usable "
        f"({inst.hbm_per_core / GiB:.0f} GiB minus {headroom:.0%} headroom). What would fit: "
        + "; ".join(alternatives) + ".")


# ---------------------------------------------------------------------------------------------
# Text and plot
# ---------------------------------------------------------------------------------------------

def format_plan(plan, *, shards: bool = False) -> str:
    """A plan as text: a :class:`MeshPlan` (summary, every mesh, recommended mesh's components)
    or a :class:`MemoryPlan` (summary and components). ``shards=True`` adds one line per tensor.

    Printed by ``python -m trnlab plan`` and ``python -m trnlab launch --dry-run``; notebook 06.
    """
    if isinstance(plan, MeshPlan):
        parts = [plan.describe(), "", plan.table()]
        if plan.recommended is not None:
            parts += ["", f"recommended mesh, per rank: {plan.recommended.plan.describe()}",
                      plan.recommended.plan.table()]
            memory = plan.recommended.plan
        else:
            memory = None
    elif isinstance(plan, MemoryPlan):
        parts = [plan.describe(), plan.table()]
        memory = plan
    else:
        raise TypeError(f"format_plan takes a MeshPlan or a MemoryPlan, not {type(plan).__name__}")
    if memory is not None:
        parts += [""] + [f"note: {n}" for n in memory.notes]
        if shards:
            parts += ["", f"{'tensor':<48} {'shape':>16} {'tp style':>24} {'on this rank':>16}"]
            parts += [f"{s.name:<48} {str(s.shape):>16} {str(s.tp_style or '-'):>24} {str(s.local_shape):>16}"
                      for s in memory.shards]
    return "\n".join(parts)


def plot_memory_plan(plans, budget: int | None = None, ax=None, title: str | None = None):
    """Stacked bars of bytes per rank by component, one bar per mesh; returns the figure.

    ``plans``: a :class:`MeshPlan` (every valid mesh; the HBM per core and the usable budget
    are drawn as lines), a dict ``{label: MemoryPlan}``, or a list of MemoryPlans. ``budget``:
    bytes per core to draw when ``plans`` is not a MeshPlan. Notebook 06.
    """
    import matplotlib.pyplot as plt

    hbm = None
    if isinstance(plans, MeshPlan):
        mesh_plan = plans
        hbm, budget = mesh_plan.instance.hbm_per_core, budget or mesh_plan.budget
        title = title or f"{mesh_plan.model}, {mesh_plan.workload} on {mesh_plan.instance.name}"
        plans = mesh_plan.plans
    elif isinstance(plans, MemoryPlan):
        plans = {plans.mesh: plans}
    elif not isinstance(plans, dict):
        plans = {p.mesh: p for p in plans}
    if not plans:
        raise PlanError("nothing to plot: no mesh passed the checks")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(plans) + 1.5) + 3.2, 4.2))
    else:
        fig = ax.figure
    labels = list(plans)
    bottoms = [0.0] * len(labels)
    colors = plt.get_cmap("tab10").colors
    for n, key in enumerate(COMPONENTS):
        values = [plans[label].components[key] / GiB for label in labels]
        if not any(values):
            continue
        ax.bar(labels, values, bottom=bottoms, color=colors[n], label=COMPONENT_LABELS[key])
        bottoms = [b + v for b, v in zip(bottoms, values)]
    if hbm:
        ax.axhline(hbm / GiB, color="black", lw=1, label=f"HBM per core ({hbm / GiB:.0f} GiB)")
    if budget:
        ax.axhline(budget / GiB, color="red", ls="--", lw=1, label=f"usable ({budget / GiB:.1f} GiB)")
    top = max(bottoms + [(hbm or 0) / GiB, (budget or 0) / GiB])
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("GiB per rank (NeuronCore)")
    ax.set_xlabel("mesh")
    ax.tick_params(axis="x", labelsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Command line: trnlab.cli.plan
# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Deprecated: ``python -m trnlab plan ...`` is :func:`trnlab.cli.plan.main` now (kept for one release)."""
    warn_deprecated("planning.main", "`python -m trnlab plan ...` or `trnlab.cli.plan.main(argv)`")
    # A deprecated entry point only: the command line imports the planner, never the reverse.
    from trnlab.cli.plan import main as plan_main

    return plan_main(argv)
