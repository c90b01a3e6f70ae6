"""CHANGELOG.md's table: every public name of trnlab 0.1.0 still resolves or is listed, and every target resolves.
Read from the source with ``ast`` (no import of trnlab, torch or Transformers), so the test takes a fraction of a second."""

from __future__ import annotations

import ast
import functools
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
HEADER = "| 0.1.0 | write instead in 0.2.0 |"

#: trnlab 0.1.0's public dotted names (commit 1ff134d): its modules, ``trnlab.__all__`` and ``DEPRECATED_NAMES``,
#: every module's ``__all__``, and the deprecated names its modules still served (moved names, deprecated functions).
#: Frozen: generated once from ``git show 1ff134d:trnlab/...`` and never to be edited.
OLD_PUBLIC = (
    "trnlab", "trnlab.CONSTANTS", "trnlab.CompileTracker", "trnlab.DEPRECATED_NAMES",
    "trnlab.DeviceNotAvailableError", "trnlab.EXAMPLE_PROMPT", "trnlab.GROUPS", "trnlab.LaunchConfigError",
    "trnlab.LaunchResult", "trnlab.LiveLossPlot", "trnlab.ModelNotAvailableError", "trnlab.NEW_FACT_PROMPT",
    "trnlab.PaddingCollator", "trnlab.PlanError", "trnlab.PromptTooLongError", "trnlab.SettingError",
    "trnlab.Settings", "trnlab.ShapeBuckets", "trnlab.StopAtStep", "trnlab.TrainingRecorder", "trnlab.__main__",
    "trnlab.__version__", "trnlab.accelerator_memory", "trnlab.assets", "trnlab.assets.BUNDLED_MODEL_DIR",
    "trnlab.assets.EXAMPLE_PROMPT", "trnlab.assets.__main__", "trnlab.assets.build", "trnlab.assets.corpus",
    "trnlab.assets.corpus.DAYS", "trnlab.assets.corpus.EXAMPLE_PROMPT", "trnlab.assets.corpus.LAWS",
    "trnlab.assets.corpus.NAMES", "trnlab.assets.corpus.PLACES", "trnlab.assets.corpus.TOWNS",
    "trnlab.assets.corpus.generate_documents", "trnlab.assets.generate_documents", "trnlab.bench",
    "trnlab.bench.RequestRecord", "trnlab.bench.WorkloadResult", "trnlab.bench.corpus_prompts",
    "trnlab.bench.generate", "trnlab.bench.generate.DEFAULT_OUTPUT", "trnlab.bench.generate.MEASURED_BACKEND",
    "trnlab.bench.generate.build_parser", "trnlab.bench.generate.build_report",
    "trnlab.bench.generate.build_workload", "trnlab.bench.generate.format_report", "trnlab.bench.generate.main",
    "trnlab.bench.generate.neff_cache_state", "trnlab.bench.generate.run_benchmark",
    "trnlab.bench.generate.run_checks", "trnlab.bench.generate.run_four_ways", "trnlab.bench.identical_outputs",
    "trnlab.bench.run_generation_workload", "trnlab.bench.sample_prompt_lengths", "trnlab.bench.steady_median",
    "trnlab.bench.time_generation", "trnlab.bench.timing", "trnlab.bench.timing.steady_median",
    "trnlab.bench.timing.time_generation", "trnlab.bench.timing.timings_differ", "trnlab.bench.timings_differ",
    "trnlab.bench.train", "trnlab.bench.train.DEFAULT_OUTPUT", "trnlab.bench.train.DEFINITIONS",
    "trnlab.bench.train.MIN_REAL_TOKEN_FRACTION", "trnlab.bench.train.TARGET_STRATEGIES",
    "trnlab.bench.train.build_report", "trnlab.bench.train.cold_compiles", "trnlab.bench.train.evaluate_targets",
    "trnlab.bench.train.main", "trnlab.bench.train.parse_args", "trnlab.bench.train.run_strategies",
    "trnlab.bench.train.train_one", "trnlab.bench.workload", "trnlab.bench.workload.RequestRecord",
    "trnlab.bench.workload.WorkloadResult", "trnlab.bench.workload.corpus_prompts",
    "trnlab.bench.workload.identical_outputs", "trnlab.bench.workload.run_generation_workload",
    "trnlab.bench.workload.sample_prompt_lengths", "trnlab.bucket_for", "trnlab.bucket_pad_tokens",
    "trnlab.bucket_padding_tokens", "trnlab.bucket_slider", "trnlab.bucketed_generate", "trnlab.buckets",
    "trnlab.buckets.PromptTooLongError", "trnlab.buckets.ShapeBuckets", "trnlab.buckets.bucket_for",
    "trnlab.buckets.bucket_pad_tokens", "trnlab.buckets.bucket_padding_tokens", "trnlab.buckets.check_lengths",
    "trnlab.buckets.choose_buckets", "trnlab.buckets.padding_by_bucket_count", "trnlab.buckets.waste_by_bucket_count",
    "trnlab.callbacks", "trnlab.callbacks.LiveLossPlot", "trnlab.callbacks.StepRecord", "trnlab.callbacks.StopAtStep",
    "trnlab.callbacks.TrainingRecorder", "trnlab.choose_buckets", "trnlab.cli", "trnlab.cli.launch",
    "trnlab.cli.launch.build_parser", "trnlab.cli.launch.main", "trnlab.cli.launch.run", "trnlab.cli.plan",
    "trnlab.cli.plan.main", "trnlab.cold_neff_cache_env", "trnlab.compat", "trnlab.compat.ACCELERATE_DYNAMIC_ENV_VAR",
    "trnlab.compat.ACCELERATE_PARALLELISM_REFUSAL", "trnlab.compat.CACHED_DETECTIONS",
    "trnlab.compat.COMPILE_TIME_METRIC", "trnlab.compat.DEVICE_MODULE_BAD_FORK_HOOK",
    "trnlab.compat.DYNAMO_RECOMPILES_LOGGER", "trnlab.compat.GENERATE_STATE_ATTRIBUTES", "trnlab.compat.INTERNALS",
    "trnlab.compat.RECOMPILE_LIMIT_EVENT", "trnlab.compat.accelerate_shared_states",
    "trnlab.compat.attention_implementation", "trnlab.compat.clear_detection_caches",
    "trnlab.compat.compile_on_every_device", "trnlab.compat.cpu_mesh_as_multi_device",
    "trnlab.compat.default_compile_config", "trnlab.compat.dynamo_compile_seconds", "trnlab.compat.dynamo_counters",
    "trnlab.compat.dynamo_recompile_limit", "trnlab.compat.dynamo_recompile_limit_hits",
    "trnlab.compat.dynamo_recompiles_logger", "trnlab.compat.dynamo_reset", "trnlab.compat.dynamo_unique_graphs",
    "trnlab.compat.forget_generate_state", "trnlab.compat.generate_cache_length", "trnlab.compat.hide_progress_table",
    "trnlab.compat.is_parallelism_refusal", "trnlab.compat.model_device_mesh", "trnlab.compat.no_compile_caches",
    "trnlab.compat.notebook_progress_callback_class", "trnlab.compat.privateuse1_backend_name",
    "trnlab.compat.register_device_module", "trnlab.compat.strided_shard_class",
    "trnlab.compat.trainer_dynamo_plugin", "trnlab.compat.valid_auto_compile_criteria", "trnlab.compile_backend",
    "trnlab.compile_seconds", "trnlab.compile_tracking", "trnlab.compile_tracking.CAPTURE_ONLY_BACKENDS",
    "trnlab.compile_tracking.CallRecord", "trnlab.compile_tracking.CompileTracker",
    "trnlab.compile_tracking.DEFAULT_OFF_NEURON_BACKEND", "trnlab.compile_tracking.NEFF_DISABLE_CACHE_VAR",
    "trnlab.compile_tracking.cold_neff_cache_env", "trnlab.compile_tracking.compile_backend",
    "trnlab.compile_tracking.compile_seconds", "trnlab.compile_tracking.forget_compiled_graphs",
    "trnlab.compile_tracking.fresh_neff_cache", "trnlab.compile_tracking.generation_compile_config",
    "trnlab.compile_tracking.graphs_compiled", "trnlab.compile_tracking.neuron_graph_metrics",
    "trnlab.compile_tracking.recompile_limit", "trnlab.compile_tracking.recompile_limit_hits",
    "trnlab.compile_tracking.recompile_log", "trnlab.compile_tracking.reset_compile_state",
    "trnlab.compile_tracking.steady_median", "trnlab.corpus_prompts", "trnlab.data", "trnlab.data.IGNORE_INDEX",
    "trnlab.data.NEW_FACT_PROMPT", "trnlab.data.NEW_LAWS", "trnlab.data.NEW_PLACES", "trnlab.data.PaddingCollator",
    "trnlab.data.STRATEGIES", "trnlab.data.batch_shapes", "trnlab.data.batches", "trnlab.data.check_length",
    "trnlab.data.default_buckets", "trnlab.data.fixed_length_dataset", "trnlab.data.label_view",
    "trnlab.data.packed_dataset", "trnlab.data.padding_waste", "trnlab.data.real_tokens",
    "trnlab.data.register_strategy", "trnlab.data.require_pad_token", "trnlab.data.strategy_dataset",
    "trnlab.data.tokenized_dataset", "trnlab.data.training_texts", "trnlab.deprecation",
    "trnlab.deprecation.REMOVED_IN", "trnlab.deprecation.SummaryDict", "trnlab.deprecation.moved_names",
    "trnlab.deprecation.renamed_keywords", "trnlab.deprecation.warn_deprecated", "trnlab.detect_backend",
    "trnlab.device", "trnlab.device.AUTO_ON_NEURON_WARNING", "trnlab.device.BACKENDS",
    "trnlab.device.DEFAULT_NEFF_CACHE", "trnlab.device.DeviceNotAvailableError", "trnlab.device.DeviceReport",
    "trnlab.device.INSTALL_HINTS", "trnlab.device.NEFF_CACHE_VAR", "trnlab.device.NEURON_ENV_VARS",
    "trnlab.device.RELEASE_CORES_HINT", "trnlab.device.accelerator_memory", "trnlab.device.backend_available",
    "trnlab.device.bf16_supported", "trnlab.device.core_holders_notice", "trnlab.device.current_accelerator",
    "trnlab.device.detect_backend", "trnlab.device.device_count", "trnlab.device.device_report",
    "trnlab.device.format_accelerator_memory", "trnlab.device.format_core_holders",
    "trnlab.device.neff_cache_summary", "trnlab.device.neuron_core_holders", "trnlab.device.neuron_ls_output",
    "trnlab.device.neuron_module", "trnlab.device.package_versions", "trnlab.device.pick_device",
    "trnlab.device.resolve_device_map", "trnlab.device.resolve_dtype", "trnlab.device_report", "trnlab.distributed",
    "trnlab.distributed.TrainingRun", "trnlab.distributed.batch_loss", "trnlab.distributed.build_trainer",
    "trnlab.distributed.global_batches", "trnlab.distributed.greedy_text", "trnlab.distributed.load_sharded_model",
    "trnlab.distributed.mesh_position", "trnlab.distributed.pad_vocabulary",
    "trnlab.distributed.parameter_placements", "trnlab.distributed.quiet_rank_output",
    "trnlab.distributed.rank_report", "trnlab.distributed.read_run", "trnlab.distributed.reshard",
    "trnlab.distributed.save_sharded", "trnlab.distributed.shard_of_batch", "trnlab.distributed.train_sharded",
    "trnlab.distributed.train_single_process", "trnlab.distributed.write_json", "trnlab.doctor",
    "trnlab.doctor.CHECKED_PACKAGES", "trnlab.doctor.Check", "trnlab.doctor.format_report", "trnlab.doctor.main",
    "trnlab.doctor.required_versions", "trnlab.doctor.run_checks", "trnlab.doctor.show_report",
    "trnlab.first_sentence", "trnlab.fixed_length_dataset", "trnlab.forget_compiled_graphs",
    "trnlab.format_accelerator_memory", "trnlab.format_forward_calls", "trnlab.format_plan", "trnlab.format_steps",
    "trnlab.format_table", "trnlab.fresh_neff_cache", "trnlab.generate_batch", "trnlab.generation",
    "trnlab.generation.PromptTooLongError", "trnlab.generation.Prompts", "trnlab.generation.TensorInfo",
    "trnlab.generation.bucket_padding_tokens", "trnlab.generation.bucketed_generate",
    "trnlab.generation.choose_buckets", "trnlab.generation.corpus_prompts", "trnlab.generation.first_sentence",
    "trnlab.generation.format_forward_calls", "trnlab.generation.generate_batch",
    "trnlab.generation.generate_compile_kwargs", "trnlab.generation.identical_outputs",
    "trnlab.generation.moved_to_model_device", "trnlab.generation.pad_token_lists",
    "trnlab.generation.prompt_token_ids", "trnlab.generation.record_forward_inputs",
    "trnlab.generation.reset_compile_state", "trnlab.generation.run_generation_workload",
    "trnlab.generation.sample_prompt_lengths", "trnlab.generation.show_padding", "trnlab.generation.time_generation",
    "trnlab.generation.tokenize_batch", "trnlab.generation.waste_by_bucket_count", "trnlab.generation_compile_config",
    "trnlab.get_instance", "trnlab.graphs_compiled", "trnlab.identical_outputs", "trnlab.instances",
    "trnlab.instances.GiB", "trnlab.instances.INSTANCES", "trnlab.instances.Instance",
    "trnlab.instances.InstanceError", "trnlab.instances.LNC_URL", "trnlab.instances.PlanError",
    "trnlab.instances.TORCHNEURON_QUICKSTART_URL", "trnlab.instances.TRAINIUM2_URL", "trnlab.instances.TRAINIUM3_URL",
    "trnlab.instances.TRN2_ARCH_URL", "trnlab.instances.TRN3_ARCH_URL", "trnlab.instances.UNSUPPORTED_INSTANCES",
    "trnlab.instances.get_instance", "trnlab.knob", "trnlab.label_view", "trnlab.last_checkpoint", "trnlab.launch",
    "trnlab.launch_loopback_nodes", "trnlab.launcher", "trnlab.launcher.CPU_DEFAULT_PROCESSES",
    "trnlab.launcher.DIST_BACKENDS", "trnlab.launcher.ProcessPlan", "trnlab.launcher.launch",
    "trnlab.launcher.launch_command", "trnlab.launcher.launch_loopback_nodes", "trnlab.launcher.main",
    "trnlab.launcher.model_config_of", "trnlab.launcher.multinode_commands", "trnlab.launcher.neuron_cores_per_node",
    "trnlab.launcher.plan_processes", "trnlab.launcher.slurm_script", "trnlab.launcher.torchrun_command",
    "trnlab.load_config", "trnlab.load_model", "trnlab.load_tokenizer", "trnlab.make_trainer", "trnlab.memory_model",
    "trnlab.memory_model.ACTIVATION_FORMULA", "trnlab.memory_model.BACKWARD_PER_FORWARD",
    "trnlab.memory_model.CHECKPOINTING", "trnlab.memory_model.COMPONENTS", "trnlab.memory_model.COMPONENT_LABELS",
    "trnlab.memory_model.COMPONENT_SHORT_LABELS", "trnlab.memory_model.DTYPE_BYTES",
    "trnlab.memory_model.INFERENCE_ACTIVATION_FORMULA", "trnlab.memory_model.MemoryPlan",
    "trnlab.memory_model.SELECTIVE_ACTIVATION_FORMULA", "trnlab.memory_model.TRAIN_ACTIVATION_FORMULA",
    "trnlab.memory_model.checkpointed_layers", "trnlab.memory_model.checkpointing_label",
    "trnlab.memory_model.checkpointing_mode", "trnlab.memory_model.dtype_name", "trnlab.memory_model.every_nth_layer",
    "trnlab.memory_model.fsdp_buffer_bytes", "trnlab.memory_model.gradient_bytes",
    "trnlab.memory_model.inference_activation_bytes", "trnlab.memory_model.kv_cache_bytes",
    "trnlab.memory_model.optimizer_bytes", "trnlab.memory_model.parameter_bytes", "trnlab.memory_model.plan_memory",
    "trnlab.memory_model.recompute_fraction", "trnlab.memory_model.train_activation_bytes",
    "trnlab.memory_model.workload_name", "trnlab.memory_table", "trnlab.mesh", "trnlab.mesh.LaunchConfigError",
    "trnlab.mesh.TP_DIMENSIONS", "trnlab.mesh.checked_config", "trnlab.mesh.divisors", "trnlab.mesh.mesh_sizes",
    "trnlab.mesh.tp_dimensions", "trnlab.mesh.tp_misfits", "trnlab.mesh.tp_sizes_that_fit",
    "trnlab.mesh.validate_parallel_sizes", "trnlab.model_name", "trnlab.models", "trnlab.models.CONFIG_DIR",
    "trnlab.models.CONFIG_FILE", "trnlab.models.ConfigError", "trnlab.models.ModelNotAvailableError",
    "trnlab.models.NOT_CONFIG_SUFFIXES", "trnlab.models.SHIPPED_MODELS", "trnlab.models.TOKENIZER_FILES",
    "trnlab.models.WEIGHT_PATTERNS", "trnlab.models.config_from_dict", "trnlab.models.explained_load_errors",
    "trnlab.models.hub_reachable", "trnlab.models.is_bundled", "trnlab.models.is_config", "trnlab.models.load_config",
    "trnlab.models.load_model", "trnlab.models.load_tokenizer", "trnlab.models.missing_model_files",
    "trnlab.models.model_name", "trnlab.models.model_source", "trnlab.models.parameter_count",
    "trnlab.models.read_config_file", "trnlab.models.shipped_config", "trnlab.models.text_config",
    "trnlab.moved_to_model_device", "trnlab.multinode_commands", "trnlab.notebook",
    "trnlab.notebook.COMPILE_TIME_SOURCE", "trnlab.notebook.run_summary", "trnlab.notebook.setup",
    "trnlab.packed_dataset", "trnlab.pad_vocabulary", "trnlab.padding_by_bucket_count", "trnlab.padding_waste",
    "trnlab.parameter_count", "trnlab.pick_device", "trnlab.placement_table", "trnlab.plan_memory",
    "trnlab.plan_mesh", "trnlab.plan_processes", "trnlab.planning", "trnlab.planning.ACTIVATION_FORMULA",
    "trnlab.planning.AWS_QWEN3_8B_RECIPE", "trnlab.planning.BACKWARD_PER_FORWARD", "trnlab.planning.COMPONENT_LABELS",
    "trnlab.planning.CONFIG_DIR", "trnlab.planning.DTYPE_BYTES", "trnlab.planning.INFERENCE_ACTIVATION_FORMULA",
    "trnlab.planning.InstanceError", "trnlab.planning.LNC_URL", "trnlab.planning.MeshCandidate",
    "trnlab.planning.MeshPlan", "trnlab.planning.REQUIRED_FIELDS", "trnlab.planning.SELECTIVE_ACTIVATION_FORMULA",
    "trnlab.planning.SHIPPED_MODELS", "trnlab.planning.TORCHNEURON_QUICKSTART_URL",
    "trnlab.planning.TORCHTITAN_TUTORIAL_URL", "trnlab.planning.TRAINING_BEST_PRACTICES_URL",
    "trnlab.planning.TRAINIUM2_URL", "trnlab.planning.TRAINIUM3_URL", "trnlab.planning.TRAIN_ACTIVATION_FORMULA",
    "trnlab.planning.TRN2_ARCH_URL", "trnlab.planning.TRN3_ARCH_URL", "trnlab.planning.TensorShard",
    "trnlab.planning.UNSUPPORTED_INSTANCES", "trnlab.planning.format_plan", "trnlab.planning.fsdp_buffer_bytes",
    "trnlab.planning.gradient_bytes", "trnlab.planning.inference_activation_bytes", "trnlab.planning.kv_cache_bytes",
    "trnlab.planning.main", "trnlab.planning.optimizer_bytes", "trnlab.planning.parameter_bytes",
    "trnlab.planning.parameter_shards", "trnlab.planning.plan_mesh", "trnlab.planning.plot_memory_plan",
    "trnlab.planning.resolve_config", "trnlab.planning.train_activation_bytes", "trnlab.plot_buckets",
    "trnlab.plot_compile_growth", "trnlab.plot_generation_comparison", "trnlab.plot_losses",
    "trnlab.plot_memory_plan", "trnlab.plot_mesh", "trnlab.plot_padding_waste", "trnlab.plot_strategy_comparison",
    "trnlab.plots", "trnlab.plots.draw_loss_curve", "trnlab.plots.plot_buckets", "trnlab.plots.plot_compile_growth",
    "trnlab.plots.plot_generation_comparison", "trnlab.plots.plot_losses", "trnlab.plots.plot_memory_plan",
    "trnlab.plots.plot_mesh", "trnlab.plots.plot_padding_waste", "trnlab.plots.plot_strategy_comparison",
    "trnlab.prompt_token_ids", "trnlab.pytest_plugin", "trnlab.pytest_plugin.BUNDLED_MODEL_TAG",
    "trnlab.pytest_plugin.NotebookRulesError", "trnlab.pytest_plugin.SANITIZE_PATTERNS",
    "trnlab.pytest_plugin.cell_options", "trnlab.pytest_plugin.course_patterns",
    "trnlab.pytest_plugin.machine_path_patterns", "trnlab.pytest_plugin.notebook_problems",
    "trnlab.pytest_plugin.other_model", "trnlab.pytest_plugin.parse_notebook_env", "trnlab.pytest_plugin.sanitize",
    "trnlab.rank_cores", "trnlab.rank_cores.CoreListError", "trnlab.rank_cores.LaunchConfigError",
    "trnlab.rank_cores.USAGE", "trnlab.rank_cores.VISIBLE_CORES_VAR", "trnlab.rank_cores.core_for_this_rank",
    "trnlab.rank_cores.format_core_list", "trnlab.rank_cores.main", "trnlab.rank_cores.needs_rank_cores",
    "trnlab.rank_cores.parse_core_list", "trnlab.rank_cores.parse_neuron_cores",
    "trnlab.rank_cores.rank_neuron_cores", "trnlab.rank_cores.visible_cores_setting",
    "trnlab.rank_cores.visible_neuron_cores", "trnlab.rank_neuron_cores", "trnlab.read_run", "trnlab.read_settings",
    "trnlab.real_tokens", "trnlab.recompile_limit_hits", "trnlab.recompile_log", "trnlab.recompute_fraction",
    "trnlab.record_forward_inputs", "trnlab.reset_compile_state", "trnlab.resolve_device_map", "trnlab.resolve_dtype",
    "trnlab.run_generation_workload", "trnlab.run_summary", "trnlab.runner", "trnlab.runner.LAUNCH_ID_VAR",
    "trnlab.runner.LaunchError", "trnlab.runner.LaunchResult", "trnlab.runner.RANK_PREFIX_TEMPLATE",
    "trnlab.runner.check_timeouts", "trnlab.runner.child_environment", "trnlab.runner.core_holders_notice",
    "trnlab.runner.free_port", "trnlab.runner.run_commands", "trnlab.sample_prompt_lengths", "trnlab.scripts",
    "trnlab.scripts.measure_memory", "trnlab.scripts.train_sharded", "trnlab.settings",
    "trnlab.settings.CPU_THREADS_ENV_VAR", "trnlab.settings.DEFAULT_INSTANCE", "trnlab.settings.DEVICE_CHOICES",
    "trnlab.settings.DEVICE_ENV_VAR", "trnlab.settings.DTYPE_CHOICES", "trnlab.settings.DTYPE_ENV_VAR",
    "trnlab.settings.MODEL_ENV_VAR", "trnlab.settings.SettingError", "trnlab.settings.Settings",
    "trnlab.settings.check_cpu_threads", "trnlab.settings.check_device_name", "trnlab.settings.check_dtype_name",
    "trnlab.settings.environment", "trnlab.settings.knob", "trnlab.settings.progress_bars",
    "trnlab.settings.quiet_transformers", "trnlab.settings.read_setting", "trnlab.settings.read_settings",
    "trnlab.settings.setting_problems", "trnlab.setup", "trnlab.sharding", "trnlab.sharding.ModelSpec",
    "trnlab.sharding.REQUIRED_FIELDS", "trnlab.sharding.TensorShard", "trnlab.sharding.config_and_label",
    "trnlab.sharding.model_spec", "trnlab.sharding.parameter_shards", "trnlab.sharding.tp_problem",
    "trnlab.show_padding", "trnlab.show_report", "trnlab.simulate", "trnlab.simulate.CLAIMS",
    "trnlab.simulate.ReportingDevice", "trnlab.simulate.SIMULATION_NOTICE", "trnlab.simulate.SimulatedDecision",
    "trnlab.simulate.SimulatedNeuronModule", "trnlab.simulate.claim_device_map_auto",
    "trnlab.simulate.claim_generate_auto_compile", "trnlab.simulate.claim_neuron_device",
    "trnlab.simulate.claim_torch_compile_backend", "trnlab.simulate.claim_training_device",
    "trnlab.simulate.reporting_device", "trnlab.simulate.simulate_neuron", "trnlab.simulate.simulated_decisions",
    "trnlab.simulate.simulation_active", "trnlab.simulate_neuron", "trnlab.simulated_decisions",
    "trnlab.slurm_script", "trnlab.strategy_dataset", "trnlab.tables", "trnlab.tables.format_plan",
    "trnlab.tables.format_steps", "trnlab.tables.format_table", "trnlab.tables.memory_table",
    "trnlab.tables.placement_table", "trnlab.tables.text_table", "trnlab.time_generation", "trnlab.timings_differ",
    "trnlab.tokenize_batch", "trnlab.tokenized_dataset", "trnlab.torchrun_command", "trnlab.train_strategy",
    "trnlab.training", "trnlab.training.STATIC_SHAPES_ENV_VAR", "trnlab.training.compile_settings",
    "trnlab.training.describe_arguments", "trnlab.training.format_table", "trnlab.training.last_checkpoint",
    "trnlab.training.make_trainer", "trnlab.training.page_arguments", "trnlab.training.precision_choice",
    "trnlab.training.static_shape_compiles", "trnlab.training.train_strategy", "trnlab.training.training_arguments",
    "trnlab.training_arguments", "trnlab.training_texts", "trnlab.validate_parallel_sizes",
    "trnlab.waste_by_bucket_count", "trnlab.widgets", "trnlab.widgets.bucket_slider", "trnlab.widgets.bucket_summary",
)


# Reading the package's source


@functools.cache
def _module_path(module: str) -> Path | None:
    """The file of ``trnlab.x.y`` (``trnlab/x/y.py`` or its package's ``__init__.py``), a folder (a namespace
    package), or None."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py", base):
        if path.exists():
            return path
    return None


@functools.cache
def _module(module: str) -> tuple[dict, list | None]:
    """``({name: node}, __all__)`` of a module's top level: defs, classes, assignments and imports (None: no __all__)."""
    path = _module_path(module)
    if path is None or path.is_dir():
        return {}, None
    bindings, exported = {}, None

    def walk(body):
        nonlocal exported
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bindings[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            bindings[name.id] = node
                            if name.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                                exported = [ast.literal_eval(e) for e in node.value.elts]
            elif isinstance(node, ast.ImportFrom):
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
                for alias in node.names:
                    bindings[alias.asname or alias.name] = ("from", source, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    bindings[alias.asname or alias.name.split(".")[0]] = ("import", alias.name)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                walk(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                     + [n for h in getattr(node, "handlers", []) for n in h.body])
    walk(ast.parse(path.read_text(encoding="utf-8")).body)
    return bindings, exported


@functools.cache
def _groups() -> dict[str, str]:
    """``trnlab._GROUPS`` flattened: ``{top-level name: its module}``."""
    node = _module("trnlab")[0]["_GROUPS"]
    return {name: module for group in ast.literal_eval(node.value).values() for name, module in group.items()}


def _members(module: str, cls: ast.ClassDef) -> set[str]:
    """What a class defines: methods, class attributes, dataclass fields, ``self.x = ...``, and its trnlab bases'."""
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not cls:
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name) or (isinstance(target, ast.Attribute)
                                                    and getattr(target.value, "id", "") == "self"):
                    names.add(getattr(target, "id", None) or target.attr)
    for base in cls.bases:
        found = _lookup(module, getattr(base, "id", ""), public=False)
        if found and isinstance(found[1], ast.ClassDef):
            names |= _members(*found)
    return names


def _lookup(module: str, name: str, public: bool):
    """``(defining module, node)`` of ``module.name`` (imports followed inside trnlab), or None."""
    if module == "trnlab" and name in _groups():
        return _lookup(f"trnlab.{_groups()[name]}", name, False)
    bindings, exported = _module(module)
    if name not in bindings or (public and (name.startswith("_") if exported is None else name not in exported)):
        return None
    node = bindings[name]
    if isinstance(node, tuple) and node[0] == "from" and node[1].startswith("trnlab"):
        if _module_path(f"{node[1]}.{node[2]}"):
            return f"{node[1]}.{node[2]}", "module"
        return _lookup(node[1], node[2], False)
    return module, node


def _resolves(dotted: str, public: bool = False) -> bool:
    """Whether ``dotted`` names a trnlab module, or a name in one (``public``: listed in ``__all__``, or a member of
    such a class), in the working tree."""
    parts = dotted.split(".")
    if parts[0] != "trnlab":
        return False
    module, node = "trnlab", "module"
    for part in parts[1:]:
        if node == "module":
            if _module_path(f"{module}.{part}") and not (public and part.startswith("_") and part != "__main__"):
                module = f"{module}.{part}"
                continue
            found = _lookup(module, part, public)
            if found is None:
                return False
            module, node = found
        elif isinstance(node, ast.ClassDef):
            if part not in _members(module, node) or (public and part.startswith("_")):
                return False
            node = None  # a member: nothing is resolved below it
        else:
            return False
    return True


def _parameters(dotted: str) -> set[str] | None:
    """The keywords ``dotted`` (a function or class) takes; None if it takes any (``**kwargs``) or is neither."""
    parts, module, node = dotted.split("."), "trnlab", "module"
    for part in parts[1:]:
        if node != "module":
            return None
        if _module_path(f"{module}.{part}"):
            module = f"{module}.{part}"
            continue
        module, node = _lookup(module, part, False)
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:  # a dataclass: its fields
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)} or None
        node = init
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.args.kwarg:
        return None
    return {a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs}


# Reading CHANGELOG.md

_SPAN = re.compile(r"`([^`]+)`")
_DOTTED = re.compile(r"trnlab(?:\.(?:<name>|\w+))*")


def _rows() -> list[tuple[str, str]]:
    """The table's rows as ``(0.1.0 cell, write-instead cell)``."""
    lines = CHANGELOG.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = line.strip().strip("|").split(" | ")
        assert len(cells) == 2, f"a row with {len(cells)} cells (a '|' inside a cell?): {line}"
        rows.append((cells[0], cells[1]))
    return rows


def _expand(span: str) -> list[str]:
    """``trnlab.x.{a, b}`` -> ``["trnlab.x.a", "trnlab.x.b"]``; the dotted name at the start of each."""
    choices = [[c.strip() for c in group.split(",")] for group in re.findall(r"\{([\w, ]+)\}", span)]
    template = re.sub(r"\{[\w, ]+\}", "{}", span)
    return [m.group() for combo in itertools.product(*choices) if (m := _DOTTED.match(template.format(*combo)))]


def _listed(cell: str) -> list[str]:
    return [name for span in _SPAN.findall(cell) if span.startswith("trnlab") for name in _expand(span)]


def _keywords(span: str, name_end: int) -> list[str]:
    """The keywords of the call that follows the dotted name in ``span`` (``f(x, k=1)`` -> ``["k"]``), top level only."""
    if span[name_end:name_end + 1] != "(":
        return []
    depth, keywords = 0, []
    for i in range(name_end, len(span)):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(span[i], 0)
        if depth == 0:
            break
        if depth == 1 and (m := re.match(r"(\w+)=(?!=)", span[i:])) and span[i - 1] in "(, ":
            keywords.append(m.group(1))
    return keywords


def _bad_targets(rows) -> list[str]:
    """Each trnlab name of the write-instead column that does not resolve to a public name, or is called with a
    keyword it does not take; ``<name>`` is each 0.1.0 name of the row, its last part."""
    bad = []
    for old, new in rows:
        names = [n.rsplit(".", 1)[-1] for n in _listed(old)]
        for span in _SPAN.findall(new):
            for match in re.finditer(r"(?<![\w.])" + _DOTTED.pattern, span):
                found = match.group()
                for target in sorted({found.replace("<name>", n) for n in names} if "<name>" in found else {found}):
                    if not _resolves(target, public=True):
                        bad.append(f"{target} (row {old[:40]}...)")
                    elif (taken := _parameters(target)) is not None:
                        bad += [f"{target}({k}=...)" for k in _keywords(span, match.end()) if k not in taken]
    return bad


# The tests


def test_the_changelog_is_one_table_under_its_release():
    text = CHANGELOG.read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n\n## 0.3.1\n") and "\n## 0.3.0\n" in text and "\n## 0.2.0\n" in text
    assert text.count(HEADER) == 1 and text.count("\n|") == len(_rows()) + 2, "keep one table, no other"
    assert 80 <= len(_rows()) <= 120, f"{len(_rows())} rows: group names that moved the same way"


def test_every_public_name_of_0_1_0_resolves_or_is_in_the_table():
    listed = {name for old, _ in _rows() for name in _listed(old)}
    missing = [name for name in OLD_PUBLIC if name not in listed and not _resolves(name)]
    assert not missing, f"add a row (what to write instead) for: {missing}"


def test_a_listed_member_outside_the_frozen_list_is_gone():
    listed = {name for old, _ in _rows() for name in _listed(old)}
    kept = [name for name in listed - set(OLD_PUBLIC) if _resolves(name)]
    assert not kept, f"these still exist: drop them from the table, or say what changed about them: {kept}"


def test_every_name_to_write_instead_resolves():
    assert not _bad_targets(_rows()), f"not a public trnlab name, or no such keyword: {_bad_targets(_rows())}"


def _section(version: str) -> str:
    text = CHANGELOG.read_text(encoding="utf-8")
    return text.split(f"\n## {version}\n", 1)[1].split("\n## ", 1)[0]


def _told_to_write() -> str:
    """What the CHANGELOG tells a learner to write: the table's right column and the notes of 0.3.0 on."""
    return "\n".join(new for _, new in _rows()) + _section("0.3.0") + _section("0.3.1")


def test_every_path_the_changelog_tells_a_learner_to_use_exists():
    paths = re.findall(r"`((?:examples|tests|tools|notebooks)/[\w./-]+)", _told_to_write())
    assert "examples/train_sharded.py" in paths and not [p for p in paths if not (ROOT / p).exists()]


def test_every_name_the_0_3_notes_give_resolves():
    names = [n for span in re.findall(r"`([^`]+)`", _section("0.3.0") + _section("0.3.1")) for n in _expand(span)
             if n.startswith("trnlab.")]
    assert "trnlab.distributed.sharded_checkpoints" in names
    assert not [n for n in names if not _resolves(n, public=True)]
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert CHANGELOG.read_text(encoding="utf-8").split("\n## ", 2)[1].startswith(version + "\n")


def test_the_checks_can_fail():
    assert _resolves("trnlab.training.packed_dataset", public=True)
    assert _resolves("trnlab.CompileTracker.summary", public=True)
    assert not _resolves("trnlab.data.packed_dataset")             # a module that is gone
    assert _resolves("trnlab._MODULE_OF") and not _resolves("trnlab._MODULE_OF", public=True)  # private
    assert not _resolves("trnlab.generation.torch", public=True)   # an import, not in generation.__all__
    assert _resolves("trnlab.generation.torch")                    # ... but there
    assert _bad_targets([("`trnlab.data.{batches, nothing}`", "`trnlab.training.<name>`")]) == [
        "trnlab.training.nothing (row `trnlab.data.{batches, nothing}`...)"]
    assert _bad_targets([("`x`", "`trnlab.packed_dataset(tokenizer, texts, block_length=96)`")]) == [
        "trnlab.packed_dataset(block_length=...)"]
    assert _expand("trnlab.{data, callbacks}.{a, b}(x=1)") == [
        "trnlab.data.a", "trnlab.data.b", "trnlab.callbacks.a", "trnlab.callbacks.b"]
