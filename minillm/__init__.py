"""minillm: an LLM inference engine built up chapter by chapter, in the spirit of vLLM."""

from minillm.config import default_model_path
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "default_model_path"]
