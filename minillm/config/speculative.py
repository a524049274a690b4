"""Speculative decoding's settings (chapter 13): vLLM's speculative_config, checked."""

from dataclasses import dataclass

SPECULATIVE_METHODS = ("ngram", "draft_model")  # Config.speculative_config["method"] (minillm.spec_decode)


@dataclass
class SpeculativeConfig:
    """vLLM's speculative_config: {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n,
    "prompt_lookup_min": m} or {"method": "draft_model", "model": ID|DIR|FILE.gguf, "num_speculative_tokens": k}.
    A draft model has its own "quantization" and "kv_cache_dtype" (Config's values; float weights and a cache of
    the model's dtype unless given, a .gguf file "gguf"), whatever the target's are."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str = "auto"

    @classmethod
    def from_dict(cls, config: dict) -> "SpeculativeConfig":
        known = set(cls.__dataclass_fields__)
        if not isinstance(config, dict) or set(config) - known:
            raise ValueError(
                f"speculative_config must be a dict with keys among {sorted(known)}, got {config!r}: e.g. "
                '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
            )
        spec = cls(**{"method": None, "num_speculative_tokens": None, **config})
        if spec.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_config method must be one of {', '.join(SPECULATIVE_METHODS)}, got {spec.method!r}"
            )
        k = spec.num_speculative_tokens
        if not (isinstance(k, int) and k >= 1):
            raise ValueError(f"speculative_config num_speculative_tokens must be an integer >= 1, got {k!r}")
        if spec.method == "ngram":  # as vLLM: one bound given stands for both; neither, 5
            spec.prompt_lookup_max = spec.prompt_lookup_max or spec.prompt_lookup_min or 5
            spec.prompt_lookup_min = spec.prompt_lookup_min or spec.prompt_lookup_max
            n_min, n_max = spec.prompt_lookup_min, spec.prompt_lookup_max
            if not (isinstance(n_min, int) and isinstance(n_max, int) and 1 <= n_min <= n_max):
                raise ValueError(
                    f"speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max, got {n_min!r} and {n_max!r}"
                )
        elif spec.model is None:
            raise ValueError('speculative_config method "draft_model" needs "model": a checkpoint directory or hub id')
        elif str(spec.model).endswith(".gguf") and "quantization" not in config:
            spec.quantization = "gguf"  # a GGUF file runs as it is stored, as a target's does
        return spec
