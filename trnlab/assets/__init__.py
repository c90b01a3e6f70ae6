"""The course's bundled assets: the seeded corpus and the tiny Qwen3 model built from it."""

from pathlib import Path

from trnlab.assets.corpus import EXAMPLE_PROMPT, generate_documents

#: Where the shipped model lives inside the package (``python tools/build_model.py`` rebuilds it).
BUNDLED_MODEL_DIR = Path(__file__).resolve().parent / "tiny-qwen3"

__all__ = ["BUNDLED_MODEL_DIR", "EXAMPLE_PROMPT", "generate_documents"]
