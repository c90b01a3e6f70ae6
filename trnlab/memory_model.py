"""Bytes one rank holds: the memory model the planner sums, one function per component.
:func:`plan_memory` gives a :class:`MemoryPlan` for a config and a ``tp_size x fsdp_size`` mesh: parameters and training
state exact for Transformers' sharding (tests compare real ranks), activations estimated (the ``*_FORMULA`` constants)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trnlab.instances import GiB, PlanError
from trnlab.sharding import ModelSpec, TensorShard, config_and_label, model_spec, tp_problem

__all__ = [
    "ACTIVATION_FORMULA", "BACKWARD_PER_FORWARD", "CHECKPOINTING", "COMPONENTS", "COMPONENT_LABELS",
    "COMPONENT_SHORT_LABELS", "DTYPE_BYTES",
    "INFERENCE_ACTIVATION_FORMULA", "SELECTIVE_ACTIVATION_FORMULA", "TRAIN_ACTIVATION_FORMULA", "MemoryPlan",
    "checkpointed_layers", "checkpointing_label", "checkpointing_mode", "dtype_name", "every_nth_layer",
    "fsdp_buffer_bytes", "gradient_bytes", "inference_activation_bytes", "kv_cache_bytes", "optimizer_bytes",
    "parameter_bytes", "plan_memory", "recompute_fraction", "train_activation_bytes", "workload_name",
]

#: Bytes per element of each dtype name the planner accepts.
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def dtype_name(dtype) -> str:
    """The planner's name of a dtype (``torch.bfloat16``, ``"bf16"`` -> ``"bfloat16"``); PlanError if unknown."""
    name = str(dtype).replace("torch.", "").lower()
    name = _DTYPE_NAMES.get(name, name)
    if name not in DTYPE_BYTES:
        raise PlanError(f"dtype {dtype!r}: use one of bfloat16, float16, float32")
    return name


# Memory of one rank

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
#: The same names, short enough for a column header (:meth:`trnlab.planning.MeshPlan.table`).
COMPONENT_SHORT_LABELS = {"parameters": "params", "gradients": "grads", "optimizer": "optim",
                          "fsdp_buffers": "fsdp buf", "activations": "activ.", "kv_cache": "kv cache"}

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


def _forward_flops_per_token(d: dict, seq: int) -> tuple[float, float]:
    """(one layer, the loss head) forward FLOPs per token: the weight matmuls (2 FLOPs per weight),
    causal attention (QK^T and AV over seq/2 keys on average)."""
    h, q, kv, i = d["hidden"], d["q_dim"], d["kv_dim"], d["intermediate"]
    layer = 2 * (h * (q + 2 * kv) + q * h + 3 * h * i) + 2 * 2 * q * seq / 2
    return layer, 2 * h * d["vocab"]


#: The usual estimate: a backward costs about twice its forward (2N forward and 4N backward FLOPs
#: per token for N parameters), so a training step costs about 1 + 2 forwards.
BACKWARD_PER_FORWARD = 2


def recompute_fraction(config=None, seq: int = 2048, gradient_checkpointing="full", *, checkpoint_every: int = 2) -> float:
    """Extra compute of a training step from activation checkpointing, as a fraction of the step.
    A step costs about 3 forwards (:data:`BACKWARD_PER_FORWARD`); checkpointing adds one forward of each checkpointed
    layer, counted from the model's matmul and attention FLOPs."""
    config, _ = config_and_label(config)
    d = model_spec(config).dims
    layer, head = _forward_flops_per_token(d, seq)
    recomputed = checkpointed_layers(d["layers"], gradient_checkpointing, checkpoint_every) * layer
    return recomputed / ((1 + BACKWARD_PER_FORWARD) * (d["layers"] * layer + head))


def _train_layer_bytes(d: dict, tokens: int, b: int, tp: int) -> float:
    """Bytes one decoder layer saves for backward on one TP rank (TRAIN_ACTIVATION_FORMULA)."""
    split = (4 + 3 * b) * (d["q_dim"] + d["kv_dim"]) + 4 * b * d["intermediate"] + 8 * d["heads"] + 4 * d["kv_heads"]
    return tokens * ((8 + 4 * b) * d["hidden"] + split / tp + 8)


@dataclass
class MemoryPlan:
    """Bytes one rank holds for a model, a mesh and a workload (:func:`plan_memory` makes it).
    ``components`` maps :data:`COMPONENTS` to bytes and ``total`` is their sum; ``fsdp_buffers`` and ``activations`` are
    estimates (see ``notes``), the rest exact for Transformers' sharding."""

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
        return checkpointing_label(self.checkpointing, self.checkpoint_every)

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
        """The plan's headline figures as a dict: model, mesh, workload, parameters held, bytes per rank."""
        return {
            "model": self.model, "tp_size": self.tp_size, "fsdp_size": self.fsdp_size, "workload": self.workload,
            "batch": self.batch, "seq": self.seq, "dtype": self.dtype, "parameter_count": self.parameter_count,
            "local_parameter_count": self.local_parameter_count, "total_bytes": self.total,
            "total_gib": round(self.total / GiB, 4)}

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


def every_nth_layer(every: int) -> str:
    """``"every 2nd layer"``, ``"every 3rd layer"``: which layers selective checkpointing wraps."""
    suffix = "th" if 10 <= every % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(every % 10, "th")
    return f"every {every}{suffix} layer"


def checkpointing_label(mode: str, every: int = 2) -> str:
    """How a checkpointing mode reads in a plan: ``"full activation checkpointing"``, for example."""
    if mode == "none":
        return "no activation checkpointing"
    if mode == "full":
        return "full activation checkpointing"
    return f"selective activation checkpointing ({every_nth_layer(every)})"


_WORKLOADS = {"inference": "inference", "generate": "inference", "train": "train", "training": "train"}
_MASTER = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}
_OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0}   # fp32/bf16 state tensors per parameter


def plan_memory(config=None, tp_size: int = 1, fsdp_size: int = 1, *, workload: str = "inference",
                batch: int = 1, seq: int = 2048, dtype="bfloat16", master_weights: str = "fp32",
                optimizer: str = "adamw", gradient_checkpointing: bool | str = False,
                cache_length: int | None = None, checkpoint_every: int = 2) -> MemoryPlan:
    """Estimate the bytes one rank holds for ``config`` on a ``tp_size x fsdp_size`` mesh, as a :class:`MemoryPlan`.
    ``config``: anything :func:`trnlab.sharding.config_and_label` takes (``None``: the course model). ``batch`` is the
    micro-batch of each FSDP (data-parallel) rank (global batch ``batch * fsdp_size``); ``seq`` is tokens per sequence.
    Parameters are split exactly as Transformers' ``DistributedConfig`` shards them (master-weight dtype in training),
    gradients likewise; AdamW adds 2 moments per parameter (``zeros_like``) and an fp32 ``step`` per tensor (sgd: none).
    FSDP buffers (estimate): two gathered layers plus the ``keep_full_weight`` modules in ``dtype``, and in training one
    layer's unsharded gradients. Activations (estimate): :data:`TRAIN_ACTIVATION_FORMULA`, the selective and inference
    ``*_ACTIVATION_FORMULA``. KV cache: ``batch * cache_length * layers * kv_heads/tp * head_dim * 2 * b``,
    ``cache_length`` defaulting to ``seq`` (a static ``generate()`` allocates prompt + new tokens - 1)."""
    config, label = config_and_label(config)
    workload_key = workload_name(workload)
    for name, value in (("tp_size", tp_size), ("fsdp_size", fsdp_size), ("batch", batch), ("seq", seq),
                        ("checkpoint_every", checkpoint_every)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanError(f"{name}={value!r}: a whole number >= 1")
    mode = checkpointing_mode(gradient_checkpointing)
    master, opt = _master_weights(master_weights), _optimizer(optimizer)
    dtype_label = dtype_name(dtype)
    b = DTYPE_BYTES[dtype_label]
    spec = _checked_spec(config, tp_size)
    cache_length = seq if cache_length is None else cache_length
    if not isinstance(cache_length, int) or cache_length < 1:
        raise PlanError(f"cache_length={cache_length!r}: a whole number >= 1")

    shards = spec.shards(tp_size, fsdp_size)
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
        dtype=dtype_label, master_weights=master, optimizer_name=opt,
        gradient_checkpointing=train and mode != "none", checkpointing=mode if train else "none",
        checkpoint_every=checkpoint_every,
        cache_length=cache_length if not train else 0, components=comp,
        parameter_count=spec.parameter_count, local_parameter_count=local,
        shards=shards, notes=notes, activation_detail=detail)


def workload_name(workload) -> str:
    """``"inference"`` or ``"train"`` for what ``workload=`` accepts (``"generate"``, ``"training"`` too)."""
    key = _WORKLOADS.get(str(workload).lower())
    if key is None:
        raise PlanError(f"workload={workload!r}: use 'inference' or 'train'")
    return key


def _master_weights(master_weights) -> str:
    """``"fp32"`` or ``"bf16"`` for what ``master_weights=`` accepts; else a PlanError."""
    master = _MASTER.get(str(master_weights).lower())
    if master is None:
        raise PlanError(f"master_weights={master_weights!r}: use 'fp32' or 'bf16'")
    return master


def _optimizer(optimizer) -> str:
    """The optimizer name, if the planner knows its state; else a PlanError."""
    opt = str(optimizer).lower()
    if opt not in _OPTIMIZERS:
        raise PlanError(f"optimizer={optimizer!r}: the planner knows {', '.join(_OPTIMIZERS)}")
    return opt


def _checked_spec(config, tp_size: int) -> ModelSpec:
    """The model's spec, refusing a ``tp_size`` the model has no plan for or whose heads do not divide."""
    spec = model_spec(config, tp_size)
    problem = tp_problem(spec.dims, tp_size) if tp_size > 1 else None
    if problem:
        raise PlanError(problem)
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


def fsdp_buffer_bytes(spec: ModelSpec, shards: list[TensorShard], b: int, grad_bytes: int = 0) -> int:
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
    """The note that shows how the KV cache bytes were counted."""
    return (f"kv_cache: batch {batch} x {cache_length} positions x {d['layers']} layers x {-(-d['kv_heads'] // tp)} kv "
            f"heads per TP rank x head_dim {d['head_dim']} x 2 (keys, values) x {b} bytes.")


def _workload_notes(d: dict, batch: int, seq: int, cache_length: int, fsdp_size: int, train: bool) -> list[str]:
    """Notes on the workload: FSDP ranks each hold their own micro-batch; a sequence past the model's positions."""
    notes = []
    if fsdp_size > 1:
        notes.append(f"FSDP is data parallelism: each of the {fsdp_size} FSDP ranks holds the activations"
                     + (" and KV cache" if not train else "") + f" of its own micro-batch ({batch} x {seq}).")
    if d["max_position_embeddings"] and max(seq, cache_length if not train else 0) > d["max_position_embeddings"]:
        notes.append(f"seq/cache_length exceed max_position_embeddings={d['max_position_embeddings']}.")
    return notes
