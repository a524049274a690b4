"""What a request's outputs become in its answer (chapter 16): its n choices, each token's logprobs in OpenAI's two
formats (the legacy one of completions, chat's), vLLM's prompt_logprobs, and a named function's call, whole or
streamed.

The engine gives, per new token, a mapping from token id to `Logprob` holding the chosen token and the `logprobs`
likeliest ones (minillm.logprobs). Completions list them all per token (OpenAI's "the likeliest and the chosen");
chat lists the `top_logprobs` likeliest, by logprob. A logprob of -inf is written -9999.0 (JSON has no infinity;
vLLM's and OpenAI's value)."""

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache

from minillm.engine.output_processor import DeltaOutput
from minillm.entrypoints.openai.protocol import (
    ChatCompletionDelta,
    ChatCompletionMessage,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogprob,
    ChatLogprobContent,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogProbs,
    CompletionResponse,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    PromptLogprob,
    ToolCall,
    UsageInfo,
    random_id,
)
from minillm.logprobs import Logprob
from minillm.tokenizer import Tokenizer

MIN_LOGPROB = -9999.0  # what -inf is written as


def clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


@cache
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as a printable character: that character -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = printable + [256 + i for i in range(len(others))]
    return {chr(c): b for b, c in zip(printable + others, chars)}


class LogprobFormatter:
    """Logprobs in the answer's formats, each token's text as the engine decoded it (else the tokenizer's)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = type(tokenizer.hf.decoder).__name__ == "ByteLevel"

    def text(self, token_id: int, logprob: Logprob | None = None) -> str:
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def bytes(self, token_id: int, text: str) -> list[int]:
        """The token's own bytes: with a byte-level vocabulary, exactly (a token may hold part of a character,
        which its text shows as U+FFFD); else its text's UTF-8."""
        if self.byte_level:
            piece, alphabet = self.tokenizer.hf.id_to_token(token_id) or "", byte_level_alphabet()
            if piece and all(ch in alphabet for ch in piece):
                return [alphabet[ch] for ch in piece]
        return list(text.encode("utf-8", errors="replace"))

    def completion(
        self, token_ids: list[int], steps: list[dict[int, Logprob] | None], offset: int = 0
    ) -> tuple[CompletionLogProbs, int]:
        """OpenAI's legacy logprobs of these tokens, the first at text offset `offset`; and the offset after them.
        A token without logprobs (the prompt's first) has None."""
        out = CompletionLogProbs()
        for token_id, step in zip(token_ids, steps):
            chosen = None if step is None else step.get(token_id)
            token = self.text(token_id, chosen)
            out.tokens.append(token)
            out.token_logprobs.append(None if chosen is None else clamp(chosen.logprob))
            top = None if step is None else {self.text(i, lp): clamp(lp.logprob) for i, lp in step.items()}
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(token)
        return out, offset

    def chat(self, token_ids: list[int], steps: list[dict[int, Logprob] | None], top: int) -> ChatLogprobs:
        """Chat's logprobs of these tokens: each with its `top` likeliest alternatives."""
        content = []
        for token_id, step in zip(token_ids, steps):
            chosen = None if step is None else step.get(token_id)
            token = self.text(token_id, chosen)
            entry = ChatLogprobContent(token=token, bytes=self.bytes(token_id, token))
            if chosen is not None:
                entry.logprob = clamp(chosen.logprob)
                likeliest = sorted(step.items(), key=lambda item: -item[1].logprob)[:top]
                entry.top_logprobs = [
                    ChatLogprob(token=(t := self.text(i, lp)), logprob=clamp(lp.logprob), bytes=self.bytes(i, t))
                    for i, lp in likeliest
                ]
            content.append(entry)
        return ChatLogprobs(content=content)

    def prompt(self, prompt_logprobs: list[dict[int, Logprob] | None] | None) -> list | None:
        """vLLM's prompt_logprobs: per prompt token, {token id: {logprob, rank, decoded_token}} (none for the first)."""
        if prompt_logprobs is None:
            return None
        return [
            None
            if step is None
            else {
                i: PromptLogprob(logprob=clamp(lp.logprob), rank=lp.rank, decoded_token=lp.decoded_token)
                for i, lp in step.items()
            }  # fmt: skip
            for step in prompt_logprobs
        ]


def steps_of(out: DeltaOutput) -> list[dict[int, Logprob] | None]:
    """The output's logprobs, one per token (None each where the engine gave none)."""
    logprobs = getattr(out, "logprobs", None)
    return list(logprobs) if logprobs is not None else [None] * len(out.token_ids)


@dataclass
class Answer:
    """One of a request's n answers, whole."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob] | None] = field(default_factory=list)
    finish_reason: str | None = None


async def collect_answers(stream, n: int) -> tuple[list[Answer], list | None]:
    """The request's n answers, whole, and the prompt's logprobs (on its first output, when asked)."""
    answers, prompt_logprobs = [Answer() for _ in range(n)], None
    async for out in stream:
        answer = answers[getattr(out, "index", 0)]
        answer.text += out.text
        answer.token_ids += out.token_ids
        answer.logprobs += steps_of(out)
        answer.finish_reason = out.finish_reason or answer.finish_reason
        if prompt_logprobs is None:
            prompt_logprobs = getattr(out, "prompt_logprobs", None)
    return answers, prompt_logprobs


def merged(earlier: DeltaOutput, later: DeltaOutput) -> DeltaOutput:
    """Two outputs of the same answer as one (the earlier's other fields, the prompt's logprobs among them)."""
    logprobs = None
    if getattr(earlier, "logprobs", None) is not None or getattr(later, "logprobs", None) is not None:
        logprobs = steps_of(earlier) + steps_of(later)
    return replace(
        earlier,
        text=earlier.text + later.text,
        token_ids=earlier.token_ids + later.token_ids,
        finish_reason=later.finish_reason,
        logprobs=logprobs,
    )


class HeldStream:
    """A RequestStream whose outputs are held back, and merged per answer into the next one, while `hold(out)`:
    what sse_events skips (an output without text: its logprobs would be lost) or what is sent whole (the calls
    of tool_choice "required", parsed once complete). An answer's last output is never held."""

    def __init__(self, stream, hold: Callable[[DeltaOutput], bool]):
        self.stream, self.hold, self.held = stream, hold, {}
        self.prompt_token_ids = stream.prompt_token_ids
        self.prompt_logprobs, self.prompt_logprobs_sent = None, False

    def __aiter__(self):
        return self

    async def __anext__(self) -> DeltaOutput:
        while True:
            out = await self.stream.__anext__()
            if getattr(out, "prompt_logprobs", None) is not None:
                self.prompt_logprobs = out.prompt_logprobs
            index = getattr(out, "index", 0)
            if index in self.held:
                out = merged(self.held.pop(index), out)
            if out.finished or not self.hold(out):
                return self.with_prompt_logprobs(out)
            self.held[index] = out

    def with_prompt_logprobs(self, out: DeltaOutput) -> DeltaOutput:
        """The first output sent carries the prompt's logprobs, whichever answer held back the one that had them."""
        if self.prompt_logprobs is not None and not self.prompt_logprobs_sent:
            self.prompt_logprobs_sent = True
            return replace(out, prompt_logprobs=self.prompt_logprobs)
        return out

    def abort(self) -> None:
        self.stream.abort()


# ---- tool calls -----------------------------------------------------------------------------------------------


def named_call(name: str, arguments: str) -> ToolCall:
    return ToolCall(function=FunctionCall(name=name, arguments=arguments))


def required_calls(text: str) -> list[ToolCall] | None:
    """tool_choice "required": the generated JSON array of {"name", "parameters"} as tool calls; None if it does
    not parse (an answer cut short by max_tokens)."""
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not (isinstance(calls, list) and all(isinstance(c, dict) and "name" in c for c in calls)):
        return None
    return [named_call(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in calls]


@dataclass
class ToolMode:
    """How an answer becomes tool calls: `name` set, the whole text is that function's arguments; `required`, the
    text is a JSON array of calls."""

    name: str | None = None
    required: bool = False

    def message(self, text: str, finish_reason: str | None) -> tuple[ChatCompletionMessage, str | None]:
        """The answer's message and finish reason (as vLLM: "stop" for a named function, "tool_calls" for
        "required"; content "" beside tool calls, as vLLM's)."""
        if self.name is not None:
            return ChatCompletionMessage(content="", tool_calls=[named_call(self.name, text)]), finish_reason
        calls = required_calls(text)
        if calls is None:
            return ChatCompletionMessage(content=text), finish_reason
        return ChatCompletionMessage(content="", tool_calls=calls), "tool_calls" if finish_reason == "stop" else (
            finish_reason
        )


# ---- streamed chunks ------------------------------------------------------------------------------------------


class CompletionChunks:
    """chunk(out, usage, first) for sse_events, of a streamed completion: each answer's first chunk after the
    echoed prompt (and its logprobs, and its prompt_logprobs when asked); then its new text, and its tokens'
    logprobs at their offsets in its text."""

    def __init__(
        self,
        response_id: str,
        model_name: str,
        echo: str,
        prompt_token_ids: list[int],
        formatter: LogprobFormatter,
        num_logprobs: int | None,
        echo_logprobs: bool,
        with_prompt_logprobs: bool,
    ):
        self.response_id, self.model_name, self.echo = response_id, model_name, echo
        self.prompt_token_ids, self.formatter, self.num_logprobs = prompt_token_ids, formatter, num_logprobs
        self.echo_logprobs, self.with_prompt_logprobs = echo_logprobs, with_prompt_logprobs
        self.offsets: dict[int, int] = {}  # answer -> the text offset of its next token
        self.prompt_logprobs = None

    def __call__(self, out: DeltaOutput | None, usage_info: UsageInfo | None, first: bool) -> CompletionResponse:
        if out is None:
            return CompletionResponse(id=self.response_id, model=self.model_name, choices=[], usage=usage_info)
        index = getattr(out, "index", 0)
        if self.prompt_logprobs is None:
            self.prompt_logprobs = getattr(out, "prompt_logprobs", None)
        starts = index not in self.offsets
        token_ids, steps = out.token_ids, steps_of(out)
        if starts and self.echo_logprobs:
            prompt_steps = self.prompt_logprobs or [None] * len(self.prompt_token_ids)
            token_ids, steps = self.prompt_token_ids + token_ids, list(prompt_steps) + steps
        choice = CompletionChoice(
            index=index,
            text=self.echo * starts + out.text,
            finish_reason=out.finish_reason,
            token_ids=out.token_ids,
        )
        if self.num_logprobs is not None:
            choice.logprobs, self.offsets[index] = self.formatter.completion(
                token_ids, steps, self.offsets.get(index, 0)
            )
        else:
            self.offsets[index] = 0
        if starts and self.with_prompt_logprobs:
            choice.prompt_logprobs = self.formatter.prompt(self.prompt_logprobs)
        return CompletionResponse(id=self.response_id, model=self.model_name, choices=[choice])


class ChatChunks:
    """chunk(out, usage, first) for sse_events, of a streamed chat completion: each answer's first delta names the
    role; its text is content, or with a named function, the arguments of its one tool call (the first delta
    names the call); with "required", its calls whole (the stream is held until each answer ends). The first chunk
    carries the prompt's logprobs when asked."""

    def __init__(
        self,
        response_id: str,
        model_name: str,
        formatter: LogprobFormatter,
        top_logprobs: int | None,
        tool: ToolMode | None,
        with_prompt_logprobs: bool,
    ):
        self.response_id, self.model_name, self.formatter = response_id, model_name, formatter
        self.top_logprobs, self.tool, self.with_prompt_logprobs = top_logprobs, tool, with_prompt_logprobs
        self.started: set[int] = set()

    def __call__(self, out: DeltaOutput | None, usage_info: UsageInfo | None, first: bool):
        response = ChatCompletionStreamResponse(
            id=self.response_id, model=self.model_name, choices=[], usage=usage_info
        )
        if out is None:
            return response
        index = getattr(out, "index", 0)
        starts = index not in self.started
        self.started.add(index)
        delta, finish_reason = ChatCompletionDelta(role="assistant" if starts else None), out.finish_reason
        if self.tool is not None and self.tool.name is not None:
            call = DeltaToolCall(function=DeltaFunctionCall(arguments=out.text))
            if starts:
                call.id, call.type, call.function.name = random_id("chatcmpl-tool"), "function", self.tool.name
            delta.tool_calls = [call]
        elif self.tool is not None:  # required: the answer whole
            message, finish_reason = self.tool.message(out.text, out.finish_reason)
            delta.content = message.content
            if message.tool_calls:
                delta.tool_calls = [
                    DeltaToolCall(
                        index=j, id=c.id, type="function", function=DeltaFunctionCall(**c.function.model_dump())
                    )
                    for j, c in enumerate(message.tool_calls)
                ]
        else:
            delta.content = out.text
        choice = ChatCompletionStreamChoice(
            index=index, delta=delta, finish_reason=finish_reason, token_ids=out.token_ids
        )
        if self.top_logprobs is not None:
            choice.logprobs = self.formatter.chat(out.token_ids, steps_of(out), self.top_logprobs)
        response.choices = [choice]
        if first and self.with_prompt_logprobs:
            response.prompt_logprobs = self.formatter.prompt(getattr(out, "prompt_logprobs", None))
        return response


def hold_for(with_logprobs: bool, tool: ToolMode | None) -> Callable[[DeltaOutput], bool] | None:
    """What to hold back of a stream (HeldStream): with tool_choice "required", everything until each answer's
    end; with logprobs (or prompt logprobs), outputs without text: sse_events skips those, and would lose their
    logprobs."""
    if tool is not None and tool.required:
        return lambda out: True
    if with_logprobs:
        return lambda out: not out.text
    return None
