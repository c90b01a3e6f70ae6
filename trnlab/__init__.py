"""trnlab: helpers for the course "Hugging Face Transformers on AWS Trainium".

Each helper is small and named for one idea; the notebooks in ``notebooks/`` call them,
and they work the same outside the course. The code takes the ``neuron`` path whenever
``torch.neuron`` exists and runs for real on CUDA or CPU otherwise.
"""

__version__ = "0.1.0"

from trnlab.assets import EXAMPLE_PROMPT
from trnlab.device import (
    DeviceNotAvailableError,
    DeviceReport,
    detect_backend,
    device_report,
    pick_device,
    resolve_device_map,
)
from trnlab.doctor import show_report
from trnlab.models import (
    ModelNotAvailableError,
    load_model,
    load_tokenizer,
    model_name,
    parameter_count,
)
from trnlab.notebook import setup
# Notebook 05. The function trnlab.launch.launch stays in its module: a top-level `launch`
# would hide the module of the same name.
from trnlab.launch import (
    LaunchConfigError,
    LaunchResult,
    launch_loopback_nodes,
    multinode_commands,
    plan_processes,
    slurm_script,
    validate_parallel_sizes,
)
# Notebooks 02 and 03: generation on an explicit device, compile tracking, shape bucketing.
from trnlab.compile_tracking import CompileTracker
from trnlab.generation import (
    PromptTooLongError,
    ShapeBuckets,
    bucketed_generate,
    choose_buckets,
    corpus_prompts,
    format_forward_calls,
    generate_batch,
    generation_compile_config,
    identical_outputs,
    moved_to_model_device,
    bucket_padding_tokens,
    record_forward_inputs,
    reset_compile_state,
    run_generation_workload,
    sample_prompt_lengths,
    show_padding,
    time_generation,
    tokenize_batch,
    waste_by_bucket_count,
)

# Training data with static shapes (notebook 04). The Trainer helpers load transformers' Trainer,
# so they stay in their module: `import trnlab.training`.
from trnlab.data import NEW_FACT_PROMPT, fixed_length_dataset, packed_dataset, training_texts
