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
        """The search's headline figures as a dict: instance, nodes, budget, the recommended mesh."""
        rec = self.recommended
        return {
            "model": self.model, "instance": self.instance.name, "nodes": self.nodes, "world_size": self.world_size,
            "workload": self.workload, "headroom": self.headroom, "budget_bytes": self.budget,
            "recommended": None if rec is None else {"tp_size": rec.tp_size, "fsdp_size": rec.fsdp_size,
                                                     "replicas": rec.replicas},
            "checkpointing": self.checkpointing, "candidates": len(self.candidates), "reason": self.reason}

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


def _say(flags: str, place: str, hit: _Choice, workload: str) -> str:
    """One alternative: its flags, where, and the layout found (mesh, checkpointing, GiB per core)."""
    c = hit.candidate
    mesh = f"{c.replicas} replicas of tp={c.tp_size}" if c.replicas > 1 else c.mesh
    ckpt = f", {checkpointing_label(hit.mode, c.plan.checkpoint_every)}" if workload == "train" else ""
    return f"{flags + ' on ' if flags else ''}{place}: {mesh}{ckpt}, {c.plan.total / GiB:.1f} GiB per core"


def _more_nodes(job: tuple, inst: Instance, start: int, kw: dict, modes: tuple):
    """``(nodes, choice)`` for the fewest nodes above ``start`` that fit, or None. More ranks shrink the sharded
    state, never a rank's activations: if even an unbounded FSDP size does not fit, no node count will."""
    config, workload, headroom = job
    if any(plan_memory(config, tp, 1 << 20, workload=workload, **{**kw, "gradient_checkpointing": modes[-1]})
           .fits(inst.hbm_per_core, headroom) for tp in tp_sizes_that_fit(tp_dimensions(config), inst.cores_per_host)):
        return next(((n, hit) for n in _NODE_COUNTS
                     if n > start and (hit := _search(config, inst, n, workload, headroom, kw, modes))), None)
    return None


def _largest_batch(job: tuple, inst: Instance, nodes: int, kw: dict, modes: tuple, upper: int):
    """``(batch, choice)`` for the largest micro-batch in [1, upper] that fits, by bisection (memory grows with it)."""
    config, workload, headroom = job

    def fit(batch: int):
        return _search(config, inst, nodes, workload, headroom, {**kw, "batch": batch}, modes)

    if upper < 1 or not (hit := fit(1)):
        return None
    lo, hi, found = 1, upper, (1, hit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hit := fit(mid):
            lo, found = mid, (mid, hit)
        else:
            hi = mid - 1
    return found


def _what_would_fit(config, inst: Instance, nodes: int, workload: str, headroom: float, kw: dict,
                    modes: tuple) -> list[str]:
    """Alternatives for a workload no mesh fits, each planned and fitting: one change at a time (more nodes, a larger
    instance, the largest batch, heavier checkpointing); else the leanest settings (batch 1, full checkpointing)
    here, on more nodes or a larger instance; else those with the sequence halved, down to 128."""
    job, here, train = (config, workload, headroom), _where(inst, nodes), workload == "train"
    bigger = sorted((o for o in INSTANCES.values() if o.hbm_total > inst.hbm_total * nodes), key=lambda o: o.hbm_total)

    def elsewhere(k: dict, m: tuple, flags: str, scale_bigger: bool) -> list[str]:
        out = []
        if found := _more_nodes(job, inst, nodes, k, m):
            out.append(_say(flags, f"{found[0]} x {inst.name} (--nodes {found[0]})", found[1], workload))
        for other in bigger:
            if hit := _search(config, other, 1, workload, headroom, k, m):
                return out + [_say(flags, f"one {other.name}", hit, workload)]
            if scale_bigger and (found := _more_nodes(job, other, 1, k, m)):
                return out + [_say(flags, f"{found[0]} x {other.name} (--nodes {found[0]})", found[1], workload)]
        return out

    out = elsewhere(kw, modes, "", False)
    if found := _largest_batch(job, inst, nodes, kw, modes, kw["batch"] - 1):
        out.append(_say(f"--batch {found[0]}", here, found[1], workload))
    for mode in CHECKPOINTING[CHECKPOINTING.index(modes[-1]) + 1:] if train else ():
        if found := _largest_batch(job, inst, nodes, kw, (mode,), kw["batch"]):
            extra = "" if found[0] == kw["batch"] else f" --batch {found[0]}"
            out.append(_say(f"--checkpointing {mode}{extra}", here, found[1], workload))
            break
    lean, lean_modes = {**kw, "batch": 1}, ("full",) if train else modes  # not tried here: one change covers it
    flags = " ".join(["--batch 1"] * (kw["batch"] > 1) + ["--checkpointing full"] * (train and modes[-1] != "full"))
    if out := out or elsewhere(lean, lean_modes, flags, True):
        return out
    seq = kw["seq"] // 2
    while seq >= 128:
        shorter = {**lean, "seq": seq, "cache_length": kw["cache_length"] and min(kw["cache_length"], seq)}
        if hit := _search(config, inst, nodes, workload, headroom, shorter, lean_modes):
            return [_say(f"{flags} --seq {seq}".strip(), here, hit, workload)]
        seq //= 2
    return [f"nothing the planner tried (up to {_NODE_COUNTS[-1]} nodes, batch 1"
            + (", full activation checkpointing" if train else "") + ", seq down to 128)"]


#: AWS's published layout for Qwen3-8B training on one trn2.48xlarge (TorchTitan Neuron tutorial).
AWS_QWEN3_8B_RECIPE = {"model": "Qwen/Qwen3-8B", "instance": DEFAULT_INSTANCE, "tp_size": 4, "fsdp_size": 16,
                       "checkpointing": "selective", "config": "qwen3_8b_tp4_fsdp16_sac", "source": TORCHTITAN_TUTORIAL_URL}


def _headline(choice: _Choice, budget: int, hbm: int, train: bool) -> str:
    """The reason's first sentences: the mesh chosen (or given), its bytes against the budget, what was tried first."""
    best, plan, mode = choice.candidate, choice.candidate.plan, choice.mode
    ckpt = f" with {checkpointing_label(mode, plan.checkpoint_every)}" if train and mode != "none" else ""
    head = (f"Recommended for serving: {best.replicas} independent replicas of DistributedConfig(tp_size="
            f"{best.tp_size}) (tp={best.tp_size} x fsdp=1)" if choice.kind == "replicas" else
            f"Planned the mesh you gave: {best.mesh}{ckpt}" if choice.kind == "given" else
            f"Recommended: {best.mesh}{ckpt}")
    why = (f"{head}, {plan.total / GiB:.2f} of {budget / GiB:.1f} GiB usable per core ({hbm / GiB:.0f} GiB of HBM "
           f"minus the planner's assumed {1 - budget / hbm:.0%} headroom; the runtime's own overhead is not published). ")
    failed: dict[str, list[str]] = {}   # by checkpointing mode
    for t in (t for t in choice.tried if not t["fits"]):
        mesh = (f"{t['replicas']} replicas of tp={t['tp_size']}" if t["replicas"] > 1
                else f"tp={t['tp_size']} x fsdp={t['fsdp_size']}")
        failed.setdefault(t["checkpointing"], []).append(f"{mesh} needs {t['total_bytes'] / GiB:.1f} GiB")
    if failed:
        why += "Tried first: " + "; ".join((f"{checkpointing_label(m)}: " if train else "") + ", ".join(v)
                                           for m, v in failed.items()) + ". "
    return why


def _why(choice: _Choice, config, chip: int, train: bool) -> str:
    """Why this layout: serving replicas without FSDP; or this TP (alone, in a chip, across chips), FSDP, recompute."""
    best, plan, mode = choice.candidate, choice.candidate.plan, choice.mode
    if choice.kind == "replicas":
        return ("Serving uses no FSDP: FSDP all-gathers every layer on every forward, that is for every new token; "
                "each replica holds the whole model and answers its own requests. "
                + (f"tp={best.tp_size} keeps each replica inside one chip ({chip} logical cores per chip), where its "
                   "all-reduces stay on the chip. " if best.tp_size > 1 else "")
                + f"Each replica serves {plan.batch} sequence(s) of {plan.cache_length} cache positions.")
    if best.tp_size == 1:
        why = ("FSDP alone fits: no tensor parallelism (Neuron's training best practices: start with the least model "
               "parallelism that leaves memory headroom). ")
    elif best.tp_size > chip:
        why = (f"tp={best.tp_size} spans {best.tp_size // chip} chips, against Neuron's advice to keep TP within a "
               f"chip ({chip} logical cores): "
               + ("you asked for it. " if choice.kind == "given" else "no mesh with TP inside a chip fits. "))
    else:
        why = (f"tp={best.tp_size} keeps each TP group inside one chip ({chip} logical cores per chip; Neuron's "
               f"training best practices: \"Keep TP4 within a chip\"), so TP's two all-reduces per layer stay on the "
               "chip" + (", and FSDP goes between the chips. " if best.fsdp_size > 1 else ". "))
        if choice.passed_over:   # the ladder's rule, said as one
            why += (", ".join(f"{c.mesh} ({c.plan.total / GiB:.2f} GiB)" for c in choice.passed_over)
                    + " would fit too, but the planner passes over TP smaller than a chip: after FSDP alone its next "
                    f"step is a whole chip of TP (tp={best.tp_size}), following Neuron's \"Keep TP4 within a chip\" "
                    "and AWS's published tp=4 x fsdp=16 recipe for Qwen3-8B; a layout rule, not a measured speed-up. ")
    if best.fsdp_size > 1:
        why += ("FSDP shards the weights" + (", gradients and optimizer state" if train else "")
                + f" over {best.fsdp_size} ranks and gathers each layer when it runs, overlapping compute. ")
    if train and mode != "none":
        layers, every = model_spec(config).dims["layers"], plan.checkpoint_every
        why += (f"Checkpointing recomputes {checkpointed_layers(layers, mode, every)} of {layers} layers' forward in "
                f"backward: about {recompute_fraction(config, plan.seq, mode, checkpoint_every=every):.0%} more "
                "compute per step (estimate from FLOPs). ")
    return why + (f"Each FSDP rank runs its own micro-batch of {plan.batch} x {plan.seq} tokens "
                  f"(global batch {plan.batch * best.fsdp_size * best.replicas}).")


def _recipe_text(choice: _Choice, inst: Instance, label: str, auto: bool) -> str:
    """How the plan compares with AWS's published layout, when it plans that model on that instance."""
    best, plan, mode, recipe = choice.candidate, choice.candidate.plan, choice.mode, AWS_QWEN3_8B_RECIPE
    if (best.tp_size, best.fsdp_size, mode) == (recipe["tp_size"], recipe["fsdp_size"], recipe["checkpointing"]):
        return (f" It is the mesh of AWS's published layout for {label} on a {inst.name} (TorchTitan config "
                f"{recipe['config']}) by construction, since the ladder follows that layout: not an independent "
                f"confirmation. Which selective option that config sets was not found: "
                f"'{every_nth_layer(plan.checkpoint_every)}' is the planner's assumption.")
    ckpt = checkpointing_label(mode, plan.checkpoint_every)
    because = ("you gave the mesh." if choice.kind == "given" else f"you fixed the checkpointing ({ckpt})."
               if not auto else f"at this workload {best.mesh} with {ckpt.replace('activation ', '')} fits "
               "already (less model parallelism or less recompute).")
    return (f" AWS's published layout for {label} on a {inst.name} is tp=4 x fsdp=16 with selective activation "
            f"checkpointing (TorchTitan config {recipe['config']}); here it is not recommended because " + because)


def _reason(choice: _Choice, config, inst: Instance, nodes: int, budget: int, workload: str, label: str,
            auto: bool = True) -> str:
    """The recommendation in words: the mesh, what was tried, why this TP and FSDP, AWS's layout."""
    train, recipe = workload == "train", AWS_QWEN3_8B_RECIPE
    why = _headline(choice, budget, inst.hbm_per_core, train) + _why(choice, config, inst.cores_per_chip, train)
    if train and (label, inst.name, nodes) == (recipe["model"], recipe["instance"], 1):
        why += _recipe_text(choice, inst, label, auto)
    return why


def plan_mesh(config=None, instance=DEFAULT_INSTANCE, workload: str = "inference", *, batch: int = 1,
              seq: int | None = None, headroom: float = 0.1, nodes: int = 1, tp_size: int | None = None,
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
    only that mesh (its heads checked first). ``batch`` is the micro-batch of each FSDP rank; ``seq``
    (default 2048) and ``cache_length`` are at most the model's ``max_position_embeddings``.

    Raises :class:`PlanError`: unknown or trn1 instance; bad sizes (``tp_size=0``, a tp the heads
    do not divide by, a seq past the model's positions); a given mesh the model or launch cannot
    take; no mesh fits (the message says what would: more nodes, a larger instance, a smaller batch
    or sequence, checkpointing, each computed). Returns a :class:`MeshPlan`. Used by notebook 06 and ``python -m trnlab plan``.
    """
    inst = get_instance(instance)
    config, label = config_and_label(config)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise PlanError(f"nodes={nodes!r}: a whole number >= 1")
    if not 0 <= headroom < 1:
        raise PlanError(f"headroom={headroom!r}: a fraction in [0, 1)")
    limit = model_spec(config).dims["max_position_embeddings"]
    seq = min(2048, limit or 2048) if seq is None else seq
    workload_key = workload_name(workload)
    modes = _modes(gradient_checkpointing, workload_key == "train")
    mem_kwargs = dict(batch=batch, seq=seq, dtype=dtype, master_weights=master_weights, optimizer=optimizer,
                      cache_length=cache_length, checkpoint_every=checkpoint_every)
    plan_memory(config, workload=workload_key, **{**mem_kwargs, "gradient_checkpointing": modes[0]})  # checks inputs
    for name, value in (("seq", seq), ("cache_length", cache_length)):
        if limit and value is not None and value > limit:
            raise PlanError(f"{name}={value}: the model takes at most {limit} positions ({label}'s "
                            f"max_position_embeddings): use {name} <= {limit}")
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
    train, where, budget = workload == "train", _where(inst, nodes), int(inst.hbm_per_core * (1 - headroom))
    leanest = min((c for c in cands if c.plan is not None), key=lambda c: c.plan.total)
    alternatives = _what_would_fit(config, inst, nodes, workload, headroom, mem_kwargs, modes)
    if given is not None and (other := _search(config, inst, nodes, workload, headroom, mem_kwargs, modes)):
        alternatives.insert(0, _say(f"--tp {other.candidate.tp_size} --fsdp {other.candidate.fsdp_size}", where, other,
                                    workload))
    ckpt = (f" even with {checkpointing_label(modes[-1], mem_kwargs['checkpoint_every'])}"
            if train and modes[-1] != "none" else "")
    what = (f"{label} {'training' if train else 'inference'} (micro-batch {mem_kwargs['batch']} x {mem_kwargs['seq']} "
            f"per rank)")
    mesh = f"tp={leanest.tp_size} x fsdp={leanest.fsdp_size}"
    head = (f"{what} does not fit {mesh} on {where}{ckpt}: it needs " if given is not None else
            f"{what} fits no mesh on {where}{ckpt}: the leanest, {mesh}, needs ")
    return PlanError(
        head + f"{leanest.plan.total / GiB:.1f} GiB per core, {budget / GiB:.1f} GiB usable "
        f"({inst.hbm_per_core / GiB:.0f} GiB minus the planner's assumed {headroom:.0%} headroom). What would fit: "
        + "; ".join(alternatives) + ".")

