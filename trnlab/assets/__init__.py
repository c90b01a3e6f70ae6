"""The course's bundled assets: the seeded corpus and the tiny Qwen3 model built from it."""

from trnlab.assets.build import BUNDLED_MODEL_DIR, build
from trnlab.assets.corpus import EXAMPLE_PROMPT, generate_documents

__all__ = ["BUNDLED_MODEL_DIR", "EXAMPLE_PROMPT", "build", "generate_documents"]
