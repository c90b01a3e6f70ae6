"""trnlab's own minimal ``GenerationTesterMixin`` for the sdist's ``test_modeling_common.py``, which imports it from
``tests/generation/test_utils.py``, a file the sdist does not ship. Written for trnlab, no Transformers code: the
three generate() behaviours the course relies on, on whatever device ``transformers.testing_utils`` tests. Copied
to ``hfsuite/generation/test_utils.py`` by ``tests/test_transformers_suite.py``."""

import torch
from transformers.testing_utils import torch_device


class GenerationTesterMixin:
    def _generative_model(self):
        """The model with fixed weights, no end-of-sequence token (each run makes all its tokens) and a prompt free
        of the pad token (so generate() masks nothing)."""
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        torch.manual_seed(0)
        model = self.all_generative_model_classes[0](config).to(torch_device).eval()
        model.generation_config.eos_token_id = None
        ids = torch.randint(3, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0)).to(torch_device)
        return model, ids, config

    def test_greedy_generate_is_the_argmax_of_each_next_token(self):
        model, ids, config = self._generative_model()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                             pad_token_id=config.pad_token_id)
        step = ids
        with torch.no_grad():
            for _ in range(4):  # without a cache: the whole sequence each step
                step = torch.cat([step, model(step).logits[:, -1:].argmax(-1)], dim=-1)
        self.assertEqual(out.tolist(), step.tolist())

    def test_static_cache_generates_what_the_dynamic_cache_does(self):
        model, ids, config = self._generative_model()
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                      pad_token_id=config.pad_token_id)
        dynamic = model.generate(ids, **kwargs)
        static = model.generate(ids, cache_implementation="static", **kwargs)
        self.assertEqual(static.tolist(), dynamic.tolist())

    def test_sampling_with_a_seed_repeats(self):
        model, ids, config = self._generative_model()
        outputs = []
        for _ in range(2):
            torch.manual_seed(3)
            outputs.append(model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=True,
                                          top_k=0, pad_token_id=config.pad_token_id).tolist())
        self.assertEqual(outputs[0], outputs[1])
