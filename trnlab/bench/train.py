"""``python -m trnlab bench train``: graphs, compile time and real tokens/s per data strategy.
Fine-tunes the course model once per strategy from the same weights and cold compiles, and writes one JSON file:
per-strategy recorder summaries and the course's targets, each met or not. ``--quick`` is a seconds-long run."""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from trnlab import callbacks, compat, data, tables, training
from trnlab.compile_tracking import compile_backend, forget_compiled_graphs, recompile_limit as raised_recompile_limit
from trnlab.device import package_versions, pick_device
from trnlab.models import load_model, load_tokenizer, model_name

#: Strategies the targets compare (bucketing is measured too, as the third static-ish option).
TARGET_STRATEGIES = ("dynamic", "fixed", "packed")
#: The fraction of real (non-pad) tokens packing must reach to meet its target.
MIN_REAL_TOKEN_FRACTION = 0.95
#: Where the JSON report goes unless ``--output`` says otherwise.
DEFAULT_OUTPUT = Path("runs") / "bench_train.json"

__all__ = [
    "DEFAULT_OUTPUT", "DEFINITIONS", "MIN_REAL_TOKEN_FRACTION", "TARGET_STRATEGIES", "build_report", "cold_compiles",
    "evaluate_targets", "main", "parse_args", "run_strategies", "train_one",
]


def parse_args(argv: list[str] | None):
    """The options of ``python -m trnlab bench train``, parsed from ``argv``."""
    parser = argparse.ArgumentParser(prog="python -m trnlab bench train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None,
                        help="model folder or hub id (default: $TRNLAB_MODEL or the bundled tiny Qwen3)")
    parser.add_argument("--device", default=None,
                        help="auto (neuron > cuda > cpu), neuron, cuda or cpu (default: $TRNLAB_DEVICE or auto)")
    parser.add_argument("--backend", default=None,
                        help="torch.compile backend (default: the one Transformers picks; --quick: eager off Neuron)")
    parser.add_argument("--strategies", default=",".join(data.STRATEGIES),
                        help=f"comma-separated, from {', '.join(data.STRATEGIES)}")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per strategy (default 16; quick 4)")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (default 4; quick 2)")
    parser.add_argument("--length", type=int, default=96, help="max/fixed/block length in tokens (default 96)")
    parser.add_argument("--texts", type=int, default=None, help="documents in the seeded dataset (default 256; quick 64)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recompile-limit", type=int, default=1024,
                        help="dynamo's recompile limit during the runs (default 1024, raised from 8 so every "
                             "shape of dynamic padding is compiled and counted, as Neuron would compile it)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 is faster for the tiny model "
                             "on a busy machine)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"JSON file (default {DEFAULT_OUTPUT})")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 4 steps, batch 2, 64 texts, eager backend off Neuron")
    parser.add_argument("--check", action="store_true", help="exit with status 1 if a target is missed")
    args = parser.parse_args(argv)
    # --quick changes the defaults only: an explicit --steps, --batch-size or --texts wins.
    defaults = {"steps": (16, 4), "batch_size": (4, 2), "texts": (256, 64)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s not in data.STRATEGIES]
    if unknown:
        parser.error(f"unknown strategy {unknown[0]!r}: use {', '.join(data.STRATEGIES)}")
    return args


@contextlib.contextmanager
def cold_compiles(recompile_limit: int):
    """Compile every graph from scratch: graphs forgotten, inductor's FX and AOTAutograd caches off.
    Dynamo's recompile limit is set to ``recompile_limit``; on Trainium the on-disk NEFF cache stays warm."""
    forget_compiled_graphs()
    with raised_recompile_limit(recompile_limit), compat.no_compile_caches():
        yield


def train_one(strategy: str, model, tokenizer, texts, output_dir, device: torch.device, *, length: int,
              steps: int, batch_size: int, learning_rate: float, backend: str | None, seed: int):
    """Fine-tune ``model`` on ``texts`` shaped by ``strategy`` the page's way; ``(trainer, recorder)``.
    ``backend=None`` leaves the choice to ``TrainingArguments``; the Trainer compiles static shapes on every device."""
    from transformers import PrinterCallback, Trainer

    max_positions = getattr(model.config, "max_position_embeddings", None)
    dataset, collator = data.strategy_dataset(strategy, tokenizer, texts, length, max_positions=max_positions)
    # The page's TrainingArguments(..., bf16=..., torch_compile=True, dataloader_drop_last=True), built
    # the one way trnlab builds them; no checkpoints, no progress bar, and no count of tokens seen.
    args = training.page_arguments(output_dir, device, max_steps=steps, batch_size=batch_size,
                                   learning_rate=learning_rate, compile_backend=backend, seed=seed,
                                   disable_tqdm=True, include_num_input_tokens_seen="no")
    recorder = callbacks.TrainingRecorder()
    with training.static_shape_compiles():
        trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=recorder.watch(collator),
                          callbacks=[recorder])
    trainer.remove_callback(PrinterCallback)  # it prints every log line; the recorder keeps them
    trainer.train()
    return trainer, recorder


def evaluate_targets(results: dict[str, dict]) -> dict[str, dict]:
    """The benchmark's goals, each ``{"goal", "value", "met"}`` (``met`` is None if not measured)."""
    targets = {}
    for name in ("fixed", "packed"):
        if name in results:
            r = results[name]
            targets[f"{name}_one_graph"] = {
                "goal": "exactly one training graph in total, none compiled after the warm-up step",
                "value": {"graphs": r["graphs"], "graphs_after_warmup": r["graphs_after_warmup"]},
                "met": r["graphs"] == 1 and r["graphs_after_warmup"] == 0,
            }
    if "packed" in results:
        real = 1 - results["packed"]["padding_waste"]
        targets["packed_real_tokens"] = {"goal": f"at least {MIN_REAL_TOKEN_FRACTION:.0%} real (non-pad) tokens",
                                         "value": real, "met": real >= MIN_REAL_TOKEN_FRACTION}
        compared = {name: results[name].get("real_tokens_per_second") for name in TARGET_STRATEGIES if name in results}
        measured = {name: value for name, value in compared.items() if value is not None}
        best = max(measured, key=measured.get) if measured else None
        targets["packed_fastest"] = {
            "goal": f"highest steady real tokens/s of {', '.join(compared)}",
            "value": compared,
            "met": (best == "packed") if "packed" in measured and len(compared) > 1 else None,
        }
    return targets


#: What the report's figures mean, written into every report.
DEFINITIONS = {
    "warm-up": "the first optimizer step; it compiles the training graph (the forward; backends built "
               "on AOTAutograd, such as inductor, also compile its backward; with the eager backend "
               "the backward is ordinary autograd); the optimizer step runs eager",
    "graphs": "graphs dynamo compiled during training (torch._dynamo counters)",
    "compile_seconds": "dynamo's compile time for the forward graphs (the first backward, and a "
                       "backward graph a backend compiles lazily, are in compiling_step_seconds)",
    "real_tokens_per_second": "non-pad tokens per second over steps after warm-up that compiled nothing",
    "padding_waste": "fraction of pad positions in the batches trained on",
}


def run_strategies(args, device: torch.device, backend: str | None, tokenizer, texts) -> tuple[dict, dict]:
    """Train once per strategy of ``args``, each from fresh weights and cold compiles.
    Returns ``(results, settings)``: per strategy the recorder's summary, and the last Trainer's compile settings."""
    results, settings = {}, {}
    with tempfile.TemporaryDirectory(prefix="trnlab-bench-train-") as scratch:
        for strategy in args.strategies:
            torch.manual_seed(args.seed)
            model = load_model(args.model, device=device)
            start = time.perf_counter()
            with cold_compiles(args.recompile_limit):
                trainer, recorder = train_one(
                    strategy, model, tokenizer, texts, Path(scratch) / strategy, device, length=args.length,
                    steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
                    backend=backend, seed=args.seed)
            results[strategy] = {**recorder.summary(), "wall_seconds": time.perf_counter() - start,
                                 "losses": recorder.losses, "step_shapes": [list(s.shape) for s in recorder.steps]}
            settings = {"torch_compile_backend": trainer.args.torch_compile_backend,
                        **{f"compile_{k}": v for k, v in training.compile_settings(trainer).items()},
                        "bf16": trainer.args.bf16, "dataloader_drop_last": trainer.args.dataloader_drop_last}
            _print_strategy(strategy, results[strategy], args.recompile_limit)
            del trainer, model
    return results, settings


def _print_strategy(strategy: str, r: dict, recompile_limit: int) -> None:
    # One line per strategy as it finishes (and a note when dynamo stopped compiling).
    if r["recompile_limit_hits"]:
        r["note"] = (f"dynamo hit recompile_limit={recompile_limit}: later shapes ran without "
                     "compiling (on Trainium: op by op); raise --recompile-limit")
        print(f"  note: {r['note']}")
    print(f"  {strategy:8s} graphs {r['graphs']} (after warm-up {r['graphs_after_warmup']}), "
          f"shapes {r['shapes']}, waste {r['padding_waste']:.3f}, "
          f"real tok/s {r['real_tokens_per_second'] or 0:.0f}, {r['wall_seconds']:.1f} s", flush=True)


def build_report(args, device: torch.device, backend: str | None, results: dict, settings: dict) -> dict:
    """The JSON report: configuration, environment, definitions, results and targets."""
    return {
        "benchmark": "train",
        "config": {"model": model_name(args.model), "device": str(device), "backend_requested": backend,
                   "steps": args.steps, "batch_size": args.batch_size, "length": args.length,
                   "texts": args.texts, "learning_rate": args.learning_rate, "seed": args.seed,
                   "quick": args.quick, "strategies": args.strategies},
        "environment": {"versions": package_versions(), "python": platform.python_version(),
                        "torch_threads": torch.get_num_threads(),
                        "dynamo_recompile_limit": args.recompile_limit, **settings},
        "definitions": DEFINITIONS,
        "results": results,
        "targets": evaluate_targets(results),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m trnlab bench train [options]``: train each strategy, print the table, write the JSON report."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device, verbose=False)
    # Transformers' pick unless asked (quick: dynamo's graphs run eagerly, seconds not minutes).
    requested = args.backend or ("eager" if args.quick and device.type != "neuron" else None)
    backend = compile_backend(device, requested) if requested else None
    tokenizer = load_tokenizer(args.model)
    texts = data.training_texts(args.texts, seed=args.seed)
    print(f"bench train: {model_name(args.model)} on {device}, backend {backend or 'picked by Transformers'}; "
          f"{args.steps} steps x batch {args.batch_size}, length {args.length}, {len(texts)} texts", flush=True)

    results, settings = run_strategies(args, device, backend, tokenizer, texts)
    report = build_report(args, device, backend, results, settings)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(tables.format_table(results, ["graphs", "graphs_after_warmup", "compile_seconds", "steady_step_seconds",
                                          "padding_waste", "real_tokens_per_second", "final_loss"]))
    targets = report["targets"]
    for name, target in targets.items():
        status = {True: "met", False: "MISSED", None: "not measured"}[target["met"]]
        print(f"target {name}: {status} ({target['goal']}; {target['value']})")
    print(f"wrote {args.output}")
    missed = any(t["met"] is False for t in targets.values())
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
