"""trnlab: helpers for the course "Hugging Face Transformers on AWS Trainium".
Top-level names (grouped in :data:`GROUPS`) are what a notebook calls, imported on first use; each module lists
its building blocks in its own ``__all__``, and a leading underscore marks a private name (see docs/api.md)."""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

#: Public names, grouped as the course teaches them: ``{group: {name: module}}``.
GROUPS: dict[str, dict[str, str]] = {
    "Set up and check a machine (notebook 01)": {
        "setup": "notebook", "run_summary": "notebook", "read_settings": "settings", "Settings": "settings", "SettingError": "settings",
        "knob": "settings",
        "show_report": "doctor", "device_report": "device", "detect_backend": "device",
        "pick_device": "device", "resolve_device_map": "device", "resolve_dtype": "device",
        "DeviceNotAvailableError": "device", "accelerator_memory": "device", "format_accelerator_memory": "device",
    },
    "Load the model (notebooks 01-05)": {
        "load_model": "models", "load_tokenizer": "models", "load_config": "models", "model_name": "models",
        "parameter_count": "models", "ModelNotAvailableError": "models", "EXAMPLE_PROMPT": "assets",
    },
    "Generate on an explicit device (notebook 02)": {
        "prompt_token_ids": "generation", "tokenize_batch": "generation", "show_padding": "generation",
        "generate_batch": "generation", "first_sentence": "generation", "record_forward_inputs": "generation",
        "format_forward_calls": "generation", "moved_to_model_device": "generation",
    },
    "Compile, count graphs, bucket shapes (notebook 03)": {
        "compile_backend": "compile_tracking", "generation_compile_config": "compile_tracking",
        "CompileTracker": "compile_tracking", "forget_compiled_graphs": "compile_tracking",
        "graphs_compiled": "compile_tracking", "compile_seconds": "compile_tracking",
        "recompile_limit_hits": "compile_tracking", "recompile_log": "compile_tracking",
        "cold_neff_cache_env": "compile_tracking",
        "ShapeBuckets": "buckets", "PromptTooLongError": "buckets", "bucket_for": "buckets",
        "bucket_pad_tokens": "buckets", "choose_buckets": "buckets", "padding_by_bucket_count": "buckets",
        "bucketed_generate": "generation",
        "sample_prompt_lengths": "bench.workload", "corpus_prompts": "bench.workload",
        "run_generation_workload": "bench.workload", "time_generation": "bench.timing",
        "timings_differ": "bench.timing", "identical_outputs": "bench.workload", "bucket_slider": "widgets",
    },
    "Train with static shapes (notebook 04)": {
        "NEW_FACT_PROMPT": "data", "training_texts": "data", "fixed_length_dataset": "data",
        "tokenized_dataset": "data", "packed_dataset": "data", "PaddingCollator": "data",
        "strategy_dataset": "data", "padding_waste": "data", "real_tokens": "data", "label_view": "data",
        "TrainingRecorder": "callbacks", "LiveLossPlot": "callbacks", "StopAtStep": "callbacks",
        "last_checkpoint": "training",
    },
    "Shard and launch (notebook 05)": {
        "launch": "launcher", "launch_loopback_nodes": "launcher", "torchrun_command": "launcher",
        "multinode_commands": "launcher", "slurm_script": "launcher", "plan_processes": "launcher",
        "validate_parallel_sizes": "mesh", "rank_neuron_cores": "rank_cores", "LaunchConfigError": "mesh",
        "LaunchResult": "runner",
        "pad_vocabulary": "distributed", "read_run": "distributed",
    },
    "Plan a real run (notebook 06)": {
        "plan_memory": "memory_model", "recompute_fraction": "memory_model", "plan_mesh": "planning",
        "format_plan": "tables", "plot_memory_plan": "plots", "get_instance": "instances", "PlanError": "instances",
    },
    "Plots and tables": {
        "plot_compile_growth": "plots", "plot_padding_waste": "plots", "plot_buckets": "plots",
        "plot_generation_comparison": "plots",
        "plot_strategy_comparison": "plots", "format_table": "tables", "format_steps": "tables", "plot_mesh": "plots",
        "plot_losses": "plots", "memory_table": "tables", "placement_table": "tables",
    },
}

_MODULE_OF = {name: module for group in GROUPS.values() for name, module in group.items()}

#: What each exported constant is (constants carry no docstring of their own).
CONSTANTS = {
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
