"""Transformers' FSDP and tensor-parallel mixins (from its 5.24.0 sdist) for a tiny Qwen3, on whatever device
``transformers.testing_utils`` tests (``TRANSFORMERS_TEST_DEVICE``). trnlab's own minimal Qwen3 tester: the sdist has
none. Copied next to the mixins as ``test_qwen3_suite.py`` by ``tests/test_transformers_suite.py``."""

import unittest

from transformers import Qwen3Config, is_torch_available
from transformers.testing_utils import require_torch, torch_device

from .test_fsdp_mixin import FSDPTesterMixin
from .test_tensor_parallel_mixin import TensorParallelTesterMixin

if is_torch_available():
    import torch

    from transformers import (
        Qwen3ForCausalLM,
        Qwen3ForQuestionAnswering,
        Qwen3ForSequenceClassification,
        Qwen3ForTokenClassification,
        Qwen3Model,
    )


class Qwen3ModelTester:
    """A tiny Qwen3 (the sizes Transformers' causal-LM testers use: a 99-token vocabulary, 2 layers of width 32)."""

    config_class = Qwen3Config
    if is_torch_available():
        base_model_class = Qwen3Model
        causal_lm_class = Qwen3ForCausalLM
        sequence_classification_class = Qwen3ForSequenceClassification
        token_classification_class = Qwen3ForTokenClassification
        question_answering_class = Qwen3ForQuestionAnswering

    def __init__(self, parent, batch_size=13, seq_length=7):
        self.parent, self.batch_size, self.seq_length = parent, batch_size, seq_length

    def get_config(self):
        return Qwen3Config(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16, intermediate_size=37, hidden_act="gelu",
                           max_position_embeddings=512, initializer_range=0.02, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2)

    def prepare_config_and_inputs_for_common(self):
        config = self.get_config()
        input_ids = torch.randint(3, config.vocab_size, (self.batch_size, self.seq_length), device=torch_device)
        return config, {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


@require_torch
class Qwen3DistributedTest(FSDPTesterMixin, TensorParallelTesterMixin, unittest.TestCase):
    all_model_classes = (
        (Qwen3Model, Qwen3ForCausalLM, Qwen3ForSequenceClassification, Qwen3ForTokenClassification,
         Qwen3ForQuestionAnswering)
        if is_torch_available()
        else ()
    )

    def setUp(self):
        self._model_tester = Qwen3ModelTester(self)

    @property
    def model_tester(self):
        return self._model_tester
