"""``python -m trnlab bench generate``: compiled generation with and without shape bucketing.
A seeded workload runs four ways (eager and compiled, unbucketed and bucketed, then a steady-state pass); writes JSON,
prints a table and exits 1 when bucketing changed an answer. Cold NEFF cache: see :func:`trnlab.cold_neff_cache_env`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from trnlab import bench, buckets as bk
from trnlab.compile_tracking import NEFF_DISABLE_CACHE_VAR, compile_backend, forget_compiled_graphs
from trnlab.device import DEFAULT_NEFF_CACHE, NEFF_CACHE_VAR, package_versions, pick_device
from trnlab.models import load_model, load_tokenizer

#: Where the JSON report goes unless ``--output`` says otherwise.
DEFAULT_OUTPUT = Path("runs") / "bench_generate.json"

__all__ = [
    "DEFAULT_OUTPUT", "MEASURED_BACKEND", "build_parser", "build_report", "build_workload", "format_report", "main",
    "neff_cache_state", "run_benchmark", "run_checks", "run_four_ways",
]
#: What the full benchmark compiles with off Neuron: inductor generates real kernels, so the
#: steady-state speed-up it measures is real (the course's default, eager, only counts graphs).
MEASURED_BACKEND = "inductor"


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m trnlab bench generate``."""
    parser = argparse.ArgumentParser(
        prog="python -m trnlab bench generate",
        description="Graphs compiled, compile time and throughput of static-cache generation, "
                    "with and without shape bucketing, on a seeded workload.")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny workload (8 prompts of 4-24 tokens, 4 new tokens, backend 'eager') for tests")
    parser.add_argument("--prompts", type=int, help="number of requests (default 64; quick 8)")
    parser.add_argument("--shortest", type=int, help="shortest prompt in tokens (default 4)")
    parser.add_argument("--longest", type=int, help="longest prompt in tokens (default 200; quick 24)")
    parser.add_argument("--max-new-tokens", type=int, help="tokens generated per request (default 16; quick 4)")
    parser.add_argument("--buckets", type=int, help="number of bucket lengths, the graph budget (default 4; quick 2)")
    parser.add_argument("--backend", help=f"torch.compile backend (default: {MEASURED_BACKEND} off Neuron, "
                                          "neuron on Neuron; quick: trnlab.compile_backend's default, eager off "
                                          "Neuron). On Neuron any other backend is an error")
    parser.add_argument("--compile-prefill", action="store_true",
                        help="compile the prefill too (generate's prefill_chunk_size path): one more graph per "
                             "prompt shape, as Neuron compiles every new shape")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt lengths and texts")
    parser.add_argument("--model", help="model name or folder (default: $TRNLAB_MODEL or the bundled tiny Qwen3)")
    parser.add_argument("--device", default=None,
                        help="auto (neuron > cuda > cpu), neuron, cuda or cpu (default: $TRNLAB_DEVICE or auto)")
    parser.add_argument("--recompile-limit", type=int, default=1024,
                        help="dynamo's recompile limit during the runs, raised so every shape is counted")
    parser.add_argument("--threads", type=int,
                        help="torch CPU threads (default: torch's choice); 1 is steadier on a busy machine")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"JSON file (default {DEFAULT_OUTPUT})")
    return parser


def _settings(args) -> dict:
    quick = args.quick
    pick = lambda value, full, small: value if value is not None else (small if quick else full)  # noqa: E731
    return {"prompts": pick(args.prompts, 64, 8), "shortest": pick(args.shortest, 4, 4),
            "longest": pick(args.longest, 200, 24), "max_new_tokens": pick(args.max_new_tokens, 16, 4),
            "buckets": pick(args.buckets, 4, 2), "backend": args.backend,
            "compile_prefill": args.compile_prefill, "seed": args.seed, "quick": quick,
            "recompile_limit": args.recompile_limit}


def run_benchmark(settings: dict, model=None, tokenizer=None, device=None, model_name=None,
                  log=print) -> dict:
    """Run the four generations of the module docstring and return the report as a dict."""
    device = pick_device(device, verbose=False) if not isinstance(device, torch.device) else device
    if model is None:
        # Eager attention always passes its mask, so an exactly full bucket compiles the same
        # graph as a padded one (SDPA drops the mask for unpadded prompts: a second graph).
        model = load_model(model_name, device=device, attn_implementation="eager")
    tokenizer = tokenizer or load_tokenizer(model_name)
    requested = settings["backend"]
    if requested is None and not settings["quick"] and device.type != "neuron":
        requested = MEASURED_BACKEND  # --quick keeps the course's default (eager): seconds, for the tests
    backend = compile_backend(device, requested)  # raises for e.g. --backend inductor on Neuron
    lengths, prompts, buckets = build_workload(settings, model, tokenizer)
    log(f"{len(prompts)} prompts, {len(set(lengths))} distinct lengths from {min(lengths)} to {max(lengths)}; "
        f"buckets {buckets.lengths}, cache length {buckets.cache_length}; backend {backend}")
    runs = run_four_ways(model, prompts, buckets, backend, settings, log)
    return build_report(settings, backend, device, model, lengths, buckets, runs)


def build_workload(settings: dict, model, tokenizer):
    """``(lengths, prompts, buckets)``: the seeded prompts and the buckets chosen for them."""
    new = settings["max_new_tokens"]
    max_positions = model.config.max_position_embeddings
    lengths = bench.sample_prompt_lengths(settings["prompts"], settings["shortest"], settings["longest"],
                                          settings["seed"])
    prompts = bench.corpus_prompts(tokenizer, lengths, seed=settings["seed"])
    buckets = bk.ShapeBuckets(bk.choose_buckets(lengths, settings["buckets"], max_positions=max_positions - new), new)
    buckets.check_model(model)
    return lengths, prompts, buckets


def run_four_ways(model, prompts, buckets, backend: str, settings: dict, log=print) -> dict:
    """The workload eager and compiled, unbucketed and bucketed, then bucketed again (steady state)."""
    new = settings["max_new_tokens"]
    common = dict(compile_prefill=settings["compile_prefill"], recompile_limit=settings["recompile_limit"])
    runs = {}

    def run(name, **kwargs):
        start = time.perf_counter()
        runs[name] = bench.run_generation_workload(model, prompts, new, label=name, **kwargs)
        log(f"  {name}: {runs[name].graphs} graph(s), {time.perf_counter() - start:.1f} s")

    forget_compiled_graphs(model)
    run("eager_unbucketed", compile=False)
    run("eager_bucketed", compile=False, buckets=buckets)
    forget_compiled_graphs(model)
    run("compiled_unbucketed", backend=backend, **common)
    forget_compiled_graphs(model)
    run("compiled_bucketed", backend=backend, buckets=buckets, **common)
    # Every bucket's graph exists now: a second pass over the same prompts is all steady state.
    run("compiled_bucketed_steady", backend=backend, buckets=buckets, **common)
    return runs


def run_checks(runs: dict, buckets, compile_prefill: bool) -> dict:
    """The report's checks: identical outputs, graphs within the bucket budget, compiled speed."""
    eager_speed = runs["eager_bucketed"].tokens_per_second(steady_only=False)
    compiled_speed = runs["compiled_bucketed_steady"].tokens_per_second()
    graph_budget = len(buckets.lengths) + (1 if compile_prefill else 0)
    return {
        "identical_bucketed_vs_unbucketed_eager": bench.identical_outputs(runs["eager_unbucketed"], runs["eager_bucketed"]),
        "identical_bucketed_vs_unbucketed_compiled": bench.identical_outputs(runs["compiled_unbucketed"],
                                                                           runs["compiled_bucketed"]),
        "identical_compiled_vs_eager": bench.identical_outputs(runs["eager_unbucketed"], runs["compiled_unbucketed"]),
        "bucketed_graphs": runs["compiled_bucketed"].graphs,
        "bucketed_graph_budget": graph_budget,
        "bucketed_graphs_within_budget": runs["compiled_bucketed"].graphs <= graph_budget,
        "unbucketed_graphs": runs["compiled_unbucketed"].graphs,
        "unbucketed_graphs_equal_distinct_shapes":
            runs["compiled_unbucketed"].graphs == runs["compiled_unbucketed"].distinct_shapes,
        "steady_tokens_per_second_eager": eager_speed,
        "steady_tokens_per_second_compiled": compiled_speed,
        "compiled_at_least_as_fast_as_eager": bool(compiled_speed and eager_speed and compiled_speed >= eager_speed),
    }


def build_report(settings: dict, backend: str, device, model, lengths, buckets, runs: dict) -> dict:
    """The JSON report: settings, machine, workload, each run's summary and per-request table, checks."""
    summaries = {name: result.summary() for name, result in runs.items()}
    for name, result in runs.items():
        summaries[name]["requests_table"] = [
            {key: row[key] for key in ("prompt_length", "padded_length", "cache_length", "new_graphs",
                                       "seconds", "compile_seconds")} for row in result.table()]
    pad_tokens = bk.bucket_pad_tokens(lengths, buckets.lengths)
    return {
        "settings": settings | {"backend": backend, "neff_cache": neff_cache_state()},
        "device": str(device), "model": model.name_or_path, "versions": package_versions(),
        "torch_threads": torch.get_num_threads(),
        "workload": {"prompt_lengths": lengths, "distinct_lengths": len(set(lengths)),
                     "buckets": list(buckets.lengths), "cache_length": buckets.cache_length,
                     "pad_tokens": pad_tokens, "prompt_tokens": sum(lengths),
                     "padding_waste": pad_tokens / (pad_tokens + sum(lengths)),
                     "padding_by_bucket_count": [r | {"buckets": list(r["buckets"])}
                                                 for r in bk.padding_by_bucket_count(lengths, 8)]},
        "runs": summaries,
        "checks": run_checks(runs, buckets, settings["compile_prefill"]),
    }


def neff_cache_state() -> str:
    """How TorchNeuron's NEFF cache is set for this process: warm by default, or turned off."""
    import os

    if os.environ.get(NEFF_DISABLE_CACHE_VAR, "").lower() in ("1", "true", "yes"):
        return f"off ({NEFF_DISABLE_CACHE_VAR}=1): every graph compiles cold"
    return f"on, in {os.environ.get(NEFF_CACHE_VAR, DEFAULT_NEFF_CACHE)}: graphs compiled before are loaded"


def format_report(report: dict) -> str:
    """The report as a short table for the terminal."""
    lines = [f"{'run':26} {'graphs':>6} {'shapes':>6} {'compile s':>9} {'first s':>8} {'steady s':>8} {'tok/s':>7}"]
    for name, r in report["runs"].items():
        steady = r["steady_request_seconds"]
        speed = r["steady_tokens_per_second"]
        lines.append(f"{name:26} {r['graphs']:6d} {r['distinct_shapes'] if 'compiled' in name else '-':>6} "
                     f"{r['compile_seconds']:9.1f} {r['first_request_seconds']:8.3f} "
                     f"{steady if steady is None else round(steady, 3)!s:>8} "
                     f"{speed if speed is None else round(speed, 1)!s:>7}")
    w = report["workload"]
    lines.append(f"buckets {w['buckets']}: {w['pad_tokens']} pad tokens "
                 f"({100 * w['padding_waste']:.1f}% of tokens processed)")
    lines += [f"{key}: {value}" for key, value in report["checks"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m trnlab bench generate [options]``: run, print the table, write the JSON report."""
    args = build_parser().parse_args(argv)
    settings = _settings(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run_benchmark(settings, device=args.device, model_name=args.model,
                           log=lambda text: print(text, file=sys.stderr))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(format_report(report))
    print(f"wrote {args.output}")
    checks = report["checks"]
    same = checks["identical_bucketed_vs_unbucketed_eager"] and checks["identical_bucketed_vs_unbucketed_compiled"]
    if not same:
        print("FAILED: bucketing changed generated tokens", file=sys.stderr)
    return 0 if same else 1
