"""Plan a real run: the ``(tp, fsdp)`` mesh that fits a Trainium instance, and why.

Notebook 05 trains the tiny course model on a 2 x 2 mesh of CPU processes. Before running a
real Qwen3 model on a trn2 or trn3 instance, the same question has a number for an answer:
which ``DistributedConfig(tp_size, fsdp_size)`` fits? :func:`plan_mesh` asks the memory model
(:func:`trnlab.plan_memory`, :mod:`trnlab.memory_model`) for the bytes per rank of every mesh
it tries, and lays the job out the way Neuron's training best practices do:

* FSDP alone if it fits, else tensor parallelism inside one chip ("Keep TP4 within a chip")
  with FSDP between chips, the least activation checkpointing that fits, TP across chips only
  as a last resort; serving uses independent replicas without FSDP;
* meshes the model or the launch cannot take are rejected
  (:func:`trnlab.mesh.validate_parallel_sizes`);
* when nothing fits, it says what would (more nodes, a larger instance, a smaller batch,
  checkpointing), each computed, not guessed.

``python -m trnlab plan --model Qwen/Qwen3-8B --instance trn2.48xlarge [--train]`` prints the
same (:mod:`trnlab.cli.plan`); it works offline for the Qwen3 configs shipped in
``trnlab/assets/configs``. The instance table is :mod:`trnlab.instances`; the text and the plot of
a plan are :func:`trnlab.format_plan` and :func:`trnlab.plot_memory_plan`. Used by notebook 06.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trnlab.deprecation import SummaryDict, moved_names, warn_deprecated
from trnlab.instances import INSTANCES, GiB, Instance, PlanError, get_instance
from trnlab.memory_model import (CHECKPOINTING, COMPONENT_SHORT_LABELS, COMPONENTS, MemoryPlan, checkpointed_layers,
                                 checkpointing_label, checkpointing_mode, dtype_name, every_nth_layer, plan_memory,
                                 recompute_fraction, workload_name)
from trnlab.mesh import LaunchConfigError, divisors, tp_dimensions, tp_sizes_that_fit, validate_parallel_sizes
from trnlab.settings import DEFAULT_INSTANCE
from trnlab.sharding import config_and_label, model_spec, tp_problem

__all__ = ["AWS_QWEN3_8B_RECIPE", "TORCHTITAN_TUTORIAL_URL", "TRAINING_BEST_PRACTICES_URL", "MeshCandidate",
           "MeshPlan", "plan_mesh"]

#: Neuron's training guidance the mesh advice follows.
TRAINING_BEST_PRACTICES_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training/best-practices.html"
#: Neuron's TorchTitan training tutorial (the layer-level selective checkpointing the planner models).
TORCHTITAN_TUTORIAL_URL = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training/torchtitan/tutorials/"
                           "tutorial-basic-training.html")


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
        """``{"tp=.. x fsdp=..": MemoryPlan}`` for every valid mesh (for :func:`trnlab.plot_memory_plan`)."""
        return {c.plan.mesh: c.plan for c in self.candidates if c.plan is not None}

    def table(self) -> str:
        """Every mesh tried, one line each: per-component GiB, total, fits or why rejected."""
        short = COMPONENT_SHORT_LABELS
        head = f"{'tp':>3} {'fsdp':>5}  " + " ".join(f"{short[k]:>9}" for k in COMPONENTS) + f" {'total':>9}  verdict"
        lines = [head + "   (GiB per rank" + (f", {checkpointing_label(self.checkpointing, self.settings.get('checkpoint_every', 2))})"
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
    """``"trn2.48xlarge"`` or ``"4 x trn2.48xlarge"``."""
    return f"{nodes} x {inst.name}" if nodes > 1 else inst.name


def _whole(name: str, value) -> None:
    """Refuse a size that is given but not a whole number >= 1."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise PlanError(f"{name}={value!r}: a whole number >= 1")


def _given_mesh(config, inst: Instance, nodes: int, tp_size: int | None, fsdp_size: int | None) -> tuple[int, int]:
    """The one mesh ``tp_size``/``fsdp_size`` name, checked: the model's heads first, then the launch."""
    _whole("tp_size", tp_size)
    _whole("fsdp_size", fsdp_size)
    world, where = inst.logical_cores * nodes, _where(inst, nodes)
    d = model_spec(config).dims
    ok_tps = tp_sizes_that_fit(tp_dimensions(config), world)
    if tp_size is not None and tp_problem(d, tp_size):
        if world % tp_size == 0 and fsdp_size in (None, world // tp_size):
            try:   # the launcher's own message, as `launch` would print it
                validate_parallel_sizes(world, tp_size, world // tp_size, model_config=config)
            except LaunchConfigError as exc:
                raise PlanError(str(exc)) from exc
        # The heads come first: a launch-size message would hide why this tp cannot work at all.
        raise PlanError(tp_problem(d, tp_size, world, where))
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
    """Why a TP group may not span hosts."""
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
    """The candidate with its memory plan and whether it fits (a rejected one as it is)."""
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
    """The TP sizes within one host that the model's heads divide by."""
    return tp_sizes_that_fit(tp_dimensions(config), inst.cores_per_host)


def _scales_with_nodes(config, inst: Instance, workload: str, headroom: float, mem_kwargs: dict, mode: str) -> bool:
    """Whether any node count could fit: more ranks shrink the FSDP-sharded state, never a rank's
    activations or gathered layers, so if even an unbounded FSDP size does not fit, none will."""
    return any(plan_memory(config, tp, 1 << 20, workload=workload, **{**mem_kwargs, "gradient_checkpointing": mode})
               .fits(inst.hbm_per_core, headroom) for tp in _head_ok_tps(config, inst))


def _more_nodes(config, inst, start, workload, headroom, mem_kwargs, modes):
    """``(nodes, choice)`` for the fewest nodes above ``start`` that fit, or None."""
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
    """A found layout in a few words: mesh, checkpointing, GiB per core."""
    c = hit.candidate
    mesh = f"{c.replicas} replicas of tp={c.tp_size}" if c.replicas > 1 else c.mesh
    ckpt = f", {checkpointing_label(hit.mode, c.plan.checkpoint_every)}" if workload == "train" else ""
    return f"{mesh}{ckpt}, {c.plan.total / GiB:.1f} GiB per core"


def _checkpointing_flag(mode: str) -> str:
    """The command-line option that sets a checkpointing mode."""
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
    """The meshes tried before the chosen one and their bytes, grouped by checkpointing."""
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
    return "Tried first: " + "; ".join(f"{checkpointing_label(m)}: {', '.join(v)}" for m, v in by_mode.items()) + ". "


def _headline(choice: _Choice, budget: int, train: bool) -> str:
    """The reason's first sentence: the mesh chosen (or given), and its bytes against the budget."""
    best, plan, mode = choice.candidate, choice.candidate.plan, choice.mode
    ckpt = f" with {checkpointing_label(mode, plan.checkpoint_every)}" if train and mode != "none" else ""
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
        layers = model_spec(config).dims["layers"]
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
                f"{recipe['config']}; which selective option that config sets was not found: "
                f"'{every_nth_layer(plan.checkpoint_every)}' is the planner's assumption).")
    if choice.kind == "given":
        because = "you gave the mesh."
    elif not auto:
        because = f"you fixed the checkpointing ({checkpointing_label(mode, plan.checkpoint_every)})."
    else:
        because = (f"at this workload tp={best.tp_size} x fsdp={best.fsdp_size} with "
                   f"{checkpointing_label(mode, plan.checkpoint_every).replace('activation ', '')} fits already "
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
    """Choose the ``DistributedConfig(tp_size, fsdp_size)`` and activation checkpointing of a run on an instance.

    For ``config`` on ``instance``, the way Neuron's training best practices lay a job out.

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
    workload_key = workload_name(workload)
    modes = _modes(gradient_checkpointing, workload_key == "train")
    mem_kwargs = dict(batch=batch, seq=seq, dtype=dtype, master_weights=master_weights, optimizer=optimizer,
                      cache_length=cache_length, checkpoint_every=checkpoint_every)
    plan_memory(config, workload=workload_key, **{**mem_kwargs, "gradient_checkpointing": modes[0]})  # checks inputs
    given = (_given_mesh(config, inst, nodes, tp_size, fsdp_size)
             if tp_size is not None or fsdp_size is not None else None)
    settings = {**mem_kwargs, "dtype": dtype_name(dtype), "gradient_checkpointing":
                "auto" if len(modes) > 1 else modes[0]}
    choice = _search(config, inst, nodes, workload_key, headroom, mem_kwargs, modes, given)
    cands = _shown_candidates(config, inst, nodes, workload_key, label, given)
    cands = [_planned(config, c, workload_key, mem_kwargs, choice.mode if choice else modes[-1], inst.hbm_per_core,
                      headroom) for c in cands]
    if choice is None:
        raise _no_fit_error(config, inst, nodes, workload_key, headroom, mem_kwargs, modes, given, cands, label)
    # The listed row of the chosen mesh (MeshPlan.table marks the recommended row by identity).
    best = next(c for c in cands if (c.tp_size, c.fsdp_size, c.replicas) ==
                (choice.candidate.tp_size, choice.candidate.fsdp_size, choice.candidate.replicas))
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
    ckpt = f" even with {checkpointing_label(modes[-1], every)}" if train and modes[-1] != "none" else ""
    head = (f"{label} {what} does not fit tp={leanest.tp_size} x fsdp={leanest.fsdp_size} on {where}{ckpt}: "
            f"it needs " if given is not None else
            f"{label} {what} fits no mesh on {where}{ckpt}: the leanest, tp={leanest.tp_size} x "
            f"fsdp={leanest.fsdp_size}, needs ")
    return PlanError(
        head + f"{leanest.plan.total / GiB:.1f} GiB per core, {budget / GiB:.1f} GiB usable "
        f"({inst.hbm_per_core / GiB:.0f} GiB minus {headroom:.0%} headroom). What would fit: "
        + "; ".join(alternatives) + ".")


# ---------------------------------------------------------------------------------------------
# Names that lived here in trnlab 0.1: the planner was one module then (removed in trnlab 0.3)
# ---------------------------------------------------------------------------------------------

def resolve_config(model=None):
    """Deprecated: ``(config, label)``; use :func:`trnlab.load_config` (the label is ``config.name_or_path``)."""
    warn_deprecated("planning.resolve_config", "trnlab.load_config(model) (it returns the config; its name is "
                    "config.name_or_path)")
    return config_and_label(model)


#: Old ``trnlab.planning`` names and where each lives now: ``trnlab.planning.X`` still works, with a
#: FutureWarning saying where to import it from. The names planning imports itself (``plan_memory``,
#: ``PlanError``, ``GiB``, ...) are plain attributes of it, as every import is; their home is the
#: module whose ``__all__`` lists them.
__getattr__ = moved_names("trnlab.planning", {
    **dict.fromkeys(("UNSUPPORTED_INSTANCES", "InstanceError", "LNC_URL", "TORCHNEURON_QUICKSTART_URL",
                     "TRAINIUM2_URL", "TRAINIUM3_URL", "TRN2_ARCH_URL", "TRN3_ARCH_URL"), "trnlab.instances"),
    **dict.fromkeys(("SHIPPED_MODELS", "CONFIG_DIR"), "trnlab.models"),
    **dict.fromkeys(("REQUIRED_FIELDS", "TensorShard", "parameter_shards"), "trnlab.sharding"),
    **dict.fromkeys(("parameter_bytes", "gradient_bytes", "optimizer_bytes", "fsdp_buffer_bytes",
                     "train_activation_bytes", "inference_activation_bytes", "kv_cache_bytes", "BACKWARD_PER_FORWARD",
                     "DTYPE_BYTES", "COMPONENT_LABELS", "TRAIN_ACTIVATION_FORMULA", "INFERENCE_ACTIVATION_FORMULA",
                     "SELECTIVE_ACTIVATION_FORMULA", "ACTIVATION_FORMULA"), "trnlab.memory_model"),
    "format_plan": "trnlab.tables",
    "plot_memory_plan": "trnlab.plots",
    "main": ("trnlab.cli.plan", "`python -m trnlab plan ...` or `trnlab.cli.plan.main(argv)`"),
})
