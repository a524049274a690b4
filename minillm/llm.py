"""LLM: the user-facing API. `LLM()` loads the embedded default model; `LLM(path)` any supported checkpoint."""
from minillm.engine.llm_engine import LLMEngine


class LLM(LLMEngine):
    """llm = LLM(); llm.generate(["Once upon a time"], SamplingParams(temperature=0.8, max_tokens=100))"""
