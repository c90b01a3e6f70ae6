"""Transformers' device spec (``TRANSFORMERS_TEST_DEVICE_SPEC``) for the ``neuron`` device: TorchNeuron's or
trnlab's STAND-IN (``TRNLAB_NEURON_STANDIN=1``). testing_utils imports it by module name, from the current folder.

``TRNLAB_SUITE_DEVICE_COUNT`` caps the count the suite sees (its CPU run can start no more ranks than the machine
has CPUs: ``tests/test_transformers_suite.py`` gives both runs the same cap, so the same tests start the same
processes); unset, it is ``torch.neuron.device_count()``."""

import os

import torch

DEVICE_NAME = "neuron"
MANUAL_SEED_FN = torch.neuron.manual_seed
EMPTY_CACHE_FN = torch.neuron.empty_cache


def DEVICE_COUNT_FN():  # noqa: N802 (the name testing_utils reads)
    cap = os.environ.get("TRNLAB_SUITE_DEVICE_COUNT", "").strip()
    return min(torch.neuron.device_count(), int(cap)) if cap else torch.neuron.device_count()
