"""LLM: the user-facing API. `LLM()` loads the embedded default model; `LLM(path)` any supported checkpoint;
`LLM("HuggingFaceTB/SmolLM2-135M-Instruct")` a hub id that minillm obtains offline (minillm.models.hub)."""

import json
from pathlib import Path

from minillm.config import default_model_path
from minillm.engine.llm_engine import LLMEngine, RequestOutput
from minillm.sampling_params import SamplingParams
from minillm.utils.loader import resolve_model_path

# generation_config.json's name -> SamplingParams' (vLLM reads the same fields for its defaults)
GENERATION_DEFAULTS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "max_new_tokens": "max_tokens"}


class LLM(LLMEngine):
    """llm = LLM(); llm.generate(["Once upon a time"], SamplingParams(temperature=0.8, max_tokens=100))

    llm = LLM("HuggingFaceTB/SmolLM2-135M-Instruct")
    llm.chat([{"role": "user", "content": "What is the capital of France?"}])[0].text
    """

    def __init__(self, model=None, **kwargs):
        super().__init__(model, **kwargs)
        self.model_path = resolve_model_path(model if model is not None else default_model_path())

    def get_default_sampling_params(self) -> SamplingParams:
        """What chat() uses when given no SamplingParams, as vLLM: SamplingParams' defaults, overridden by the
        sampling fields of the checkpoint's generation_config.json (temperature, top_k, top_p, max_new_tokens)."""
        file = self.model_path / "generation_config.json"
        gen = json.loads(file.read_text()) if file.is_file() else {}
        if gen.get("do_sample") is False:  # transformers' greedy switch
            gen["temperature"] = 0.0
        return SamplingParams(**{ours: gen[theirs] for theirs, ours in GENERATION_DEFAULTS.items() if theirs in gen})

    def encode_chat(
        self, messages, *, add_generation_prompt: bool = True, chat_template: str | None = None
    ) -> list[list[int]]:
        """The prompt token ids of one conversation (a list of {"role", "content"} dicts) or of a list of them,
        rendered with the checkpoint's chat template (or `chat_template`: a Jinja string or a file holding one)."""
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
        texts = [
            self.tokenizer.apply_chat_template(conv, add_generation_prompt, chat_template)
            for conv in conversations(messages)
        ]
        # the rendered text holds the template's own special tokens (BOS included, if it has one): add none
        return [self.tokenizer.encode(text, add_special_tokens=False) for text in texts]

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Answer one conversation ([{"role": "user", "content": "Hi"}]) or a list of them, as vLLM's LLM.chat:
        each is rendered with the chat template and generated like a prompt of generate(); one RequestOutput per
        conversation, in order. The answer ends at the model's end-of-turn token (its EOS)."""
        prompts = self.encode_chat(messages, add_generation_prompt=add_generation_prompt, chat_template=chat_template)
        return self.generate(prompts, sampling_params or self.get_default_sampling_params(), use_tqdm=use_tqdm)


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
