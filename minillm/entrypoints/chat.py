"""python -m minillm.chat: talk to a model in the terminal, its answer streamed token by token.

The conversation is kept (each turn is sent with the ones before it, rendered by the model's chat template) until
/reset; /exit, Ctrl-D or Ctrl-C at the prompt quits; Ctrl-C during an answer stops that answer. The default model is
the real SmolLM2-135M-Instruct when its package is installed, else the embedded story model, which has no chat
template: each line is then continued as text.
"""

import argparse
import dataclasses
import sys
from typing import Iterator

from minillm.config import default_model_path
from minillm.entrypoints import COMPILED_BATCH_1, ENFORCE_EAGER_HELP
from minillm.llm import LLM
from minillm.models.hub import KNOWN_MODELS, checkpoint_dir, is_complete
from minillm.sampling_params import SamplingParams

REAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def default_model() -> tuple[str, str | None]:
    """The model to chat with when none is named, and a note when it is not the real one."""
    known = KNOWN_MODELS[REAL_MODEL]
    if known.source() is not None or is_complete(checkpoint_dir(REAL_MODEL), None):
        return REAL_MODEL, None
    return str(default_model_path()), (
        f"{REAL_MODEL} is not installed (`{known.pip}`, or make setup): using the embedded story model"
    )


class ChatSession:
    """A conversation with one engine: send() streams the answer and records both turns; reset() forgets them."""

    def __init__(self, llm: LLM, sampling_params, system: str | None = None):
        self.llm, self.sampling_params, self.system = llm, sampling_params, system
        self.is_chat = bool(llm.tokenizer.chat_template)  # without a template, each line is continued as text
        self.messages: list[dict] = []
        self.dropped = 0  # turns dropped from the front to fit the context (max_model_len)
        self.finish_reason: str | None = None
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system and self.is_chat else []

    def prompt(self, text: str) -> list[int]:
        if not self.is_chat:
            return self.llm.tokenizer.encode(text)
        return self.llm.encode_chat(self.messages + [{"role": "user", "content": text}])[0]

    def fit(self, text: str) -> list[int]:
        """The prompt ids, with the oldest turns dropped while the prompt and the answer would not fit."""
        ids = self.prompt(text)
        limit = self.llm.config.max_model_len - self.sampling_params.max_tokens
        first = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        while len(ids) > limit and len(self.messages) > first:
            del self.messages[first : first + 2]  # one user turn and its answer
            self.dropped += 1
            ids = self.prompt(text)
        return ids

    def send(self, text: str) -> Iterator[str]:
        """Yield the answer's text as it is produced; once it is complete, the turn joins the conversation.
        An answer closed early (Ctrl-C) leaves the conversation as it was."""
        pieces, last = [], None
        for out in self.llm.stream([self.fit(text)], self.sampling_params):
            pieces.append(out.text)
            last = out.token_id
            yield out.text
        stopped = last in self.llm.scheduler.eos_token_ids or last in self.sampling_params.stop_token_ids
        self.finish_reason = "length" if len(pieces) >= self.sampling_params.max_tokens and not stopped else "stop"
        if self.is_chat:
            self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "".join(pieces)}]


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m minillm.chat", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        help=f"a hub id minillm obtains offline ({', '.join(KNOWN_MODELS)}) or a "
        "checkpoint directory; default: SmolLM2 when installed, else the embedded model",
    )
    parser.add_argument("--temperature", type=float, help="0 = greedy; default: the model's generation_config")
    parser.add_argument("--max-tokens", type=int, default=256, help="longest answer, in tokens (default 256)")
    parser.add_argument("--system", help="a system prompt (default: the chat template's own, if it has one)")
    parser.add_argument("--enforce-eager", action="store_true", help=ENFORCE_EAGER_HELP)
    return parser.parse_args(argv)


def main(argv=None, input=input, out=sys.stdout) -> int:
    args = parse_args(argv)
    chosen = {"max_tokens": args.max_tokens, **({} if args.temperature is None else {"temperature": args.temperature})}
    try:
        SamplingParams(**chosen)  # checked before the model loads
    except ValueError as e:
        print(f"python -m minillm.chat: {e}", file=sys.stderr)
        return 2
    model, note = (args.model, None) if args.model else default_model()
    if note:
        print(note, file=out)
    try:
        llm = LLM(model, **({} if args.enforce_eager else COMPILED_BATCH_1))
    except KeyboardInterrupt:  # Ctrl-C while the model loads (or converts, on first use)
        print(file=out)
        return 130
    sampling_params = dataclasses.replace(llm.get_default_sampling_params(), **chosen)
    session = ChatSession(llm, sampling_params, args.system)
    how = (
        "/reset forgets the conversation, /exit or Ctrl-D quits"
        if session.is_chat
        else "it has no chat template, so each line you type is continued as text; /exit or Ctrl-D quits"
    )
    print(f"minillm chat with {model}: {how}.", file=out)
    try:
        import readline  # noqa: F401  (line editing and the ↑ history, for input() at a terminal)
    except ImportError:
        pass
    while True:
        try:
            text = input(">>> " if session.is_chat else "... ").strip()
        except (EOFError, KeyboardInterrupt):
            print(file=out)
            return 0
        if text in ("/exit", "/quit", "/bye"):
            return 0
        if text == "/reset":
            session.reset()
            print("(conversation forgotten)", file=out)
            continue
        if not text:
            continue
        if not session.is_chat:
            print(text, end="", file=out)  # the continuation follows the line it continues
        dropped = session.dropped
        try:
            for piece in session.send(text):
                print(piece, end="", file=out, flush=True)
        except KeyboardInterrupt:
            print("\n(answer stopped)", file=out)
            continue
        except ValueError as e:  # the line alone does not fit the context
            print(f"\n({e})", file=out)
            continue
        print(file=out)
        if session.dropped > dropped:
            print(
                f"(the oldest {session.dropped - dropped} turn(s) were dropped to fit max_model_len="
                f"{llm.config.max_model_len})",
                file=out,
            )
        if session.finish_reason == "length":
            print(f"(stopped at --max-tokens {args.max_tokens})", file=out)


if __name__ == "__main__":
    sys.exit(main())
