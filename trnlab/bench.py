"""``python -m trnlab bench generate`` and ``bench train``: the course's two benchmarks, each writing a JSON report.
generate: a seeded workload eager and compiled, unbucketed and bucketed (exit 1 if bucketing changed an answer).
train: graphs, compile time and real tokens/s per data strategy, from the same weights and cold compiles each time."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import PrinterCallback, Trainer

from trnlab import _compat
from trnlab.compile_tracking import (_recompile_limit, corpus_prompts, forget_compiled_graphs, identical_outputs,
                                     run_generation_workload, sample_prompt_lengths)
from trnlab.device import _DEFAULT_NEFF_CACHE, _NEFF_CACHE_VAR, _package_versions, pick_device
from trnlab.generation import ShapeBuckets, bucket_pad_tokens, choose_buckets, compile_backend, padding_by_bucket_count
from trnlab.models import load_model, load_tokenizer, model_name
from trnlab.plots import format_table
from trnlab.training import (STRATEGIES, TrainingRecorder, _page_arguments, _static_shape_compiles, compile_settings,
                             strategy_dataset, training_texts)

__all__ = ["main_generate", "main_train"]

#: ``bench generate``'s backend off Neuron: real kernels, a real speed-up (the course's eager only counts graphs).
_MEASURED_BACKEND = "inductor"
_NEFF_DISABLE_CACHE_VAR = "TORCH_NEURONX_NEFF_DISABLE_CACHE"  # TorchNeuron's switch: its on-disk NEFF cache off


def _args(argv, command: str, about: str, quick: str, backend: str, defaults: dict, *options):
    """``(args, parser)``: ``argv`` parsed with both benchmarks' options and ``options`` (``(flag, keywords)``); an
    option of ``defaults`` left unset takes its ``(full, quick)`` default. Sets torch's CPU threads (``--threads``)."""
    parser = argparse.ArgumentParser(prog=f"python -m trnlab bench {command}", description=about)
    output = Path("runs") / f"bench_{command}.json"
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--backend", help=backend)
    parser.add_argument("--model", help="model folder or hub id (default: $TRNLAB_MODEL or the bundled tiny Qwen3)")
    parser.add_argument("--device", help="auto (neuron > cuda > cpu), neuron, cuda or cpu (default: $TRNLAB_DEVICE)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload (default 0)")
    parser.add_argument("--recompile-limit", type=int, default=1024,
                        help="dynamo's recompile limit (default 1024, not 8: every shape compiles, as on Neuron)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's; 1 is steadier when busy)")
    parser.add_argument("--output", type=Path, default=output, help=f"JSON file (default {output})")
    for flag, keywords in options:
        parser.add_argument(flag, **keywords)
    args = parser.parse_args(argv)
    for name, (full, small) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if args.quick else full)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args, parser


def _write_report(args, report: dict, text: str) -> None:
    """Write ``report`` as JSON to ``args.output``, then print ``text`` and where the report went."""
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(text)
    print(f"wrote {args.output}")


def _generate_args(argv) -> argparse.Namespace:
    """The options of ``python -m trnlab bench generate``."""
    return _args(
        argv, "generate", "Graphs, compile time and speed of static-cache generation, bucketed and not.",
        "a tiny workload (8 prompts of 4-24 tokens, 4 new tokens, backend 'eager') for tests",
        f"torch.compile backend (default: {_MEASURED_BACKEND}, --quick: eager; on Neuron neuron, and only neuron)",
        {"prompts": (64, 8), "longest": (200, 24), "max_new_tokens": (16, 4), "buckets": (4, 2)},
        ("--prompts", dict(type=int, help="number of requests (default 64; quick 8)")),
        ("--shortest", dict(type=int, default=4, help="shortest prompt in tokens (default 4)")),
        ("--longest", dict(type=int, help="longest prompt in tokens (default 200; quick 24)")),
        ("--max-new-tokens", dict(type=int, help="tokens generated per request (default 16; quick 4)")),
        ("--buckets", dict(type=int, help="number of bucket lengths, the graph budget (default 4; quick 2)")),
        ("--compile-prefill", dict(action="store_true", help="compile the prefill too (prefill_chunk_size): a "
                                                             "graph per prompt shape, as on Neuron")))[0]


def _run_generate(args, model=None, tokenizer=None, log=print) -> dict:
    """The seeded workload of ``args`` run five ways (:func:`_five_runs`); the JSON report."""
    device = pick_device(args.device, verbose=False)
    requested = args.backend
    if requested is None and not args.quick and device.type != "neuron":
        requested = _MEASURED_BACKEND  # --quick keeps the course's default (eager): seconds, for the tests
    backend = compile_backend(device, requested)  # raises for e.g. --backend inductor on Neuron
    lengths = sample_prompt_lengths(args.prompts, args.shortest, args.longest, args.seed)
    if model is None:
        # eager attention always passes its mask: a full bucket and a padded one share a graph (SDPA: two graphs)
        model = load_model(args.model, device=device, attn_implementation="eager")
    prompts = corpus_prompts(tokenizer or load_tokenizer(args.model), lengths, seed=args.seed)
    buckets = ShapeBuckets(choose_buckets(lengths, args.buckets), args.max_new_tokens)
    buckets.check_model(model)  # the cache must fit max_position_embeddings
    log(f"{len(prompts)} prompts, {len(set(lengths))} distinct lengths from {min(lengths)} to {max(lengths)}; "
        f"buckets {buckets.lengths}, cache length {buckets.cache_length}; backend {backend}")
    runs = _five_runs(model, prompts, buckets, backend, args, log)
    keys = ("prompt_length", "padded_length", "cache_length", "new_graphs", "seconds", "compile_seconds")
    pads = bucket_pad_tokens(lengths, buckets.lengths)
    settings = {k: v for k, v in vars(args).items() if k not in ("model", "device", "threads", "output")}
    return {
        "settings": settings | {"backend": backend, "neff_cache": _neff_cache_state()},
        "device": str(device), "model": model.name_or_path, "versions": _package_versions(),
        "torch_threads": torch.get_num_threads(),
        "workload": {"prompt_lengths": lengths, "distinct_lengths": len(set(lengths)), "buckets": buckets.lengths,
                     "cache_length": buckets.cache_length, "pad_tokens": pads, "prompt_tokens": sum(lengths),
                     "padding_waste": pads / (pads + sum(lengths)),
                     "padding_by_bucket_count": padding_by_bucket_count(lengths, 8)},
        "runs": {name: r.summary() | {"requests_table": [{k: row[k] for k in keys} for row in r.table()]}
                 for name, r in runs.items()},
        "checks": _generate_checks(runs, len(buckets.lengths) + int(args.compile_prefill)),
    }


def _five_runs(model, prompts, buckets, backend: str, args, log=print) -> dict:
    """The workload eager and compiled, unbucketed and bucketed (each compiled one cold), then bucketed again: every
    bucket's graph exists by then, so the last run is all steady state."""
    compiled = dict(backend=backend, compile_prefill=args.compile_prefill, recompile_limit=args.recompile_limit)
    runs = {}
    for name, cold, kwargs in [("eager_unbucketed", True, {"compile": False}),
                               ("eager_bucketed", False, {"compile": False, "buckets": buckets}),
                               ("compiled_unbucketed", True, compiled),
                               ("compiled_bucketed", True, compiled | {"buckets": buckets}),
                               ("compiled_bucketed_steady", False, compiled | {"buckets": buckets})]:
        if cold:
            forget_compiled_graphs(model)
        start = time.perf_counter()
        runs[name] = run_generation_workload(model, prompts, args.max_new_tokens, label=name, **kwargs)
        log(f"  {name}: {runs[name].graphs} graph(s), {time.perf_counter() - start:.1f} s")
    return runs


def _generate_checks(runs: dict, budget: int) -> dict:
    """The report's checks: identical outputs, graphs within the ``budget`` (buckets, prefill), compiled speed."""
    eager_speed = runs["eager_bucketed"].tokens_per_second()
    compiled_speed = runs["compiled_bucketed_steady"].tokens_per_second()
    unbucketed, bucketed = runs["compiled_unbucketed"], runs["compiled_bucketed"]
    return {
        "identical_bucketed_vs_unbucketed_eager": identical_outputs(runs["eager_unbucketed"], runs["eager_bucketed"]),
        "identical_bucketed_vs_unbucketed_compiled": identical_outputs(unbucketed, bucketed),
        "identical_compiled_vs_eager": identical_outputs(runs["eager_unbucketed"], unbucketed),
        "bucketed_graphs": bucketed.graphs, "bucketed_graph_budget": budget,
        "bucketed_graphs_within_budget": bucketed.graphs <= budget,
        "unbucketed_graphs": unbucketed.graphs,
        "unbucketed_graphs_equal_distinct_shapes": unbucketed.graphs == unbucketed.distinct_shapes,
        "steady_tokens_per_second_eager": eager_speed, "steady_tokens_per_second_compiled": compiled_speed,
        "compiled_at_least_as_fast_as_eager": bool(compiled_speed and eager_speed and compiled_speed >= eager_speed),
    }


def _neff_cache_state() -> str:
    """How TorchNeuron's NEFF cache is set for this process: warm by default, or turned off."""
    if os.environ.get(_NEFF_DISABLE_CACHE_VAR, "").lower() in ("1", "true", "yes"):
        return f"off ({_NEFF_DISABLE_CACHE_VAR}=1): every graph compiles cold"
    return f"on, in {os.environ.get(_NEFF_CACHE_VAR, _DEFAULT_NEFF_CACHE)}: graphs compiled before are loaded"


def main_generate(argv: list[str] | None = None) -> int:
    """``python -m trnlab bench generate [options]``: run, print the table, write the JSON report."""
    args = _generate_args(argv)
    report = _run_generate(args, log=lambda text: print(text, file=sys.stderr))
    w = report["workload"]
    _write_report(args, report, "\n".join(
        [format_table(report["runs"], ["graphs", "distinct_shapes", "compile_seconds", "first_request_seconds",
                                       "steady_request_seconds", "steady_tokens_per_second"]),
         f"buckets {w['buckets']}: {w['pad_tokens']} pad tokens ({w['padding_waste']:.1%} of tokens processed)"]
        + [f"{key}: {value}" for key, value in report["checks"].items()]))
    checks = report["checks"]
    if checks["identical_bucketed_vs_unbucketed_eager"] and checks["identical_bucketed_vs_unbucketed_compiled"]:
        return 0
    print("FAILED: bucketing changed generated tokens", file=sys.stderr)
    return 1


#: What the train report's figures mean, written into every report.
_DEFINITIONS = {
    "warm-up": "the first optimizer step; it compiles the training graph (the forward; backends built "
               "on AOTAutograd, such as inductor, also compile its backward; with the eager backend "
               "the backward is ordinary autograd); the optimizer step runs eager",
    "graphs": "graphs dynamo compiled during training (torch._dynamo counters)",
    "compile_seconds": "dynamo's compile time for the forward graphs (the first backward, and a "
                       "backward graph a backend compiles lazily, are in compiling_step_seconds)",
    "real_tokens_per_second": "non-pad tokens per second over steps after warm-up that compiled nothing",
    "padding_waste": "fraction of pad positions in the batches trained on",
}


def _train_args(argv) -> argparse.Namespace:
    """The options of ``python -m trnlab bench train``."""
    args, parser = _args(
        argv, "train", "Graphs, compile time and real tokens/s per data strategy, and the course's targets.",
        "a short run: 4 steps, batch 2, 64 texts, eager backend off Neuron",
        "torch.compile backend (default: the one Transformers picks; --quick: eager off Neuron)",
        {"steps": (16, 4), "batch_size": (4, 2), "texts": (256, 64)},
        ("--strategies", dict(default=",".join(STRATEGIES), help=f"comma-separated, from {', '.join(STRATEGIES)}")),
        ("--steps", dict(type=int, help="optimizer steps per strategy (default 16; quick 4)")),
        ("--batch-size", dict(type=int, help="rows per batch (default 4; quick 2)")),
        ("--length", dict(type=int, default=96, help="max/fixed/block length in tokens (default 96)")),
        ("--texts", dict(type=int, help="documents in the seeded dataset (default 256; quick 64)")),
        ("--learning-rate", dict(type=float, default=2e-3)),
        ("--check", dict(action="store_true", help="exit with status 1 if a target is missed")))
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if unknown := [s for s in args.strategies if s not in STRATEGIES]:
        parser.error(f"unknown strategy {unknown[0]!r}: use {', '.join(STRATEGIES)}")
    return args


def _evaluate_targets(results: dict[str, dict]) -> dict[str, dict]:
    """The benchmark's goals, each ``{"goal", "value", "met"}`` (``met`` is None if not measured)."""
    targets = {f"{name}_one_graph": {
        "goal": "exactly one training graph in total, none compiled after the warm-up step",
        "value": {key: results[name][key] for key in ("graphs", "graphs_after_warmup")},
        "met": results[name]["graphs"] == 1 and results[name]["graphs_after_warmup"] == 0,
    } for name in ("fixed", "packed") if name in results}
    if "packed" in results:
        real, least = 1 - results["packed"]["padding_waste"], 0.95
        targets["packed_real_tokens"] = {"goal": f"at least {least:.0%} real (non-pad) tokens", "value": real,
                                         "met": real >= least}
        compared = {name: results[name].get("real_tokens_per_second")
                    for name in ("dynamic", "fixed", "packed") if name in results}
        measured = {name: value for name, value in compared.items() if value is not None}
        best = max(measured, key=measured.get) if measured else None
        targets["packed_fastest"] = {
            "goal": f"highest steady real tokens/s of {', '.join(compared)}", "value": compared,
            "met": (best == "packed") if "packed" in measured and len(compared) > 1 else None,
        }
    return targets


def _run_strategies(args, device: torch.device, backend: str | None, tokenizer, texts) -> tuple[dict, dict]:
    """Fine-tune the page's way once per strategy of ``args``, each from fresh weights and cold compiles.
    Returns ``(results, settings)``: per strategy the recorder's summary, and the last Trainer's compile settings."""
    results, settings = {}, {}
    with tempfile.TemporaryDirectory(prefix="trnlab-bench-train-") as scratch:
        for strategy in args.strategies:
            torch.manual_seed(args.seed)
            model = load_model(args.model, device=device)
            start = time.perf_counter()
            forget_compiled_graphs()  # cold: no graphs, no inductor FX or AOTAutograd cache (the NEFF cache stays)
            with _recompile_limit(args.recompile_limit), _compat.no_compile_caches():
                limit = getattr(model.config, "max_position_embeddings", None)
                dataset, collator = strategy_dataset(strategy, tokenizer, texts, args.length, max_positions=limit)
                # The page's TrainingArguments(..., bf16=..., torch_compile=True, dataloader_drop_last=True), built the
                # one way trnlab builds them (backend None: theirs to pick); no checkpoints, bar or count of tokens.
                page = _page_arguments(Path(scratch) / strategy, device, max_steps=args.steps,
                                       batch_size=args.batch_size, learning_rate=args.learning_rate,
                                       compile_backend=backend, seed=args.seed, disable_tqdm=True,
                                       include_num_input_tokens_seen="no")
                recorder = TrainingRecorder()
                with _static_shape_compiles():  # dynamic=False on every device, as on Neuron
                    trainer = Trainer(model=model, args=page, train_dataset=dataset,
                                      data_collator=recorder.watch(collator), callbacks=[recorder])
                trainer.remove_callback(PrinterCallback)  # it prints every log line; the recorder keeps them
                trainer.train()
            r = results[strategy] = {**recorder.summary(), "wall_seconds": time.perf_counter() - start,
                                     "losses": recorder.losses, "step_shapes": [list(s.shape) for s in recorder.steps]}
            settings = {"torch_compile_backend": trainer.args.torch_compile_backend,
                        **{f"compile_{k}": v for k, v in compile_settings(trainer).items()},
                        "bf16": trainer.args.bf16, "dataloader_drop_last": trainer.args.dataloader_drop_last}
            if r["recompile_limit_hits"]:
                r["note"] = (f"dynamo hit recompile_limit={args.recompile_limit}: later shapes ran without "
                             "compiling (on Trainium: op by op); raise --recompile-limit")
                print(f"  note: {r['note']}")
            print(f"  {strategy:8s} graphs {r['graphs']} (after warm-up {r['graphs_after_warmup']}), "
                  f"shapes {r['shapes']}, waste {r['padding_waste']:.3f}, "
                  f"real tok/s {r['real_tokens_per_second'] or 0:.0f}, {r['wall_seconds']:.1f} s", flush=True)
            del trainer, model
    return results, settings


def main_train(argv: list[str] | None = None) -> int:
    """``python -m trnlab bench train [options]``: train each strategy, print the table, write the JSON report."""
    args = _train_args(argv)
    device = pick_device(args.device, verbose=False)
    # Transformers' pick unless asked (quick: dynamo's graphs run eagerly, seconds not minutes).
    requested = args.backend or ("eager" if args.quick and device.type != "neuron" else None)
    backend = compile_backend(device, requested) if requested else None
    tokenizer = load_tokenizer(args.model)
    texts = training_texts(args.texts, seed=args.seed)
    print(f"bench train: {model_name(args.model)} on {device}, backend {backend or 'picked by Transformers'}; "
          f"{args.steps} steps x batch {args.batch_size}, length {args.length}, {len(texts)} texts", flush=True)
    results, settings = _run_strategies(args, device, backend, tokenizer, texts)
    targets = _evaluate_targets(results)
    report = {
        "benchmark": "train",
        "config": {"model": model_name(args.model), "device": str(device), "backend_requested": backend,
                   **{k: getattr(args, k) for k in ("steps", "batch_size", "length", "texts", "learning_rate",
                                                     "seed", "quick", "strategies")}},
        "environment": {"versions": _package_versions(), "python": platform.python_version(),
                        "torch_threads": torch.get_num_threads(), "dynamo_recompile_limit": args.recompile_limit,
                        **settings},
        "definitions": _DEFINITIONS, "results": results, "targets": targets,
    }
    status = {True: "met", False: "MISSED", None: "not measured"}
    _write_report(args, report, "\n".join(
        [format_table(results, ["graphs", "graphs_after_warmup", "compile_seconds", "steady_step_seconds",
                                "padding_waste", "real_tokens_per_second", "final_loss"])]
        + [f"target {name}: {status[t['met']]} ({t['goal']}; {t['value']})" for name, t in targets.items()]))
    return 1 if args.check and any(t["met"] is False for t in targets.values()) else 0
