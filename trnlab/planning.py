"""Plan a real run: bytes per NeuronCore, and the right (tp, fsdp) mesh for a Trainium instance.

Notebook 05 trains the tiny course model on a 2 x 2 mesh of CPU processes. Before running a
real Qwen3 model on a trn2 or trn3 instance, the same questions have numbers for answers:
how many bytes does each rank hold, and which ``DistributedConfig(tp_size, fsdp_size)`` fits?

* :func:`plan_memory` estimates the bytes on **one rank** for a model config and a mesh:
  parameters split exactly the way Transformers shards them (the model's TP plan, then FSDP2
  on dim 0), gradients and AdamW state for training, FSDP all-gather buffers, activations
  (an estimate, formula in its docstring) and the static KV cache for generation.
* :data:`INSTANCES` lists HBM per logical NeuronCore and cores per instance (Neuron docs).
* :func:`plan_mesh` tries every mesh with ``tp * fsdp`` = cores x nodes, rejects those the
  model cannot take (:func:`trnlab.launcher.validate_parallel_sizes`) or that do not fit, and
  recommends one, saying why. When nothing fits it says what would (more nodes, a larger
  instance, a smaller batch, gradient checkpointing), computed, not guessed.
* ``python -m trnlab plan --model Qwen/Qwen3-8B --instance trn2.48xlarge [--train]`` prints
  the same; it works offline for the Qwen3 configs shipped in ``trnlab/assets/configs``.

The parameter and training-state figures are exact for the sharding Transformers does
(``tests/test_planning.py`` compares them with what 4 real ranks hold); activations are an
estimate. Used by notebook 05 ("From the tiny model to Qwen3-8B on a trn2").
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

try:  # trnlab.launch was renamed trnlab.launcher; accept either
    from trnlab.launcher import LaunchConfigError, validate_parallel_sizes
except ImportError:
    from trnlab.launch import LaunchConfigError, validate_parallel_sizes

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
    "resolve_config",
    "get_instance",
    "parameter_shards",
    "plan_memory",
    "plan_mesh",
    "format_plan",
    "plot_memory_plan",
    "main",
]

GiB = 1024 ** 3


class PlanError(ValueError):
    """A plan that cannot be made: unknown instance or model, a mesh the model cannot take,
    a config missing fields, or a workload no mesh fits. The message says what to change."""


# ---------------------------------------------------------------------------------------------
# Instances
# ---------------------------------------------------------------------------------------------

#: Where the instance figures come from (Neuron docs).
TRN2_ARCH_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn2-arch.html"
TRAINIUM2_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium2.html"
TRN3_ARCH_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trn3-arch.html"
TRAINIUM3_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium3.html"
LNC_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/logical-neuroncore-config.html"
TRAINING_BEST_PRACTICES_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training/best-practices.html"
TORCHNEURON_QUICKSTART_URL = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/get-started/"
                              "quickstart-torch-neuron.html")


@dataclass(frozen=True)
class Instance:
    """One Trainium machine (or UltraServer) as the planner sees it.

    ``logical_cores`` = chips x physical NeuronCores per chip / LNC: one process (rank) per
    logical core. ``hbm_per_core`` is the chip's HBM divided between its logical cores, before
    the runtime's own overhead (the docs: "approximately 24 GiB of HBM per rank" on trn2).
    ``hosts`` is the number of machines (torchrun nodes) it is made of.
    """

    name: str
    family: str                    # "trn2" or "trn3"
    chips: int
    hbm_per_chip_gib: int
    physical_cores_per_chip: int = 8
    lnc: int = 2                   # NEURON_LOGICAL_NC_CONFIG default on Trn2 and later
    hosts: int = 1
    source: str = ""

    @property
    def cores_per_chip(self) -> int:
        return self.physical_cores_per_chip // self.lnc

    @property
    def logical_cores(self) -> int:
        return self.chips * self.cores_per_chip

    @property
    def cores_per_host(self) -> int:
        return self.logical_cores // self.hosts

    @property
    def hbm_per_core(self) -> int:
        """Bytes of HBM per logical NeuronCore."""
        return self.hbm_per_chip_gib * GiB // self.cores_per_chip

    @property
    def hbm_total(self) -> int:
        return self.hbm_per_chip_gib * GiB * self.chips

    def to_dict(self) -> dict:
        return {"name": self.name, "family": self.family, "chips": self.chips,
                "hbm_per_chip_gib": self.hbm_per_chip_gib, "lnc": self.lnc, "hosts": self.hosts,
                "logical_cores": self.logical_cores, "cores_per_host": self.cores_per_host,
                "hbm_per_core_bytes": self.hbm_per_core, "hbm_total_bytes": self.hbm_total,
                "source": self.source}


#: Instances the native ``neuron`` device (TorchNeuron) supports, with their figures from the
#: Neuron docs. Trainium2: 8 physical NeuronCore-v3 and 96 GiB HBM per chip (TRAINIUM2_URL);
#: trn2.48xlarge / trn2u.48xlarge: 16 chips, 1,536 GiB (TRN2_ARCH_URL); a Trn2 UltraServer is
#: four trn2u.48xlarge (TRN2_ARCH_URL); trn2.3xlarge: one Trainium2 chip (named as a TorchNeuron
#: instance in TORCHNEURON_QUICKSTART_URL; 4 logical cores, see the course's trainium-facts).
#: Trainium3: 8 NeuronCore-v4 and 144 GiB per chip (TRAINIUM3_URL); the docs give Trn3 only as
#: UltraServers: Gen1 = 4 servers x 16 chips, Gen2 = 36 servers x 4 chips (TRN3_ARCH_URL).
#: Default LNC=2 on Trn2 and later (LNC_URL): 4 logical cores per chip. Single trn3 instance
#: sizes are left out: the docs do not give them.
INSTANCES: dict[str, Instance] = {inst.name: inst for inst in (
    Instance("trn2.3xlarge", "trn2", chips=1, hbm_per_chip_gib=96, source=TORCHNEURON_QUICKSTART_URL),
    Instance("trn2.48xlarge", "trn2", chips=16, hbm_per_chip_gib=96, source=TRN2_ARCH_URL),
    Instance("trn2u.48xlarge", "trn2", chips=16, hbm_per_chip_gib=96, source=TRN2_ARCH_URL),
    Instance("trn2-ultraserver", "trn2", chips=64, hbm_per_chip_gib=96, hosts=4, source=TRN2_ARCH_URL),
    Instance("trn3-gen1-ultraserver", "trn3", chips=64, hbm_per_chip_gib=144, hosts=4, source=TRN3_ARCH_URL),
    Instance("trn3-gen2-ultraserver", "trn3", chips=144, hbm_per_chip_gib=144, hosts=36, source=TRN3_ARCH_URL),
)}

#: Known Trainium instances the native ``neuron`` device does not run on, and why.
UNSUPPORTED_INSTANCES: dict[str, str] = {
    name: ("trn1 (Trainium, 2 NeuronCore-v2 and 32 GiB per chip) has no native `neuron` device: "
           "TorchNeuron supports trn2 and trn3 only, and trn1 keeps the older XLA-based torch-neuronx "
           "(torch-xla, neuron_parallel_compile). This course and planner target trn2/trn3: use e.g. "
           "trn2.48xlarge.")
    for name in ("trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge")
}


def get_instance(name: str | Instance) -> Instance:
    """The :class:`Instance` called ``name`` (e.g. ``"trn2.48xlarge"``), from :data:`INSTANCES`.

    Raises :class:`PlanError` for trn1 (not supported by the native device, says why) and for
    unknown names (lists the known ones). Used by :func:`plan_mesh` and ``python -m trnlab plan``.
    """
    if isinstance(name, Instance):
        return name
    key = str(name).strip().lower()
    if key in INSTANCES:
        return INSTANCES[key]
    if key in UNSUPPORTED_INSTANCES or key.startswith(("trn1.", "trn1n.")):
        raise PlanError(f"{name}: {UNSUPPORTED_INSTANCES.get(key, UNSUPPORTED_INSTANCES['trn1.32xlarge'])}")
    raise PlanError(f"unknown instance {name!r}: use one of {', '.join(INSTANCES)} "
                    f"(figures from the Neuron docs; trn1 is not supported by the native neuron device).")


# ---------------------------------------------------------------------------------------------
# Model configs
# ---------------------------------------------------------------------------------------------

#: The Qwen3 configs shipped with the course (published config.json values), by hub name.
CONFIG_DIR = Path(__file__).resolve().parent / "assets" / "configs"
SHIPPED_MODELS: dict[str, Path] = {
    f"Qwen/{size}": CONFIG_DIR / f"{size}.json"
    for size in ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B")
}

#: Fields the planner reads from a config; a config without one of them cannot be planned.
REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "vocab_size")

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "").lower()
    name = _DTYPE_NAMES.get(name, name)
    if name not in DTYPE_BYTES:
        raise PlanError(f"dtype {dtype!r}: use one of bfloat16, float16, float32")
    return name


def _missing_fields(values: dict) -> list[str]:
    return [f for f in REQUIRED_FIELDS if values.get(f) is None]


def _config_from_dict(values: dict, where: str):
    from transformers import AutoConfig

    if "text_config" in values and isinstance(values["text_config"], dict):
        values = {**values["text_config"], "model_type": values["text_config"].get("model_type",
                                                                                     values.get("model_type"))}
    missing = _missing_fields(values) + ([] if values.get("model_type") else ["model_type"])
    if missing:
        raise PlanError(f"{where} lacks {', '.join(missing)}: the planner needs "
                        f"{', '.join(REQUIRED_FIELDS + ('model_type',))} (head_dim defaults to "
                        f"hidden_size / num_attention_heads).")
    kwargs = {k: v for k, v in values.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(values["model_type"], **kwargs)
    except (ValueError, KeyError) as exc:
        raise PlanError(f"{where}: model_type {values['model_type']!r} is unknown to this Transformers "
                        f"({exc})") from exc


def _shipped_path(name: str) -> Path | None:
    wanted = name.strip().lower()
    for hub_name, path in SHIPPED_MODELS.items():
        if wanted in (hub_name.lower(), hub_name.split("/")[1].lower()):
            return path
    return None


def resolve_config(model=None):
    """A Transformers config for ``model``, offline where possible. Returns ``(config, label)``.

    ``model`` may be a config object, a dict of config values, a shipped name
    (``"Qwen/Qwen3-8B"`` or ``"Qwen3-8B"``: :data:`SHIPPED_MODELS`, no network), a local folder
    with ``config.json``, a path to a config JSON file, a hub name (cache or hub), or ``None``
    (``$TRNLAB_MODEL`` or the bundled tiny model, :func:`trnlab.models.model_name`).
    A dict or JSON file missing a needed field raises :class:`PlanError` naming it.
    Used by :func:`plan_memory`, :func:`plan_mesh` and ``python -m trnlab plan``.
    """
    if model is not None and hasattr(model, "to_dict") and hasattr(model, "model_type"):
        text = model.get_text_config() if hasattr(model, "get_text_config") else model
        missing = [f for f in REQUIRED_FIELDS if getattr(text, f, None) is None]
        if missing:
            raise PlanError(f"config {type(model).__name__} lacks {', '.join(missing)}")
        name = getattr(model, "name_or_path", "") or model.model_type
        return model, str(name)
    if isinstance(model, dict):
        return _config_from_dict(dict(model), "the config dict"), "config dict"

    from trnlab.models import model_name

    name = model_name(None if model is None else str(model))
    shipped = _shipped_path(name)
    path = Path(name).expanduser()
    if shipped is not None:
        hub = next(k for k, v in SHIPPED_MODELS.items() if v == shipped)
        config = _config_from_dict(json.loads(shipped.read_text()), str(shipped))
        config.name_or_path = hub
        return config, hub
    if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
        file = path if path.is_file() else path / "config.json"
        try:
            values = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise PlanError(f"{file} is not JSON: {exc}") from exc
        config = _config_from_dict(values, str(file))
        config.name_or_path = str(path)
        return config, str(path)
    if path.is_dir():
        raise PlanError(f"{path} has no config.json")
    from trnlab.models import load_config  # offline-aware: fails fast without the hub
    try:
        config = load_config(name)
    except (OSError, ValueError) as exc:
        raise PlanError(f"no config for {name!r}: it is not one of the shipped configs "
                        f"({', '.join(SHIPPED_MODELS)}), not a local folder or config.json, and "
                        f"the hub did not give it ({exc})") from exc
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    missing = [f for f in REQUIRED_FIELDS if getattr(text, f, None) is None]
    if missing:
        raise PlanError(f"config of {name!r} lacks {', '.join(missing)}")
    return config, name


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
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
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
    Notebook 05 tabulates it; :func:`plan_memory` sums it.
    """
    config, _ = resolve_config(config)
    spec = _spec(config)
    if tp_size > 1 and not spec.dims["has_tp_plan"]:
        raise PlanError(f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan): use tp_size=1")
    return _shards(spec, tp_size, fsdp_size)


# ---------------------------------------------------------------------------------------------
# Memory of one rank
# ---------------------------------------------------------------------------------------------

COMPONENTS = ("parameters", "gradients", "optimizer", "fsdp_buffers", "activations", "kv_cache")
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
INFERENCE_ACTIVATION_FORMULA = (
    "generate's prefill under no_grad frees each layer's temporaries: about one layer's worth, "
    "T*b*(2h + max(2q + 2kv, 3i)/tp), plus the last position's logits batch*V*(b + 4) "
    "(generate keeps an fp32 copy); attention assumed fused (SDPA/flash: no T x T score matrix)")
ACTIVATION_FORMULA = "training: " + TRAIN_ACTIVATION_FORMULA + ". Inference: " + INFERENCE_ACTIVATION_FORMULA + "."


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

    def summary(self) -> str:
        """One paragraph: model, mesh, workload, parameters held, total per rank."""
        what = (f"training (micro-batch {self.batch} x {self.seq} tokens per rank, {self.master_weights} "
                f"master weights, {self.optimizer_name}, compute {self.dtype}"
                f"{', gradient checkpointing' if self.gradient_checkpointing else ''})"
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
               "gradient_checkpointing": self.gradient_checkpointing, "cache_length": self.cache_length,
               "parameter_count": self.parameter_count, "local_parameter_count": self.local_parameter_count,
               "components": dict(self.components), "training_state_bytes": self.training_state,
               "total_bytes": self.total, "total_gib": round(self.total / GiB, 4),
               "activation_detail": dict(self.activation_detail), "notes": list(self.notes)}
        if shards:
            out["shards"] = [s.to_dict() for s in self.shards]
        return out

    def __str__(self) -> str:
        return self.summary() + "\n" + self.table()


_WORKLOADS = {"inference": "inference", "generate": "inference", "train": "train", "training": "train"}
_MASTER = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}
_OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0}   # fp32/bf16 state tensors per parameter


def plan_memory(config=None, tp_size: int = 1, fsdp_size: int = 1, *, workload: str = "inference",
                batch: int = 1, seq: int = 2048, dtype="bfloat16", master_weights: str = "fp32",
                optimizer: str = "adamw", gradient_checkpointing: bool = False,
                cache_length: int | None = None) -> MemoryPlan:
    """Estimate the bytes one rank holds for ``config`` on a ``tp_size x fsdp_size`` mesh.

    ``config``: anything :func:`resolve_config` takes (config, dict, shipped name such as
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
      input), times the layers; with ``gradient_checkpointing`` each layer keeps only its input
      ``T*b*h`` and one layer is recomputed at a time; plus the loss head
      ``T*((4 + 2b)*h + V*(b + 8))`` (logits, their fp32 copy, fp32 log-probs: the full vocabulary
      on every TP rank). TP splits the head- and MLP-wide tensors, not the h-wide residual
      stream; FSDP does not split activations: each FSDP rank holds those of its own
      micro-batch. Inference (generate's prefill, no_grad): one layer's temporaries
      ``T*b*(2h + max(2q + 2kv, 3i)/tp)`` plus the last position's logits ``batch*V*(b + 4)``.
      The formulas are :data:`TRAIN_ACTIVATION_FORMULA` and :data:`INFERENCE_ACTIVATION_FORMULA`.
    * kv_cache (inference): the static cache ``batch * cache_length * layers * kv_heads/tp *
      head_dim * 2 (keys, values) * b``. ``cache_length`` defaults to ``seq``; ``generate(...,
      cache_implementation="static")`` allocates ``max_length - 1`` = prompt + new tokens - 1.

    Returns a :class:`MemoryPlan` (``.components``, ``.total``, ``.table()``, ``.summary()``,
    ``.to_dict()``). Used by :func:`plan_mesh`, notebook 05 and ``python -m trnlab plan``.
    """
    config, label = resolve_config(config)
    workload_key = _WORKLOADS.get(str(workload).lower())
    if workload_key is None:
        raise PlanError(f"workload={workload!r}: use 'inference' or 'train'")
    for name, value in (("tp_size", tp_size), ("fsdp_size", fsdp_size), ("batch", batch), ("seq", seq)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanError(f"{name}={value!r}: a whole number >= 1")
    master = _MASTER.get(str(master_weights).lower())
    if master is None:
        raise PlanError(f"master_weights={master_weights!r}: use 'fp32' or 'bf16'")
    opt = str(optimizer).lower()
    if opt not in _OPTIMIZERS:
        raise PlanError(f"optimizer={optimizer!r}: the planner knows {', '.join(_OPTIMIZERS)}")
    dtype_name = _dtype_name(dtype)
    b = DTYPE_BYTES[dtype_name]
    spec = _spec(config)
    if tp_size > 1 and not spec.dims["has_tp_plan"]:
        raise PlanError(f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan): use tp_size=1")
    d = spec.dims
    cache_length = seq if cache_length is None else cache_length
    if not isinstance(cache_length, int) or cache_length < 1:
        raise PlanError(f"cache_length={cache_length!r}: a whole number >= 1")

    shards = _shards(spec, tp_size, fsdp_size)
    local = sum(s.local_numel for s in shards)
    train = workload_key == "train"
    param_bytes = DTYPE_BYTES[master] if train else b
    comp = dict.fromkeys(COMPONENTS, 0)
    comp["parameters"] = local * param_bytes
    notes = []
    if train:
        comp["gradients"] = local * param_bytes
        comp["optimizer"] = _OPTIMIZERS[opt] * local * param_bytes + (4 * len(shards) if opt != "sgd" else 0)

    # FSDP2 gathered weights (estimate).
    if fsdp_size > 1:
        by_name = {s.name: s for s in shards}
        layer_numel: dict[int, int] = {}
        for name, _shape, _style, layer in spec.params:
            if layer is not None:
                layer_numel[layer] = layer_numel.get(layer, 0) + by_name[name].tp_numel
        biggest = max(layer_numel.values(), default=0)
        kept = sum(by_name[n].tp_numel for n in spec.keep_full)
        comp["fsdp_buffers"] = (2 * biggest + kept) * b + (biggest * param_bytes if train else 0)
        notes.append("fsdp_buffers: 2 gathered layers (current + prefetched) + the keep_full_weight modules "
                     "(final norm, lm_head/tied embedding) in the compute dtype"
                     + ("; + one layer of unsharded gradients" if train else "") + " (estimate).")

    h, i, q, kv, L, V = d["hidden"], d["intermediate"], d["q_dim"], d["kv_dim"], d["layers"], d["vocab"]
    tokens = batch * seq
    if train:
        per_layer = _train_layer_bytes(d, tokens, b, tp_size)
        layers = (L * tokens * b * h + per_layer) if gradient_checkpointing else L * per_layer
        head = tokens * ((4 + 2 * b) * h + V * (b + 8))
        comp["activations"] = int(layers + head)
        detail = {"per_layer": int(per_layer), "layers": int(layers), "head": int(head)}
        notes.append("activations (estimate): " + TRAIN_ACTIVATION_FORMULA + ".")
    else:
        per_layer = tokens * b * (2 * h + max(2 * q + 2 * kv, 3 * i) / tp_size)
        head = batch * V * (b + 4)
        comp["activations"] = int(per_layer + head)
        detail = {"per_layer": int(per_layer), "layers": int(per_layer), "head": int(head)}
        kv_heads_local = -(-d["kv_heads"] // tp_size)
        comp["kv_cache"] = batch * cache_length * L * kv_heads_local * d["head_dim"] * 2 * b
        notes.append("activations (estimate): " + INFERENCE_ACTIVATION_FORMULA + ".")
        notes.append(f"kv_cache: batch {batch} x {cache_length} positions x {L} layers x {kv_heads_local} kv "
                     f"heads per TP rank x head_dim {d['head_dim']} x 2 (keys, values) x {b} bytes.")
    if fsdp_size > 1:
        notes.append(f"FSDP is data parallelism: each of the {fsdp_size} FSDP ranks holds the activations"
                     + (" and KV cache" if not train else "") + f" of its own micro-batch ({batch} x {seq}).")
    if d["max_position_embeddings"] and max(seq, cache_length if not train else 0) > d["max_position_embeddings"]:
        notes.append(f"seq/cache_length exceed max_position_embeddings={d['max_position_embeddings']}.")
    return MemoryPlan(
        model=label, tp_size=tp_size, fsdp_size=fsdp_size, workload=workload_key, batch=batch, seq=seq,
        dtype=dtype_name, master_weights=master, optimizer_name=opt, gradient_checkpointing=bool(gradient_checkpointing),
        cache_length=cache_length if not train else 0, components=comp,
        parameter_count=sum(_count(p[1]) for p in spec.params), local_parameter_count=local,
        shards=shards, notes=notes, activation_detail=detail)


# ---------------------------------------------------------------------------------------------
# Choosing the mesh
# ---------------------------------------------------------------------------------------------

@dataclass
class MeshCandidate:
    """One (tp, fsdp) mesh on the instance: rejected (why), or its plan and whether it fits."""

    tp_size: int
    fsdp_size: int
    plan: MemoryPlan | None = None
    fits: bool = False
    rejected: str = ""

    @property
    def valid(self) -> bool:
        return not self.rejected

    def to_dict(self) -> dict:
        out = {"tp_size": self.tp_size, "fsdp_size": self.fsdp_size, "valid": self.valid, "fits": self.fits}
        if self.rejected:
            out["rejected"] = self.rejected
        if self.plan is not None:
            out["components"] = dict(self.plan.components)
            out["total_bytes"] = self.plan.total
            out["total_gib"] = round(self.plan.total / GiB, 4)
        return out


@dataclass
class MeshPlan:
    """What :func:`plan_mesh` found: every mesh tried, the recommended one and why."""

    model: str
    instance: Instance
    nodes: int
    workload: str
    headroom: float
    candidates: list
    recommended: MeshCandidate | None
    reason: str
    settings: dict = field(default_factory=dict)

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
        lines = [head + "   (GiB per rank)"]
        for c in self.candidates:
            if c.plan is None:
                lines.append(f"{c.tp_size:>3} {c.fsdp_size:>5}  rejected: {c.rejected}")
                continue
            values = " ".join(f"{c.plan.components[k] / GiB:>9.2f}" for k in COMPONENTS)
            mark = "fits" if c.fits else "too big"
            if c is self.recommended:
                mark += "  <- recommended"
            lines.append(f"{c.tp_size:>3} {c.fsdp_size:>5}  {values} {c.plan.total / GiB:>9.2f}  {mark}")
        return "\n".join(lines)

    def summary(self) -> str:
        """Instance, budget per core, and the recommendation with its reason."""
        inst = self.instance
        where = f"{self.nodes} x {inst.name}" if self.nodes > 1 else inst.name
        return (f"{self.model}, {self.workload} on {where}: {self.world_size} logical NeuronCores, "
                f"{inst.hbm_per_core / GiB:.0f} GiB HBM each ({self.budget / GiB:.1f} GiB usable with "
                f"{self.headroom:.0%} headroom).\n{self.reason}")

    def to_dict(self) -> dict:
        """JSON-ready: instance, nodes, budget, every candidate, the recommendation and its reason."""
        return {"model": self.model, "instance": self.instance.to_dict(), "nodes": self.nodes,
                "world_size": self.world_size, "workload": self.workload, "headroom": self.headroom,
                "budget_bytes": self.budget, "settings": dict(self.settings),
                "recommended": None if self.recommended is None else
                {"tp_size": self.recommended.tp_size, "fsdp_size": self.recommended.fsdp_size,
                 "plan": self.recommended.plan.to_dict()},
                "reason": self.reason, "candidates": [c.to_dict() for c in self.candidates]}

    def __str__(self) -> str:
        return self.summary() + "\n" + self.table()


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _candidates(config, inst: Instance, nodes: int, workload: str, headroom: float, mem_kwargs: dict,
                tp_size: int | None = None, fsdp_size: int | None = None) -> list[MeshCandidate]:
    world = inst.logical_cores * nodes
    budget = inst.hbm_per_core
    if tp_size is not None or fsdp_size is not None:
        tp = tp_size or (world // fsdp_size if fsdp_size and world % fsdp_size == 0 else 1)
        fs = fsdp_size or max(world // tp, 1)
        meshes = [(tp, fs)]
    else:
        meshes = [(t, world // t) for t in _divisors(world)]
    out = []
    for tp, fs in meshes:
        try:
            validate_parallel_sizes(world, tp, fs, model_config=config)
        except LaunchConfigError as exc:
            if tp_size is not None or fsdp_size is not None:
                raise PlanError(str(exc)) from exc
            out.append(MeshCandidate(tp, fs, rejected=str(exc)))
            continue
        if inst.cores_per_host % tp:
            msg = (f"tp_size={tp} would split a TP group across hosts ({inst.cores_per_host} cores per "
                   f"host): TP all-reduces every layer and needs NeuronLink, not EFA")
            if tp_size is not None:
                raise PlanError(msg)
            out.append(MeshCandidate(tp, fs, rejected=msg))
            continue
        plan = plan_memory(config, tp, fs, workload=workload, **mem_kwargs)
        out.append(MeshCandidate(tp, fs, plan=plan, fits=plan.fits(budget, headroom)))
    return out


def _any_fits(config, inst, nodes, workload, headroom, mem_kwargs) -> MeshCandidate | None:
    try:
        cands = _candidates(config, inst, nodes, workload, headroom, mem_kwargs)
    except PlanError:
        return None
    fitting = [c for c in cands if c.fits]
    return min(fitting, key=lambda c: c.tp_size) if fitting else None


#: Node counts tried when looking for "more nodes" (beyond 8, the usual cluster sizes).
_NODE_COUNTS = (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)


def _head_ok_tps(config, inst: Instance) -> list[int]:
    out = []
    for tp in _divisors(inst.cores_per_host):
        try:
            validate_parallel_sizes(tp, tp, 1, model_config=config)
        except LaunchConfigError:
            continue
        out.append(tp)
    return out


def _what_would_fit(config, inst: Instance, nodes: int, workload: str, headroom: float, mem_kwargs: dict) -> list[str]:
    """Computed alternatives for a workload that fits no mesh: each one was planned and fits."""
    out = []
    where = f"{nodes} x {inst.name}" if nodes > 1 else inst.name
    train = workload == "train"

    def fit(instance, n, **changes):
        return _any_fits(config, instance, n, workload, headroom, {**mem_kwargs, **changes})

    def say(hit):
        return f"tp={hit.tp_size} x fsdp={hit.fsdp_size}, {hit.plan.total / GiB:.1f} GiB per core"

    def scales_help(instance, **changes):
        # More ranks shrink the FSDP-sharded state, never a rank's activations or gathered layers:
        # if even an unbounded FSDP size does not fit, no node count will.
        return any(plan_memory(config, tp, 1 << 20, workload=workload, **{**mem_kwargs, **changes})
                   .fits(instance.hbm_per_core, headroom) for tp in _head_ok_tps(config, instance))

    def more_nodes(instance, start, **changes):
        if not scales_help(instance, **changes):
            return None
        for n in (c for c in _NODE_COUNTS if c > start):
            hit = fit(instance, n, **changes)
            if hit:
                return n, hit
        return None

    found = more_nodes(inst, nodes)
    if found:
        n, hit = found
        out.append(f"{n} x {inst.name} (--nodes {n}): {say(hit)}")
    bigger = sorted((o for o in INSTANCES.values() if o.hbm_total > inst.hbm_total * nodes),
                    key=lambda o: o.hbm_total)
    for other in bigger:
        hit = fit(other, 1)
        if hit:
            out.append(f"one {other.name}: {say(hit)}")
            break
    for smaller in range(mem_kwargs["batch"] - 1, 0, -1):
        hit = fit(inst, nodes, batch=smaller)
        if hit:
            out.append(f"--batch {smaller} on {where}: {say(hit)}")
            break
    if train and not mem_kwargs.get("gradient_checkpointing"):
        for batch in range(mem_kwargs["batch"], 0, -1):
            hit = fit(inst, nodes, batch=batch, gradient_checkpointing=True)
            if hit:
                extra = "" if batch == mem_kwargs["batch"] else f" --batch {batch}"
                out.append(f"--gradient-checkpointing{extra} on {where}: {say(hit)}")
                break
    if out:
        return out
    # Nothing changes one thing and fits: combine a smaller micro-batch (and checkpointing) with scale.
    lean = {"batch": 1, **({"gradient_checkpointing": True} if train else {})}
    flags = " ".join((["--batch 1"] if mem_kwargs["batch"] > 1 else [])
                     + (["--gradient-checkpointing"] if train and not mem_kwargs.get("gradient_checkpointing") else []))
    flags = flags or "the same settings"
    hit = fit(inst, nodes, **lean)
    if hit:
        return [f"{flags} on {where}: {say(hit)}"]
    found = more_nodes(inst, nodes, **lean)
    if found:
        n, hit = found
        out.append(f"{flags} on {n} x {inst.name} (--nodes {n}): {say(hit)}")
    for other in bigger:
        hit = fit(other, 1, **lean)
        if hit:
            out.append(f"{flags} on one {other.name}: {say(hit)}")
            break
        found = more_nodes(other, 1, **lean)
        if found:
            n, hit = found
            out.append(f"{flags} on {n} x {other.name} (--nodes {n}): {say(hit)}")
            break
    if out:
        return out
    seq = mem_kwargs["seq"] // 2
    while seq >= 128:
        changes = {**lean, "seq": seq}
        if mem_kwargs.get("cache_length") is not None:
            changes["cache_length"] = min(mem_kwargs["cache_length"], seq)
        hit = fit(inst, nodes, **changes)
        if hit:
            return [f"{flags} --seq {seq} on {where}: {say(hit)}"]
        seq //= 2
    return [f"nothing the planner tried (up to {_NODE_COUNTS[-1]} nodes, batch 1"
            + (", gradient checkpointing" if train else "") + ", seq down to 128)"]


def _reason(best: MeshCandidate, cands: list, inst: Instance, budget: int, workload: str) -> str:
    plan = best.plan
    smaller = [c for c in cands if c.plan is not None and c.tp_size < best.tp_size]
    why = (f"Recommended: tp={best.tp_size} x fsdp={best.fsdp_size}, {plan.total / GiB:.2f} of "
           f"{budget / GiB:.1f} GiB usable per core. ")
    if smaller:
        worst = max(smaller, key=lambda c: c.tp_size)
        why += (f"It is the smallest tensor-parallel size that fits (tp={worst.tp_size} needs "
                f"{worst.plan.total / GiB:.1f} GiB). ")
    else:
        why += "It is the smallest tensor-parallel size (no TP needed). "
    why += ("TP all-reduces activations twice per layer, so once the model fits, more TP only adds "
            "communication; FSDP shards weights" + (", gradients and optimizer state" if workload == "train" else "")
            + f" over {best.fsdp_size} ranks and gathers each layer when it runs, overlapping compute. ")
    if 1 < best.tp_size <= inst.cores_per_chip:
        why += f"tp={best.tp_size} keeps each TP group inside one chip ({inst.cores_per_chip} logical cores per chip). "
    elif best.tp_size > inst.cores_per_chip:
        why += f"tp={best.tp_size} spans {best.tp_size // inst.cores_per_chip} chips over NeuronLink. "
    why += (f"Each FSDP rank runs its own micro-batch of {plan.batch} x {plan.seq} tokens "
            f"(global batch {plan.batch * best.fsdp_size}).")
    return why


def plan_mesh(config=None, instance="trn2.48xlarge", workload: str = "inference", *, batch: int = 1,
              seq: int = 2048, headroom: float = 0.1, nodes: int = 1, tp_size: int | None = None,
              fsdp_size: int | None = None, dtype="bfloat16", master_weights: str = "fp32",
              optimizer: str = "adamw", gradient_checkpointing: bool = False,
              cache_length: int | None = None) -> MeshPlan:
    """Choose the ``DistributedConfig(tp_size, fsdp_size)`` for ``config`` on ``instance``.

    Tries every mesh with ``tp_size * fsdp_size`` = logical cores x ``nodes`` (or only the one
    given by ``tp_size``/``fsdp_size``), rejects those :func:`trnlab.launcher.validate_parallel_sizes`
    rejects (heads, kv heads, MLP width divisible by tp; vocabulary by tp * fsdp with tied
    embeddings) or that would split a TP group across hosts, plans each with
    :func:`plan_memory`, and keeps those whose total fits the HBM per logical core minus
    ``headroom``. Recommends the smallest tp that fits (TP costs communication every layer),
    and says why. ``batch`` is the micro-batch of each FSDP rank.

    Raises :class:`PlanError`: unknown or trn1 instance; a given mesh the model or launch cannot
    take (the :class:`~trnlab.launcher.LaunchConfigError` message); no mesh fits (the message says
    what would: more nodes, a larger instance, a smaller batch or sequence, gradient
    checkpointing, each computed). Returns a :class:`MeshPlan`. Used by notebook 05 and
    ``python -m trnlab plan``.
    """
    inst = get_instance(instance)
    config, label = resolve_config(config)
    if not isinstance(nodes, int) or nodes < 1:
        raise PlanError(f"nodes={nodes!r}: a whole number >= 1")
    if not 0 <= headroom < 1:
        raise PlanError(f"headroom={headroom!r}: a fraction in [0, 1)")
    workload_key = _WORKLOADS.get(str(workload).lower())
    if workload_key is None:
        raise PlanError(f"workload={workload!r}: use 'inference' or 'train'")
    mem_kwargs = dict(batch=batch, seq=seq, dtype=dtype, master_weights=master_weights, optimizer=optimizer,
                      gradient_checkpointing=gradient_checkpointing, cache_length=cache_length)
    cands = _candidates(config, inst, nodes, workload_key, headroom, mem_kwargs, tp_size, fsdp_size)
    budget = int(inst.hbm_per_core * (1 - headroom))
    where = f"{nodes} x {inst.name}" if nodes > 1 else inst.name
    valid = [c for c in cands if c.valid]
    if not valid:
        reasons = sorted({c.rejected for c in cands})
        raise PlanError(f"no mesh of {inst.logical_cores * nodes} ranks on {where} suits {label}: "
                        + " | ".join(reasons))
    fitting = [c for c in valid if c.fits]
    settings = {**mem_kwargs, "dtype": _dtype_name(dtype)}
    if not fitting:
        best = min(valid, key=lambda c: c.plan.total)
        what = f"{'training' if workload_key == 'train' else 'inference'} (micro-batch {batch} x {seq} per rank)"
        alternatives = _what_would_fit(config, inst, nodes, workload_key, headroom, mem_kwargs)
        other = _any_fits(config, inst, nodes, workload_key, headroom, mem_kwargs)
        if (tp_size is not None or fsdp_size is not None) and other is not None:
            alternatives.insert(0, f"--tp {other.tp_size} --fsdp {other.fsdp_size} on {where}: "
                                   f"{other.plan.total / GiB:.1f} GiB per core")
        head = (f"{label} {what} does not fit tp={best.tp_size} x fsdp={best.fsdp_size} on {where}: it needs "
                if tp_size is not None or fsdp_size is not None else
                f"{label} {what} fits no mesh on {where}: the leanest, tp={best.tp_size} x fsdp={best.fsdp_size}, needs ")
        raise PlanError(
            head + f"{best.plan.total / GiB:.1f} GiB per core, {budget / GiB:.1f} GiB usable "
            f"({inst.hbm_per_core / GiB:.0f} GiB minus {headroom:.0%} headroom). What would fit: "
            + "; ".join(alternatives) + ".")
    best = min(fitting, key=lambda c: c.tp_size)
    reason = _reason(best, cands, inst, budget, workload_key)
    if workload_key == "inference":
        replicas = ((tp, plan_memory(config, tp, 1, workload="inference", **mem_kwargs))
                    for tp in _head_ok_tps(config, inst))
        alone = next(((tp, r) for tp, r in replicas if r.fits(inst.hbm_per_core, headroom)), None)
        if alone:
            tp, replica = alone
            reason += (f" For serving, FSDP all-gathers every layer on every forward (each new token): "
                       f"the model also fits tp={tp} without FSDP ({replica.total / GiB:.2f} GiB per core), "
                       f"so {inst.logical_cores * nodes // tp} independent replicas of DistributedConfig(tp_size={tp}) "
                       f"avoid those all-gathers.")
    return MeshPlan(model=label, instance=inst, nodes=nodes, workload=workload_key, headroom=headroom,
                    candidates=cands, recommended=best, reason=reason, settings=settings)


# ---------------------------------------------------------------------------------------------
# Text and plot
# ---------------------------------------------------------------------------------------------

def format_plan(plan, *, shards: bool = False) -> str:
    """A plan as text: a :class:`MeshPlan` (summary, every mesh, recommended mesh's components)
    or a :class:`MemoryPlan` (summary and components). ``shards=True`` adds one line per tensor.

    Printed by ``python -m trnlab plan`` and ``python -m trnlab launch --dry-run``; notebook 05.
    """
    if isinstance(plan, MeshPlan):
        parts = [plan.summary(), "", plan.table()]
        if plan.recommended is not None:
            parts += ["", f"recommended mesh, per rank: {plan.recommended.plan.summary()}",
                      plan.recommended.plan.table()]
            memory = plan.recommended.plan
        else:
            memory = None
    elif isinstance(plan, MemoryPlan):
        parts = [plan.summary(), plan.table()]
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
    bytes per core to draw when ``plans`` is not a MeshPlan. Notebook 05.
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
# Command line
# ---------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trnlab plan",
        description="Bytes per NeuronCore and the right (tp, fsdp) mesh for a model on a Trainium instance. "
                    f"Offline for the shipped configs: {', '.join(SHIPPED_MODELS)}.")
    p.add_argument("--model", default=None,
                   help="shipped name, local folder, config.json path or hub name (default: $TRNLAB_MODEL "
                        "or the course's tiny model)")
    p.add_argument("--instance", default="trn2.48xlarge", help=f"one of {', '.join(INSTANCES)}")
    p.add_argument("--train", action="store_true", help="plan training (default: inference)")
    p.add_argument("--batch", type=int, default=1, help="sequences per data-parallel (FSDP) rank")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: 2048, at most the model's "
                                                         "max_position_embeddings)")
    p.add_argument("--tp", type=int, default=None, help="plan only this tensor-parallel size")
    p.add_argument("--fsdp", type=int, default=None, help="plan only this FSDP size")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--headroom", type=float, default=0.1, help="fraction of HBM kept free (default 0.1)")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (default bfloat16)")
    p.add_argument("--master-weights", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--cache-length", type=int, default=None, help="static KV cache positions (default: --seq)")
    p.add_argument("--shards", action="store_true", help="list every tensor's shard on one rank")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m trnlab plan ...``: print the mesh plan (text or ``--json``).

    Returns 0, or 2 after printing the :class:`PlanError` (to stderr; in the JSON with ``--json``).
    The command the README and notebook 05 show; ``--help`` lists the options.
    """
    args = _parser().parse_args(argv)
    try:
        config, label = resolve_config(args.model)
        seq = args.seq
        if seq is None:
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            seq = min(2048, getattr(text, "max_position_embeddings", None) or 2048)
        plan = plan_mesh(config, args.instance, "train" if args.train else "inference", batch=args.batch,
                         seq=seq, headroom=args.headroom, nodes=args.nodes, tp_size=args.tp,
                         fsdp_size=args.fsdp, dtype=args.dtype, master_weights=args.master_weights,
                         gradient_checkpointing=args.gradient_checkpointing, cache_length=args.cache_length)
        plan.model = label
    except PlanError as exc:
        if args.json:
            print(json.dumps({"error": str(exc)}, indent=1))
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = plan.to_dict()
        if args.shards and plan.recommended is not None:
            out["recommended"]["plan"] = plan.recommended.plan.to_dict(shards=True)
        print(json.dumps(out, indent=1))
    else:
        print(format_plan(plan, shards=args.shards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
