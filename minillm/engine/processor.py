"""Processor (vLLM's vllm/v1/engine/processor.py): the front end's checks and tokenization of a request, on the
caller's side of the client boundary, so that the engine core only ever sees token ids that fit. A prompt too long
to fit is refused on its characters, before any tokenizing; every refusal is a ValueError naming the problem and
the fix."""

import json
from dataclasses import replace
from pathlib import Path

import jinja2

from minillm.config import Config, ModelConfig
from minillm.engine.messages import EngineCoreRequest
from minillm.sampling_params import SamplingParams
from minillm.structured_output import validate_structured_outputs
from minillm.tokenizer import Tokenizer

# generation_config.json's name -> SamplingParams' (vLLM reads the same fields for its defaults)
GENERATION_DEFAULTS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "max_new_tokens": "max_tokens"}


class Processor:
    def __init__(self, config: Config, path: Path, model_config: ModelConfig, tokenizer: Tokenizer | None):
        self.config, self.model_path, self.tokenizer = config, path, tokenizer
        self.vocab_size = model_config.vocab_size
        self.num_kvcache_blocks: int | None = None  # told by the engine core once its cache is allocated
        # no token is longer than this many characters, so a prompt of more than max_model_len times as many cannot
        # fit (the vocabulary's longest token; vLLM bounds a prompt's characters the same way)
        self.max_chars_per_token = max(map(len, tokenizer.hf.get_vocab())) if tokenizer else 0

    def process(
        self, request_id: str, prompt: str | list[int], sampling_params: SamplingParams, priority: int = 0
    ) -> EngineCoreRequest:
        """Check and tokenize a request for the engine core."""
        if isinstance(prompt, str) and self.tokenizer is None:
            raise ValueError("this engine has no tokenizer (skip_tokenizer_init=True): give prompts as token id lists")
        max_len = self.config.max_model_len
        if isinstance(prompt, str) and len(prompt) > max_len * self.max_chars_per_token:
            raise ValueError(
                f"the prompt has {len(prompt)} characters, more than max_model_len={max_len} tokens can hold (a "
                f"token is at most {self.max_chars_per_token} characters here): shorten the prompt"
            )
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids or prompt == "":  # "" may encode to a lone BOS: say so rather than generate from nothing
            raise ValueError(
                "the prompt is empty: give at least one token (a non-empty string or id list; to "
                "generate from nothing, the id list of the BOS token)"
            )
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < self.vocab_size)]
        if bad:
            raise ValueError(f"unknown token ids {bad[:5]}: ids must be integers in [0, {self.vocab_size})")
        sampling_params = self.check_chapter_16(sampling_params)
        if sampling_params.top_k > self.vocab_size:
            raise ValueError(
                f"top_k must be at most the vocabulary's {self.vocab_size} tokens (or -1 / 0: no limit), "
                f"got {sampling_params.top_k}"
            )
        if sampling_params.prompt_logprobs is not None and len(ids) > self.config.max_num_batched_tokens:
            raise ValueError(
                f"prompt_logprobs needs the prompt ({len(ids)} tokens) in one forward pass, at most "
                f"max_num_batched_tokens={self.config.max_num_batched_tokens}: shorten the prompt or raise it"
            )
        total = len(ids) + sampling_params.max_tokens
        if total > max_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({sampling_params.max_tokens}) = {total} exceeds "
                f"max_model_len={max_len}: shorten the prompt or lower max_tokens"
            )
        block_size, have = self.config.kvcache_block_size, self.num_kvcache_blocks
        if have is not None and -(-total // block_size) > have:
            raise ValueError(
                f"the KV cache ({have} blocks of {block_size} tokens) cannot hold one request of {total} tokens "
                f"({-(-total // block_size)} blocks): raise num_kvcache_blocks or kvcache_memory_bytes, or lower "
                "max_tokens"
            )
        return EngineCoreRequest(request_id, ids, sampling_params, priority)

    def check_chapter_16(self, sp: SamplingParams) -> SamplingParams:
        """The rest of the sampling API (chapter 16), checked against this engine: token ids within the vocabulary,
        bad words as token ids (vLLM's way: each word alone and after a space), a grammar that compiles, and what
        this engine cannot combine refused, naming the setting to change."""
        if bad := [t for t in sp.logit_bias or {} if t >= self.vocab_size]:
            raise ValueError(
                f"logit_bias has unknown token ids {bad[:5]}: ids must be integers in [0, {self.vocab_size})"
            )
        if sp.bad_words:
            if self.tokenizer is None:
                raise ValueError("bad_words need the tokenizer, and this engine has none (skip_tokenizer_init=True)")
            words = {
                tuple(self.tokenizer.encode(p + w.strip(), add_special_tokens=False))
                for w in sp.bad_words
                for p in ("", " ")
            }
            sp = replace(sp, bad_words_token_ids=tuple(sorted(w for w in words if w)))
        if sp.structured_outputs is not None:
            if self.tokenizer is None:
                raise ValueError(
                    "structured_outputs need the tokenizer, and this engine has none (skip_tokenizer_init=True)"
                )
            validate_structured_outputs(sp.structured_outputs)
        if self.config.speculative_config and sp.needs_penalties:
            raise ValueError(
                "penalties, logit_bias, min_tokens and bad_words are not applied with speculative decoding here: drop "
                "them, or create the LLM without speculative_config"
            )
        pp = self.config.pipeline_parallel_size > 1
        if pp and (sp.n > 1 or sp.logprobs is not None or sp.structured_outputs is not None):
            raise ValueError(
                "n > 1, logprobs and structured_outputs are not supported with pipeline_parallel_size > 1: drop them, "
                "or use tensor_parallel_size"
            )
        if sp.prompt_logprobs is not None and (pp or self.config.tensor_parallel_size > 1):
            raise ValueError("prompt_logprobs is not supported with tensor or pipeline parallelism: drop it")
        return sp

    def default_sampling_params(self) -> SamplingParams:
        """As vLLM: SamplingParams' defaults, overridden by the sampling fields of the checkpoint's
        generation_config.json (temperature, top_k, top_p, max_new_tokens)."""
        file = self.model_path / "generation_config.json"
        gen = json.loads(file.read_text()) if file.is_file() else {}
        if gen.get("do_sample") is False:  # transformers' greedy switch
            gen["temperature"] = 0.0
        return SamplingParams(**{ours: gen[theirs] for theirs, ours in GENERATION_DEFAULTS.items() if theirs in gen})

    def encode_chat(
        self, messages, *, add_generation_prompt: bool = True, chat_template: str | None = None, tools=None
    ) -> list[list[int]]:
        """The prompt token ids of one conversation (a list of {"role", "content"} dicts) or of a list of them,
        rendered with the checkpoint's chat template (or `chat_template`: a Jinja string or a file holding one),
        which sees `tools` (OpenAI's function definitions), if any."""
        if self.tokenizer is None:
            raise ValueError("chat needs the tokenizer, and this engine has none (skip_tokenizer_init=True)")
        if chat_template is not None and "{" not in chat_template and Path(chat_template).is_file():
            chat_template = Path(chat_template).read_text()
        if not (chat_template or self.tokenizer.chat_template):
            raise ValueError(
                f"the model at {self.model_path} has no chat template (no chat_template.jinja, no chat_template in "
                "tokenizer_config.json), so it has no notion of turns: give it plain text to continue with "
                "generate(), or pass chat_template= (a Jinja template) to chat()"
            )
        try:
            texts = [
                self.tokenizer.apply_chat_template(conv, add_generation_prompt, chat_template, tools)
                for conv in conversations(messages)
            ]
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template refused the conversation: {e}") from None
        # the rendered text holds the template's own special tokens (BOS included, if it has one): add none
        return [self.tokenizer.encode(text, add_special_tokens=False) for text in texts]


def conversations(messages) -> list[list[dict]]:
    """One conversation or a list of them, as a list of conversations, each checked to be a non-empty list of
    {"role": str, "content": str} dicts."""
    example = 'e.g. [{"role": "user", "content": "Hello"}]'
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"the conversation is empty: give a list of messages, {example}, or a list of such lists")
    single = isinstance(messages[0], dict)
    convs = [messages] if single else list(messages)
    for i, conv in enumerate(convs):
        where = "" if single else f"conversation {i}: "
        if not isinstance(conv, (list, tuple)):
            raise ValueError(
                f"{where}{conv!r} is not a list of messages: give a list of messages, {example}, or "
                "a list of such lists"
            )
        if not conv:
            raise ValueError(f"{where}the conversation is empty: give a list of messages, {example}")
        for j, message in enumerate(conv):
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            ):
                raise ValueError(
                    f"{where}message {j} ({message!r}) is not a message: each is a dict with a "
                    f'"role" ("system", "user" or "assistant") and a "content" string, {example}'
                )
    return convs
