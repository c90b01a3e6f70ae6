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
