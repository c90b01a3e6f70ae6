"""Does a ``DistributedConfig`` mesh fit the processes and the model? Checked before anything starts.
:class:`LaunchConfigError` is defined in torch-free :mod:`trnlab.rank_cores`; this module imports neither the
launcher nor the planner: they import it."""

from __future__ import annotations

import math

from trnlab.instances import PlanError
from trnlab.models import ModelNotAvailableError, load_config, text_config
from trnlab.rank_cores import LaunchConfigError  # the launch's one error type (defined there: no torch)

__all__ = ["LaunchConfigError", "TP_DIMENSIONS", "checked_config", "divisors", "mesh_sizes", "tp_dimensions",
           "tp_misfits", "tp_sizes_that_fit", "validate_parallel_sizes"]

#: Config attributes tensor parallelism splits evenly, with how a message names them.
TP_DIMENSIONS = (("num_attention_heads", "attention heads"), ("num_key_value_heads", "key/value heads"),
                 ("intermediate_size", "MLP width (intermediate_size)"))


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending: ``divisors(12)`` -> ``[1, 2, 3, 4, 6, 12]``."""
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_sizes(tp_size, fsdp_size) -> tuple[int, int] | None:
    """``(tp_size, fsdp_size)`` with 1 for one not given; ``None`` when neither is given.
    A size of 0 or less is refused here, never read as 1."""
    if tp_size is None and fsdp_size is None:
        return None
    sizes = (1 if tp_size is None else tp_size, 1 if fsdp_size is None else fsdp_size)
    for name, value in zip(("tp_size", "fsdp_size"), sizes):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LaunchConfigError(f"{name}={value!r}: every parallel size is a whole number >= 1 "
                                    "(leave it out for 1)")
    return sizes


def tp_dimensions(config) -> dict[str, int]:
    """The widths of ``config`` that tensor parallelism splits: ``{"num_attention_heads": 32, ...}``.
    Keys are the config attributes of :data:`TP_DIMENSIONS`; one a config lacks is left out."""
    text = text_config(config)
    dims = {attr: getattr(text, attr, None) for attr, _ in TP_DIMENSIONS}
    return {attr: value for attr, value in dims.items() if isinstance(value, int)}


def tp_misfits(dims: dict[str, int], tp_size: int) -> list[tuple[str, str, int]]:
    """``(attribute, label, value)`` of each width in ``dims`` that ``tp_size`` does not divide."""
    return [(attr, label, dims[attr]) for attr, label in TP_DIMENSIONS if attr in dims and dims[attr] % tp_size]


def tp_sizes_that_fit(dims: dict[str, int], world_size: int) -> list[int]:
    """The divisors of ``world_size`` that divide every width in ``dims``: the tp sizes that work."""
    return [t for t in divisors(world_size) if all(v % t == 0 for v in dims.values())]


def checked_config(model=None):
    """The config a mesh is checked against: :func:`trnlab.load_config`, a config passes through; none is a LaunchConfigError."""
    if hasattr(model, "num_attention_heads") or hasattr(model, "get_text_config"):
        return model
    try:
        return load_config(model)
    except (PlanError, ModelNotAvailableError) as exc:
        raise LaunchConfigError(f"cannot check the mesh against model {model!r}: {exc}") from None


def _check_sizes(world_size: int, sizes: dict[str, int]) -> None:
    """Every size a whole number >= 1, and their product the number of processes."""
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise LaunchConfigError(f"{name}={value!r}: every parallel size is a whole number >= 1")
    product = math.prod(sizes.values())
    if product == world_size:
        return
    pp_size, dp_replicate_size = sizes["pp_size"], sizes["dp_replicate_size"]
    shown = ["tp_size", "fsdp_size", "dp_replicate_size", "pp_size"]
    used = " * ".join(f"{k}={sizes[k]}" for k in shown if sizes[k] != 1 or k in ("tp_size", "fsdp_size"))
    pairs = [f"tp_size={t}, fsdp_size={world_size // t}" for t in divisors(world_size)
             if world_size % (t * pp_size * dp_replicate_size) == 0][:4]
    raise LaunchConfigError(
        f"{used} = {product}, but the launch has {world_size} process(es): the mesh needs exactly "
        f"one process per position. Either launch {product} processes (nproc_per_node * nnodes = "
        f"{product}), or change the sizes so their product is {world_size}"
        + (f" (e.g. {'; '.join(pairs)})." if pairs and pp_size == dp_replicate_size == 1 else "."))


def _check_tp_dimensions(config, world_size: int, tp_size: int) -> None:
    """Each tensor-parallel rank gets whole heads and an equal slice of the MLP."""
    dims = tp_dimensions(config)
    bad = tp_misfits(dims, tp_size)
    if bad:
        what = ", ".join(f"{label} = {value}" for _, label, value in bad)
        raise LaunchConfigError(
            f"tp_size={tp_size} does not divide the model's {what}: each tensor-parallel rank "
            f"must get whole heads and an equal slice. Use tp_size in {tp_sizes_that_fit(dims, world_size)} "
            f"(and fsdp_size = {world_size} // tp_size), or a model whose heads divide by {tp_size}.")


def _check_tied_vocabulary(config, tp_size: int, fsdp_size: int, dp_replicate_size: int) -> None:
    """With tied embeddings under FSDP the vocabulary must split evenly over ``tp * fsdp``."""
    text = text_config(config)
    vocab = getattr(text, "vocab_size", None)
    shards = tp_size * fsdp_size
    tied = getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))
    if tied and fsdp_size * dp_replicate_size > 1 and isinstance(vocab, int) and vocab % shards:
        raise LaunchConfigError(
            f"vocab_size={vocab} does not divide by tp_size * fsdp_size = {shards}: the tied "
            f"embedding's rows would be split unevenly, and with tied embeddings under FSDP2 "
            f"(Transformers 5.24) the padded ranks train lm_head from a stale copy, so the loss "
            f"silently drifts from a one-process run. Pad the vocabulary first: "
            f"trnlab.distributed.pad_vocabulary(model, folder, multiple=64) (any multiple of "
            f"{shards}), or use fsdp_size=1.")


def _check_pipeline_layers(config, pp_size: int) -> None:
    """Pipeline stages take whole layers."""
    layers = getattr(text_config(config), "num_hidden_layers", None)
    if isinstance(layers, int) and layers % pp_size:
        raise LaunchConfigError(f"pp_size={pp_size} does not divide num_hidden_layers={layers}: use pp_size in "
                                f"{divisors(layers)}.")


def validate_parallel_sizes(world_size: int, tp_size: int = 1, fsdp_size: int = 1, *,
                            dp_replicate_size: int = 1, pp_size: int = 1,
                            model_config=None, check_model: bool = True) -> dict:
    """Check a ``DistributedConfig`` layout against the launch and ``model_config`` (``None``: the course model).
    The sizes' product must equal ``world_size``; heads, KV heads and ``intermediate_size`` divide by ``tp_size``, layers
    by ``pp_size``, a tied vocabulary by ``tp_size * fsdp_size``. Returns the sizes; raises :class:`LaunchConfigError`."""
    sizes = {"pp_size": pp_size, "dp_replicate_size": dp_replicate_size,
             "fsdp_size": fsdp_size, "tp_size": tp_size}
    _check_sizes(world_size, sizes)
    config = checked_config(model_config) if check_model else None
    if config is not None:
        _check_tp_dimensions(config, world_size, tp_size)
        _check_tied_vocabulary(config, tp_size, fsdp_size, dp_replicate_size)
        _check_pipeline_layers(config, pp_size)
    return sizes
