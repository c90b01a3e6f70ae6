"""trnlab: helpers for the course "Hugging Face Transformers on AWS Trainium".

Each helper is small and named for one idea; the notebooks in ``notebooks/`` call them, and
they work the same in your own notebooks. The code takes the ``neuron`` path whenever a
neuron device is available and runs for real on CUDA or CPU otherwise.

What is exported where (the rule every module follows):

* **Top level** (``trnlab.load_model``, listed in :data:`__all__` and grouped in :data:`GROUPS`
  the way the course teaches): the names a learner calls in their own notebook, one entry
  point per idea, as the notebooks and the README teach them. Siblings (the same job on the
  same kind of thing: ``format_table`` and ``format_steps``, ``padding_waste`` and
  ``real_tokens``) are exported together. Names are imported on first use, so ``import trnlab``
  stays fast.
* **Module level** (``from trnlab.data import batches``): every module lists its public names
  in its own ``__all__``: the top-level ones it defines plus its building blocks, checks and
  constants. The README's API section lists both.
* **Private**: a leading underscore, in no ``__all__``.
* **Deprecated**: in no ``__all__``; a renamed or retired name or keyword still works for one
  release (:data:`DEPRECATED_NAMES`, a module's ``__getattr__``, :mod:`trnlab.deprecation`) and
  warns with a ``FutureWarning`` saying what to write instead.

Each name lives in the module of its concern:

=======================  ==================================================================
module                   concern
=======================  ==================================================================
``settings``             every ``TRNLAB_*`` variable and course default; :func:`knob` for a
                         notebook's parameter cell; environment changes inside a block
``deprecation``          renamed names and keywords, for one release
``compat``               every touch of a library's private internals
``device``               neuron > cuda > cpu, device maps, dtypes, accelerator memory
``doctor``               ``python -m trnlab doctor``: the machine report
``notebook``             the setup call at the top of a notebook, the summary at its end
``simulate``             a simulated Neuron device: what the libraries decide on a trn2
``assets``               the bundled tiny Qwen3, its corpus and example prompt, shipped configs
``models``               loading the course model and tokenizer (``TRNLAB_MODEL``)
``generation``           prompts in one form, generation on an explicit device
``buckets``              shape bucketing for generation
``compile_tracking``     counting graphs, the compile backend, forgetting compiled graphs
``data``                 training data with static shapes: fixed length, packing, buckets
``training``             what surrounds ``TrainingArguments`` and ``Trainer``
``callbacks``            ``Trainer`` callbacks: the step recorder, the live loss plot, a stop
``instances``            the Trainium instance table
``mesh``                 does a ``DistributedConfig`` mesh fit the processes and the model
``sharding``             a model as the planner reads it: config, parameters, each rank's piece
``memory_model``         bytes per NeuronCore, one function per component
``planning``             the (tp, fsdp) mesh that fits an instance, and why
``distributed``          the sharded model of claim 10, inside and outside a rank
``rank_cores``           inside each torchrun rank: its own NeuronCore, then the script
``launcher``             building ``torchrun`` commands, multi-node commands, Slurm
``runner``               starting, streaming and stopping the launched processes
``cli``                  ``python -m trnlab launch`` / ``plan``: argparse and ``main`` only
``plots``                every chart
``tables``               every text table
``widgets``              interactive controls (ipywidgets) for the notebooks
``bench.workload``       the generation workload harness: a stream of prompts, graphs per request
``bench.timing``         first call against steady state, and whether two timings differ
``bench.generate``,      ``python -m trnlab bench generate`` / ``bench train``
``bench.train``
``scripts``              scripts that ``trnlab.launch`` runs under torchrun
``pytest_plugin``        the course's nbval rules for your own CI
``launch``               deprecated: the old name of ``launcher`` (``trnlab.launch`` is the function)
=======================  ==================================================================
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: Public names, grouped as the course teaches them: ``{group: {name: module}}``.
GROUPS: dict[str, dict[str, str]] = {
    "Set up and check a machine (notebook 01)": {
        "setup": "notebook", "run_summary": "notebook", "read_settings": "settings", "Settings": "settings", "SettingError": "settings",
        "knob": "settings",
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

#: Deprecated names that still resolve for one release, not in ``__all__``: ``{old name: module}``.
#: Each warns (``FutureWarning``) when used, saying what to write instead.
DEPRECATED_NAMES: dict[str, str] = {
    "bucket_padding_tokens": "buckets", "waste_by_bucket_count": "buckets", "reset_compile_state": "compile_tracking",
    "fresh_neff_cache": "compile_tracking", "training_arguments": "training", "make_trainer": "training",
    "train_strategy": "training",
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
