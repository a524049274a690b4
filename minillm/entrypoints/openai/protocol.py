"""The OpenAI API's requests and responses as pydantic models (the subset minillm serves, vLLM's names).

A request with a field this API does not know, or a value of the wrong type, is refused (400) naming the field,
rather than served as if the field were absent. `top_k`, `ignore_eos`, `stop_token_ids` and `return_token_ids`
are vLLM's extra sampling fields (the openai client sends them through `extra_body`)."""

import time
from typing import Annotated, Literal
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field

NonEmptyStr = Annotated[str, Field(min_length=1)]


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False  # one last chunk, with no choices, carries the usage


class SamplingFields(OpenAIBaseModel):
    """What completions and chat completions share: the model, sampling, stopping and streaming."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int = 1
    stop: NonEmptyStr | list[NonEmptyStr] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM: the prompt's and the completion's token ids in the response
    user: str | None = None  # an end-user id: accepted, not used


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    max_tokens: int | None = None


class ChatContentPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[ChatContentPart]

    def as_dict(self) -> dict:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": self.role, "content": content}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # the newer name of max_tokens; wins when both are given


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int = 0


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid4().hex}"


class ResponseBase(OpenAIBaseModel):
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None


class CompletionChoice(OpenAIBaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class CompletionResponse(ResponseBase):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ChatCompletionMessage(OpenAIBaseModel):
    role: Literal["assistant"] | None = "assistant"
    content: str | None = None


class ChatCompletionChoice(OpenAIBaseModel):
    index: int = 0
    message: ChatCompletionMessage
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(ResponseBase):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatCompletionChoice]


class ChatCompletionStreamChoice(OpenAIBaseModel):
    index: int = 0
    delta: ChatCompletionMessage
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(ResponseBase):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatCompletionStreamChoice]


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minillm"
    root: str
    max_model_len: int


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(OpenAIBaseModel):
    """vLLM's /tokenize: a prompt (add_special_tokens: the BOS, as /v1/completions adds it), or a conversation
    rendered with the chat template (as /v1/chat/completions does)."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool = True
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
