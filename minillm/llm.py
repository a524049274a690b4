"""LLM: the user-facing API. `LLM()` loads the embedded default model; `LLM(path)` any supported checkpoint;
`LLM("HuggingFaceTB/SmolLM2-135M-Instruct")` a hub id that minillm obtains offline (minillm.models.hub)."""

from minillm.engine.llm_engine import LLMEngine, RequestOutput
from minillm.sampling_params import SamplingParams


class LLM(LLMEngine):
    """llm = LLM(); llm.generate(["Once upon a time"], SamplingParams(temperature=0.8, max_tokens=100))

    llm = LLM("HuggingFaceTB/SmolLM2-135M-Instruct")
    llm.chat([{"role": "user", "content": "What is the capital of France?"}])[0].text
    """

    def __init__(self, model=None, **kwargs):
        super().__init__(model, **kwargs)
        self.model_path = self.processor.model_path

    def get_default_sampling_params(self) -> SamplingParams:
        """What chat() uses when given no SamplingParams, as vLLM: SamplingParams' defaults, overridden by the
        sampling fields of the checkpoint's generation_config.json (temperature, top_k, top_p, max_new_tokens)."""
        return self.processor.default_sampling_params()

    def encode_chat(
        self, messages, *, add_generation_prompt: bool = True, chat_template: str | None = None, tools=None
    ) -> list[list[int]]:
        """The prompt token ids of one conversation (a list of {"role", "content"} dicts) or of a list of them,
        rendered with the checkpoint's chat template (or `chat_template`: a Jinja string or a file holding one),
        which sees `tools` (OpenAI's function definitions), if any."""
        return self.processor.encode_chat(
            messages, add_generation_prompt=add_generation_prompt, chat_template=chat_template, tools=tools
        )

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: list[dict] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Answer one conversation ([{"role": "user", "content": "Hi"}]) or a list of them, as vLLM's LLM.chat:
        each is rendered with the chat template and generated like a prompt of generate(); one RequestOutput per
        conversation, in order. The answer ends at the model's end-of-turn token (its EOS)."""
        prompts = self.encode_chat(
            messages, add_generation_prompt=add_generation_prompt, chat_template=chat_template, tools=tools
        )
        return self.generate(prompts, sampling_params or self.get_default_sampling_params(), use_tqdm=use_tqdm)
