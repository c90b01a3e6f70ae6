"""trnlab: helpers for the course "Hugging Face Transformers on AWS Trainium".

Each helper is small and named for one idea; the notebooks in ``notebooks/`` call them, and
they work the same in your own notebooks. The code takes the ``neuron`` path whenever a
neuron device is available and runs for real on CUDA or CPU otherwise.

Everything public is importable from ``trnlab`` itself (``trnlab.load_model``,
``trnlab.launch``, ...) and listed in :data:`__all__`, grouped the way the course teaches.
Names are imported on first use, so ``import trnlab`` stays fast. Each lives in the module
of its concern:

=====================  ===================================================================
module                 concern
=====================  ===================================================================
``settings``           ``TRNLAB_*`` variables, read in one place
``device``             neuron > cuda > cpu, device maps, dtypes, the doctor's report
``simulate``           a simulated Neuron device: what the libraries decide on a trn2
``models``             loading the course model and tokenizer (``TRNLAB_MODEL``)
``generation``         prompts in one form, generation on an explicit device
``buckets``            shape bucketing for generation
``compile_tracking``   counting graphs, the compile backend, forgetting compiled graphs
``data``               training data with static shapes: fixed length, packing, buckets
``training``           ``Trainer`` the page's way, with a recorder and a live plot
``distributed``        the sharded model of claim 10, inside and outside a rank
``launcher``           ``torchrun`` from a notebook, multi-node commands, Slurm
``rank_cores``         inside each torchrun rank: its own NeuronCore, then the script
``planning``           memory per NeuronCore and the mesh that fits
``plots``              every chart and text table
``widgets``            interactive controls (ipywidgets) for the notebooks
``bench``              workload harness and the ``python -m trnlab bench`` commands
``compat``             every touch of a library's private internals
``pytest_plugin``      the course's nbval rules for your own CI
=====================  ===================================================================
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: Public names, grouped as the course teaches them: ``{group: {name: module}}``.
GROUPS: dict[str, dict[str, str]] = {
    "Set up and check a machine (notebook 01)": {
        "setup": "notebook", "run_summary": "notebook", "read_settings": "settings", "Settings": "settings", "SettingError": "settings",
        "show_report": "doctor", "device_report": "device", "detect_backend": "device",
        "pick_device": "device", "resolve_device_map": "device", "resolve_dtype": "device",
        "DeviceNotAvailableError": "device", "accelerator_memory": "device", "format_accelerator_memory": "device",
        "simulate_neuron": "simulate", "simulated_decisions": "simulate",
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
        "CompileTracker": "compile_tracking", "forget_compiled_graphs": "compile_tracking", "fresh_neff_cache": "compile_tracking",
        "graphs_compiled": "compile_tracking", "recompile_log": "compile_tracking",
        "cold_neff_cache_env": "compile_tracking",
        "ShapeBuckets": "buckets", "PromptTooLongError": "buckets", "bucket_for": "buckets",
        "bucket_pad_tokens": "buckets", "choose_buckets": "buckets", "padding_by_bucket_count": "buckets",
        "bucketed_generate": "generation",
        "sample_prompt_lengths": "bench", "corpus_prompts": "bench", "run_generation_workload": "bench",
        "time_generation": "bench", "timings_differ": "bench", "identical_outputs": "bench", "bucket_slider": "widgets",
    },
    "Train with static shapes (notebook 04)": {
        "NEW_FACT_PROMPT": "data", "training_texts": "data", "fixed_length_dataset": "data",
        "tokenized_dataset": "data", "packed_dataset": "data", "PaddingCollator": "data",
        "strategy_dataset": "data", "padding_waste": "data", "label_view": "data",
        "training_arguments": "training", "make_trainer": "training", "train_strategy": "training",
        "TrainingRecorder": "training", "LiveLossPlot": "training", "StopAtStep": "training",
        "last_checkpoint": "training",
    },
    "Shard and launch (notebook 05)": {
        "launch": "launcher", "launch_loopback_nodes": "launcher", "torchrun_command": "launcher",
        "multinode_commands": "launcher", "slurm_script": "launcher", "plan_processes": "launcher",
        "validate_parallel_sizes": "launcher", "rank_neuron_cores": "launcher", "LaunchConfigError": "launcher",
        "LaunchResult": "launcher",
        "pad_vocabulary": "distributed", "read_run": "distributed",
    },
    "Plan a real run (notebook 06)": {
        "plan_memory": "planning", "plan_mesh": "planning",
    },
    "Plots and tables": {
        "plot_compile_growth": "plots", "plot_padding_waste": "plots", "plot_buckets": "plots",
        "plot_generation_comparison": "plots",
        "plot_strategy_comparison": "plots", "format_table": "plots", "plot_mesh": "plots",
        "plot_losses": "plots", "memory_table": "plots", "placement_table": "plots",
    },
}

_MODULE_OF = {name: module for group in GROUPS.values() for name, module in group.items()}

#: What each exported constant is (constants carry no docstring of their own).
CONSTANTS = {
    "EXAMPLE_PROMPT": "The prompt of the page's example; the course model continues it with a law it learned.",
    "NEW_FACT_PROMPT": "The prompt whose continuation shows what fine-tuning in notebook 04 taught the model.",
}

__all__ = list(_MODULE_OF)

#: Renamed names that still resolve for one release, not in ``__all__``: ``{old name: module}``.
#: Each warns (``FutureWarning``) with its new name when used.
DEPRECATED_NAMES: dict[str, str] = {
    "bucket_padding_tokens": "buckets", "waste_by_bucket_count": "buckets", "reset_compile_state": "compile_tracking",
}


def __getattr__(name: str):
    # Import a public name's module on first use (PEP 562), so `import trnlab` stays light.
    module = _MODULE_OF.get(name) or DEPRECATED_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'trnlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trnlab.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
