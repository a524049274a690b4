"""The OpenAI API's requests and responses as pydantic models (the subset minillm serves, vLLM's names).

A request with a field this API does not know, a value of the wrong JSON type ("3" for an integer, true for a
number) or out of its bounds, is refused (400) naming the field, rather than served as if the field were absent or
coerced. The bounds are Field constraints, so /openapi.json publishes exactly what the server accepts: seed an
int64 (vLLM's bound), top_k >= -1, top_p in (0, 1], temperature >= 0, max_tokens >= 1, a non-empty prompt, and a
length for every list. `top_k`, `ignore_eos`, `stop_token_ids`, `return_token_ids`, `skip_special_tokens` and
`echo` are vLLM's extra sampling fields (the openai client sends them through `extra_body`). A load balancer in
front (vllm-router, chapter 15) adds fields of vLLM's and SGLang's at their defaults: those minillm does not
implement are accepted at the value that changes nothing (`Off`), and refused at any other naming the field.

Chapter 16 adds the rest of the sampling API, with SamplingParams' bounds: `n` answers, `logprobs` (completions:
the top alternatives per token, 0 to 20; chat: `logprobs: true` and `top_logprobs`), vLLM's `prompt_logprobs`,
`min_p`, the three penalties, `logit_bias` (OpenAI's string keys), `min_tokens`, `bad_words`; structured outputs
through OpenAI's `response_format` or vLLM's `structured_outputs`; and named function calling (`tools` and a
`tool_choice` naming one of them)."""

import time
from typing import Annotated, ClassVar, Literal
from uuid import uuid4

import torch
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from minillm.sampling_params import MAX_LOGPROBS, MAX_STOP_TOKEN_IDS

_LONG_INFO = torch.iinfo(torch.long)  # a seed must fit an int64, as in SamplingParams

MAX_STOP_STRINGS = 64  # every new piece of text is searched for each stop string
MAX_STOP_STRING_CHARS = 256  # a stop string holds the streamed text back by its length, less one character
MAX_MESSAGES = 4096  # each turn costs a few template tokens: more turns fit no context minillm serves
MAX_TOKEN_IDS = 1 << 18  # twice the longest context of today's open models (128k tokens)
MAX_N = 128  # answers to one request (SamplingParams' bound, OpenAI's too)
MAX_BAD_WORDS = 256  # each is turned into token ids and banned at every step
MAX_CHOICES = 1024  # structured_outputs.choice: the grammar is an alternation of them all
MAX_TOOLS = 128  # OpenAI's bound on a request's tools
TOKEN_ID_KEY = r"^(0|[1-9][0-9]*)$"  # a token id written as a JSON object's key: logit_bias' (OpenAI's)


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
NumLogprobs = integer(ge=0, le=MAX_LOGPROBS)
Penalty = Annotated[float, Field(ge=-2, le=2)]
# a word with at least one character that is not whitespace (what SamplingParams takes)
BadWord = Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS, pattern=r"\S")]
# token id (a string of digits, as OpenAI's JSON has it) -> bias added to its logit; /openapi.json bounds the ids
# by the served vocabulary
LogitBias = Annotated[
    dict[Annotated[str, Field(pattern=TOKEN_ID_KEY)], Annotated[float, Field(ge=-100, le=100)]],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": TOKEN_ID_KEY},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            "description": "token id (a string, as OpenAI's) -> a bias in [-100, 100] added to its logit",
        }
    ),
]


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # fields left out of the JSON when None, rather than written as null (vLLM leaves out a message's empty
    # tool_calls; minillm its prompt_logprobs too, unless asked)
    omitted_when_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_when_none(self, handler):
        data = handler(self)
        for name in self.omitted_when_none:
            if name in data and data[name] is None:
                del data[name]
        return data


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


def exactly_one_of(*names: str, true: tuple[str, ...] = ()) -> dict:
    """JSON Schema's "exactly one of these fields is given" (not null; those in `true`: true), as a oneOf."""
    return {
        "oneOf": [
            {"required": [n], "properties": {n: {"const": True} if n in true else {"not": {"type": "null"}}}}
            for n in names
        ]
    }


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


class StructuredOutputs(OpenAIRequestModel):
    """vLLM's structured_outputs: what the output must match, exactly one of a JSON schema (an object or its JSON
    text), any JSON object, a regular expression, one of a list of strings, or an EBNF grammar (xgrammar's GBNF).
    One that does not compile is refused (400)."""

    model_config = ConfigDict(json_schema_extra=exactly_one_of(*STRUCTURED_KINDS, true=("json_object",)))

    json_schema: dict | NonEmptyStr | None = Field(None, alias="json", description="a JSON schema")
    regex: NonEmptyStr | None = None
    choice: Annotated[list[NonEmptyStr], Field(min_length=1, max_length=MAX_CHOICES)] | None = None
    grammar: NonEmptyStr | None = Field(None, description="an EBNF grammar (GBNF, as xgrammar and llama.cpp)")
    json_object: Literal[True] | None = Field(None, description="any JSON object")

    @model_validator(mode="after")
    def one_kind(self):
        given = [kind for kind in STRUCTURED_KINDS if self.get(kind) is not None]
        if len(given) != 1:
            raise PydanticCustomError(
                "structured_outputs",
                "give exactly one of json (a JSON schema), json_object, regex, choice or grammar, got {given}",
                {"given": given or "none"},
            )
        return self

    def get(self, kind: str):
        return self.json_schema if kind == "json" else getattr(self, kind)


class JsonSchemaSpec(OpenAIRequestModel):
    """OpenAI's response_format.json_schema: the schema every answer must validate against (always strictly)."""

    name: NonEmptyStr
    description: str | None = None
    schema_: dict = Field(alias="schema", description="a JSON schema")
    strict: bool | None = Field(None, description="minillm always keeps to the schema")


class TextFormat(OpenAIRequestModel):
    type: Literal["text"]


class JsonObjectFormat(OpenAIRequestModel):
    type: Literal["json_object"]


class JsonSchemaFormat(OpenAIRequestModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class SamplingFields(OpenAIRequestModel):
    """What completions and chat completions share: the model, sampling, stopping and streaming."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0, description="0: greedy; (0, 0.01) is raised to 0.01 (as vLLM)")
    top_p: float | None = Field(None, gt=0, le=1, description="1: no limit")
    top_k: integer(ge=-1) | None = Field(None, description="0 or -1: no limit; at most the vocabulary size")
    seed: Int64 | None = None
    n: integer(ge=1, le=MAX_N) = Field(1, description="answers to sample (they share the prompt's KV blocks)")
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
    # chapter 16: the rest of the sampling API (vLLM's names; SamplingParams' bounds)
    min_p: float | None = Field(None, ge=0, le=1, description="drop tokens less likely than min_p times the top one")
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: float | None = Field(None, gt=0, le=100, description="1: off (vLLM's)")
    logit_bias: LogitBias | None = None
    min_tokens: integer(ge=0) = Field(0, description="no EOS or stop token before this many (at most max_tokens)")
    bad_words: Annotated[list[BadWord], Field(max_length=MAX_BAD_WORDS)] | None = None
    prompt_logprobs: NumLogprobs | None = Field(None, description="vLLM's: each prompt token's logprob and top ones")
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's; response_format's or this, not both

    def structured(self) -> tuple[str, dict] | None:
        """(the request field it comes from, StructuredOutputsParams' keywords) of the output's constraint."""
        if self.response_format is not None and self.structured_outputs is not None:
            if self.response_format.type != "text":
                raise ValueError("give response_format or structured_outputs, not both")
        if isinstance(self.response_format, JsonObjectFormat):
            return "response_format", {"json_object": True}
        if isinstance(self.response_format, JsonSchemaFormat):
            return "response_format", {"json": self.response_format.json_schema.schema_}
        if self.structured_outputs is not None:
            kind = next(k for k in STRUCTURED_KINDS if self.structured_outputs.get(k) is not None)
            return "structured_outputs", {kind: self.structured_outputs.get(kind)}
        return None


class CompletionRequest(SamplingFields):
    prompt: NonEmptyStr | Annotated[list[TokenId], Field(min_length=1, max_length=MAX_TOKEN_IDS)]
    max_tokens: integer(ge=1) | None = None
    echo: bool = Field(False, description="the prompt's text before the completion's")
    logprobs: NumLogprobs | None = Field(
        None, description="each token's logprob and those of the `logprobs` likeliest (OpenAI's legacy format)"
    )

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def num_prompt_logprobs(self) -> int | None:
        """vLLM's: with echo and logprobs, the prompt's tokens have theirs too."""
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, self.prompt_logprobs or 0)
        return self.prompt_logprobs


class ChatContentPart(OpenAIRequestModel):
    type: Literal["text"]
    text: str


class FunctionDefinition(OpenAIRequestModel):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict | None = Field(None, description="a JSON schema of the arguments (none: an object)")
    strict: bool | None = Field(None, description="minillm always keeps to the schema")


class Tool(OpenAIRequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIRequestModel):
    name: NonEmptyStr


class NamedToolChoice(OpenAIRequestModel):
    type: Literal["function"] = "function"
    function: NamedFunction


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
    logprobs: bool | None = Field(False, description="each token's logprob, with top_logprobs alternatives")
    top_logprobs: NumLogprobs | None = Field(None, description="the likeliest alternatives per token (needs logprobs)")
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None,
        description='a function named: its arguments generated under its parameters\' schema; "required": one or '
        'more calls of the tools; "none": no call. "auto" (the default with tools) needs a tool parser, which '
        "minillm does not have",
    )
    parallel_tool_calls: bool | None = Field(None, description='false: "required" makes one call only')
    continue_final_message: off("minillm starts a new assistant turn: continue_final_message must be false") = False
    # SGLang's reasoning fields: minillm runs no reasoning parser, so there is nothing to separate, stream or include
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    include_reasoning: bool = True

    # top_logprobs above 0 needs logprobs: true (vLLM's rule: the server checks it, the schema publishes it)
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
            "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        }
    )

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def num_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs


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


class PromptLogprob(OpenAIBaseModel):
    """vLLM's Logprob: a token's log-probability, its rank in the vocabulary (1: the likeliest) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's prompt_logprobs: per prompt token, its logprob and the top ones by token id; none for the first token
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionLogProbs(OpenAIBaseModel):
    """OpenAI's legacy logprobs: per token, its text, its logprob, the likeliest alternatives' and where its text
    begins in the choice's text (-inf is written -9999.0, as vLLM and OpenAI)."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(OpenAIBaseModel):
    omitted_when_none = ("prompt_logprobs",)

    index: int = 0
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(ResponseBase):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ChatLogprob(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None  # the token's UTF-8 bytes (a token may hold part of a character)


class ChatLogprobContent(ChatLogprob):
    top_logprobs: list[ChatLogprob] = Field(default_factory=list)


class ChatLogprobs(OpenAIBaseModel):
    content: list[ChatLogprobContent] | None = None


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str  # JSON text, generated under the function's parameters schema


class ToolCall(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl-tool"))
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatCompletionMessage(OpenAIBaseModel):
    omitted_when_none = ("tool_calls",)

    role: Literal["assistant"] | None = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatCompletionChoice(OpenAIBaseModel):
    index: int = 0
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(ResponseBase):
    omitted_when_none = ("prompt_logprobs",)

    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatCompletionChoice]
    prompt_logprobs: PromptLogprobs | None = None


class DeltaFunctionCall(OpenAIBaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(OpenAIBaseModel):
    """A piece of a streamed tool call: the first names it (id, type, name), the others add to its arguments."""

    index: int = 0
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class ChatCompletionDelta(OpenAIBaseModel):
    omitted_when_none = ("tool_calls",)

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionStreamChoice(OpenAIBaseModel):
    index: int = 0
    delta: ChatCompletionDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(ResponseBase):
    omitted_when_none = ("prompt_logprobs",)

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatCompletionStreamChoice]
    prompt_logprobs: PromptLogprobs | None = None


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
