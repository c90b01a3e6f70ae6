"""Transformers' own model tests (``ModelTesterMixin``, ``TrainingTesterMixin``, the FSDP2/HSDP and tensor-parallel
mixins, from the sdist of the installed version) for a tiny Qwen3, on whatever device ``transformers.testing_utils``
tests (``TRANSFORMERS_TEST_DEVICE``). trnlab's own minimal Qwen3 tester and generation mixin: the sdist ships
neither. Copied next to the sdist's files as ``test_qwen3_suite.py`` by ``tests/test_transformers_suite.py``."""

import unittest

from transformers import Qwen3Config, is_torch_available
from transformers.testing_utils import require_torch, torch_device

from .generation.test_utils import GenerationTesterMixin
from .test_fsdp_mixin import FSDPTesterMixin
from .test_modeling_common import ModelTesterMixin, ids_tensor
from .test_tensor_parallel_mixin import TensorParallelTesterMixin
from .test_training_mixin import TrainingTesterMixin

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
        self.vocab_size, self.hidden_size, self.num_hidden_layers, self.num_attention_heads = 99, 32, 2, 2
        self.is_training, self.num_labels, self.num_choices = True, 3, 4

    def get_config(self):
        return Qwen3Config(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=2, head_dim=16, intermediate_size=37, hidden_act="gelu",
                           max_position_embeddings=512, initializer_range=0.02, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2)

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        return self.get_config(), {"input_ids": input_ids, "attention_mask": torch.tril(torch.ones_like(input_ids))}


@require_torch
class Qwen3ModelTest(ModelTesterMixin, GenerationTesterMixin, TrainingTesterMixin, FSDPTesterMixin,
                     TensorParallelTesterMixin, unittest.TestCase):
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
