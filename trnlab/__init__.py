"""trnlab: helpers for the course "Hugging Face Transformers on AWS Trainium".
Top-level names (``__all__``) are what a notebook calls, imported on first use; each module lists
its building blocks in its own ``__all__``, and a leading underscore marks a private name (see docs/api.md)."""

from __future__ import annotations

import importlib

__version__ = "0.3.1"

#: Public names, grouped as the course teaches them: ``{group: {name: module}}``.
_GROUPS: dict[str, dict[str, str]] = {
    "Set up and check a machine (notebook 01)": {
        "setup": "device", "run_summary": "device", "record_run": "run_record", "knob": "settings",
        "TrnlabError": "settings",
        "SettingError": "settings", "NotAvailableError": "settings",
        "detect_backend": "device", "pick_device": "device", "resolve_device_map": "device", "resolve_dtype": "device",
        "format_accelerator_memory": "device",
    },
    "Load the model (notebooks 01-05)": {
        "load_model": "models", "load_tokenizer": "models", "load_config": "models", "model_name": "models",
        "parameter_count": "models", "EXAMPLE_PROMPT": "assets.corpus",
    },
    "Generate on an explicit device (notebook 02)": {
        "tokenize_batch": "generation", "show_padding": "generation", "generate_batch": "generation",
        "first_sentence": "generation",
    },
    "Compile, count graphs, bucket shapes (notebook 03)": {
        "compile_backend": "generation", "generation_compile_config": "generation",
        "CompileTracker": "compile_tracking", "forget_compiled_graphs": "compile_tracking",
        "recompile_log": "compile_tracking", "time_generation": "compile_tracking",
        "ShapeBuckets": "generation", "choose_buckets": "generation", "padding_by_bucket_count": "generation",
        "bucketed_generate": "generation", "run_generation_workload": "compile_tracking",
    },
    "Train with static shapes (notebook 04)": {
        "NEW_FACT_PROMPT": "training", "training_texts": "training", "fixed_length_dataset": "training",
        "tokenized_dataset": "training", "packed_dataset": "training", "PaddingCollator": "training",
        "padding_waste": "training", "TrainingRecorder": "training", "LiveLossPlot": "training",
        "StopAtStep": "training", "last_checkpoint": "training",
    },
    "Shard and launch (notebook 05)": {
        "launch": "launcher", "torchrun_command": "launcher", "plan_processes": "launcher",
        "validate_parallel_sizes": "launcher",
    },
    "Plan a real run (notebook 06: the planner itself is `trnlab.planning`, loaded only when used)": {
        "get_instance": "launcher", "PlanError": "settings",
    },
    "Plots and tables": {
        "plot_compile_growth": "plots", "plot_padding_waste": "plots", "plot_strategy_comparison": "plots",
        "plot_mesh": "plots", "plot_losses": "plots", "format_table": "plots",
    },
}

_MODULE_OF = {name: module for group in _GROUPS.values() for name, module in group.items()}

#: What each exported constant is (constants carry no docstring of their own).
_CONSTANTS = {
    "EXAMPLE_PROMPT": "The prompt of the page's example; the course model continues it with a law it learned.",
    "NEW_FACT_PROMPT": "The prompt whose continuation shows what fine-tuning in notebook 04 taught the model.",
}

__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    # Import a public name's module on first use (PEP 562), so `import trnlab` stays light.
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'trnlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trnlab.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
