"""The OpenAI API's requests and responses as pydantic models (the subset minillm serves, vLLM's names).

A request with a field this API does not know, a value of the wrong JSON type ("3" for an integer, true for a
number) or out of its bounds, is refused (400) naming the field, rather than served as if the field were absent or
coerced. The bounds are Field constraints, so /openapi.json publishes exactly what the server accepts: seed an
int64 (vLLM's bound), top_k >= -1, top_p in (0, 1], temperature >= 0, max_tokens >= 1, a non-empty prompt, and a
length for every list. `top_k`, `ignore_eos`, `stop_token_ids`, `return_token_ids`, `skip_special_tokens` and
`echo` are vLLM's extra sampling fields (the openai client sends them through `extra_body`). A load balancer in
front (vllm-router, chapter 15) adds fields of vLLM's and SGLang's at their defaults: those minillm does not
implement are accepted at the value that changes nothing (`Off`), and refused at any other naming the field."""

import time
from typing import Annotated, Literal
from uuid import uuid4

import torch
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from minillm.sampling_params import MAX_STOP_TOKEN_IDS

_LONG_INFO = torch.iinfo(torch.long)  # a seed must fit an int64, as in SamplingParams

MAX_STOP_STRINGS = 64  # every new piece of text is searched for each stop string
MAX_STOP_STRING_CHARS = 256  # a stop string holds the streamed text back by its length, less one character
MAX_MESSAGES = 4096  # each turn costs a few template tokens: more turns fit no context minillm serves
MAX_TOKEN_IDS = 1 << 18  # twice the longest context of today's open models (128k tokens)


def whole_number(value):
    """3.0 as 3: JSON Schema's "integer" is any number without a fractional part (strict pydantic wants an int)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(**bounds):
    """The type of an integer field with these bounds (ge=, le=), which takes 3.0 as 3. The bounds come before
    the validator, or pydantic cannot publish them as JSON Schema's minimum and maximum."""
    return Annotated[int, Field(**bounds), BeforeValidator(whole_number)]


# vLLM's bound on a seed. Published as `< 2**63` rather than `<= 2**63 - 1`: JSON schema readers (FastAPI's
# OpenAPI model among them) take bounds as doubles, which hold 2**63 exactly and 2**63 - 1 not at all
Int64 = Annotated[
    integer(ge=_LONG_INFO.min, le=_LONG_INFO.max),
    WithJsonSchema(
        {"type": "integer", "format": "int64", "minimum": _LONG_INFO.min, "exclusiveMaximum": _LONG_INFO.max + 1}
    ),
]


def off(why: str):
    """The type of a field minillm accepts only as false (what a router sends): true is refused with `why`."""

    def check(value: bool) -> bool:
        if value:
            raise PydanticCustomError("unsupported", why)
        return value

    return Annotated[bool, AfterValidator(check), WithJsonSchema({"type": "boolean", "const": False})]


NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenId = integer(ge=0)
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIRequestModel(OpenAIBaseModel):
    """A request body or a part of one, validated strictly: JSON's own types only, and no NaN or Infinity (which
    Python's json module reads, JSON does not have)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    """Every answer other than 200, as OpenAI's API gives it: `param` names the request field at fault."""

    error: ErrorInfo


class StreamOptions(OpenAIRequestModel):
    include_usage: bool = False  # one last chunk, with no choices, carries the usage


class SamplingFields(OpenAIRequestModel):
    """What completions and chat completions share: the model, sampling, stopping and streaming."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0, description="0: greedy; (0, 0.01) is raised to 0.01 (as vLLM)")
    top_p: float | None = Field(None, gt=0, le=1, description="1: no limit")
    top_k: integer(ge=-1) | None = Field(None, description="0 or -1: no limit; at most the vocabulary size")
    seed: Int64 | None = None
    n: integer(ge=1, le=1) = Field(1, description="minillm returns one choice: send n requests for n")
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM: the prompt's and the completion's token ids in the response
    skip_special_tokens: bool = Field(True, description="leave special tokens (EOS, chat markers) out of the text")
    no_stop_trim: off("minillm always leaves the stop string out of the text: no_stop_trim must be false") = False
    return_hidden_states: off("minillm returns no hidden states: return_hidden_states must be false") = False
    user: str | None = None  # an end-user id: accepted, not used


class CompletionRequest(SamplingFields):
    prompt: NonEmptyStr | Annotated[list[TokenId], Field(min_length=1, max_length=MAX_TOKEN_IDS)]
    max_tokens: integer(ge=1) | None = None
    echo: bool = Field(False, description="the prompt's text before the completion's")


class ChatContentPart(OpenAIRequestModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIRequestModel):
    role: str
    content: str | list[ChatContentPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def as_dict(self) -> dict:
        return {"role": self.role, "content": self.text}


Messages = Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]


class ChatCompletionRequest(SamplingFields):
    messages: Messages
    max_tokens: integer(ge=1) | None = None
    max_completion_tokens: integer(ge=1) | None = Field(None, description="the newer name of max_tokens; wins over it")
    logprobs: off("minillm does not return log-probabilities yet: logprobs must be false") | None = None
    continue_final_message: off("minillm starts a new assistant turn: continue_final_message must be false") = False
    # SGLang's reasoning fields: minillm runs no reasoning parser, so there is nothing to separate, stream or include
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    include_reasoning: bool = True


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


class TokenizeRequest(OpenAIRequestModel):
    """vLLM's /tokenize: a prompt (add_special_tokens: the BOS, as /v1/completions adds it), or a conversation
    rendered with the chat template (as /v1/chat/completions does); one of the two, as the schema's oneOf says."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
            ]
        }
    )

    model: str | None = None
    prompt: NonEmptyStr | None = None
    add_special_tokens: bool = True
    messages: Messages | None = None
    add_generation_prompt: bool = True


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(OpenAIRequestModel):
    model: str | None = None
    tokens: Annotated[list[TokenId], Field(max_length=MAX_TOKEN_IDS)]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
