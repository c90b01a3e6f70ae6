"""Build the course model: a tiny Qwen3 causal LM with its own fast tokenizer.

``python tools/build_model.py`` (``make model``) writes ``trnlab/assets/tiny-qwen3/`` (the
files the package ships); ``--quick`` makes a smaller, shorter build that the tests run so
the recipe cannot rot. ``--other --output DIR`` writes, in seconds, *another* small Qwen3
(:data:`OTHER`: other sizes, briefly trained, the bundled tokenizer) for running the course
with ``TRNLAB_MODEL=DIR``, as a learner would with ``Qwen/Qwen3-0.6B``. The model is the real ``Qwen3ForCausalLM`` class, saved with
``save_pretrained`` as safetensors, so ``from_pretrained`` loads it like any hub model.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trnlab.models import _BUNDLED_MODEL_DIR
from trnlab.assets.corpus import EXAMPLE_PROMPT, generate_documents

EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class BuildRecipe:
    """Sizes and training length of one build; ``FULL`` ships, ``QUICK`` is for tests."""

    documents: int
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    block_length: int
    batch_size: int
    steps: int
    learning_rate: float
    seed: int = 0
    #: Train no tokenizer: reuse the bundled model's (``OTHER``: the course's prompts stay valid).
    bundled_tokenizer: bool = False


FULL = BuildRecipe(documents=6000, vocab_size=1024, hidden_size=192, intermediate_size=512,
                   layers=4, heads=4, kv_heads=2, head_dim=48, block_length=128,
                   batch_size=32, steps=400, learning_rate=3e-3)
QUICK = BuildRecipe(documents=300, vocab_size=400, hidden_size=64, intermediate_size=128,
                    layers=2, heads=4, kv_heads=2, head_dim=16, block_length=64,
                    batch_size=8, steps=30, learning_rate=3e-3)
#: Another model for the course: sizes unlike the bundled one; heads (8), KV heads (4) and the
#: MLP (384) divide by 2 and 4, so notebook 05's tp=2 x fsdp=2 mesh (and tp=4) shards it.
OTHER = BuildRecipe(documents=400, vocab_size=0, hidden_size=128, intermediate_size=384,
                    layers=3, heads=8, kv_heads=4, head_dim=16, block_length=64,
                    batch_size=8, steps=40, learning_rate=3e-3, seed=1, bundled_tokenizer=True)


def train_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE on ``texts`` and return it as a ``Qwen2Tokenizer``.

    The pre-tokenizer is Qwen's own (the class sets it), so the tokenizer splits text the
    way ``Qwen/Qwen3-0.6B`` does, only with a far smaller vocabulary.
    """
    from tokenizers import pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    empty = Qwen2Tokenizer(vocab={EOS_TOKEN: 0}, merges=[])
    backend = empty.backend_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return Qwen2Tokenizer(tokenizer_object=backend, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN,
                          unk_token=None, model_max_length=512)


def _packed_blocks(tokenizer, texts: list[str], block_length: int) -> torch.Tensor:
    """Concatenate documents with EOS between them and cut ``block_length`` blocks."""
    ids: list[int] = []
    for encoded in tokenizer(texts)["input_ids"]:
        ids.extend(encoded + [tokenizer.eos_token_id])
    usable = len(ids) // block_length * block_length
    return torch.tensor(ids[:usable]).view(-1, block_length)


def build(output_dir: Path = _BUNDLED_MODEL_DIR, recipe: BuildRecipe = FULL, log=print) -> Path:
    """Build tokenizer and model, train, save to ``output_dir``; return the directory."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    start = time.perf_counter()
    torch.manual_seed(recipe.seed)
    texts = generate_documents(recipe.documents, seed=recipe.seed)
    if recipe.bundled_tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(_BUNDLED_MODEL_DIR)
    else:
        tokenizer = train_tokenizer(texts, recipe.vocab_size)
    blocks = _packed_blocks(tokenizer, texts, recipe.block_length)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
        head_dim=recipe.head_dim, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    model = Qwen3ForCausalLM(config)
    log(f"corpus: {len(texts)} documents, {blocks.numel()} tokens in {len(blocks)} blocks; "
        f"model: {model.num_parameters():,} parameters")

    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / recipe.steps)))
    generator = torch.Generator().manual_seed(recipe.seed)
    model.train()
    for step in range(recipe.steps):
        batch = blocks[torch.randint(len(blocks), (recipe.batch_size,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == recipe.steps - 1:
            log(f"step {step:4d}  loss {loss.item():.3f}")
    model.eval()

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    inputs = tokenizer(EXAMPLE_PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=20)
    log(f"greedy: {tokenizer.decode(out[0], skip_special_tokens=True)!r}")
    log(f"saved to {output_dir} in {time.perf_counter() - start:.0f} s")
    return output_dir


MODEL_FILES = ("config.json", "model.safetensors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/build_model.py",
                                     description="Build the course's tiny Qwen3 model, or another small one.")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"where to save (default: the shipped copy, {_BUNDLED_MODEL_DIR}; "
                             "required with --quick and --other)")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--quick", action="store_true", help="small, fast build (what the tests run)")
    kind.add_argument("--other", action="store_true",
                      help="another small Qwen3 in seconds (other sizes, the bundled tokenizer), to run "
                           "the course with TRNLAB_MODEL=OUTPUT")
    parser.add_argument("--overwrite", action="store_true", help="replace a model already in --output")
    args = parser.parse_args(argv)
    recipe = OTHER if args.other else QUICK if args.quick else FULL
    output = args.output
    if output is None:
        if recipe is not FULL:
            parser.error(f"--{'other' if args.other else 'quick'} needs --output DIR: it never replaces the "
                         f"shipped model in {_BUNDLED_MODEL_DIR}")
        output = _BUNDLED_MODEL_DIR  # `make model`: rebuilding the shipped copy is the point
    elif recipe is not FULL and output.resolve() == _BUNDLED_MODEL_DIR.resolve():
        parser.error(f"--output {output} is the shipped model: give another folder")
    elif output.is_file():
        parser.error(f"--output {output} is a file: give a folder")
    elif any((output / name).exists() for name in MODEL_FILES) and not args.overwrite \
            and output.resolve() != _BUNDLED_MODEL_DIR.resolve():
        parser.error(f"{output} already holds a model: pass --overwrite to replace it, or give another folder")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    build(output, recipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
