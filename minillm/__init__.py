"""minillm: an LLM inference engine built up chapter by chapter, in the spirit of vLLM."""
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"


def default_model_path() -> Path:
    """The embedded default model: a small story-telling Qwen3 that ships inside the package."""
    return ASSETS / "default_model"
