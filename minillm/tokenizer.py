"""Text <-> token ids over a Hugging Face tokenizer.json, with a chat template and incremental detokenization."""
import json
from pathlib import Path

import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer


def bpe_encode_word(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Split one pre-tokenized word into BPE tokens by replaying the learned merges.

    `word` is written in the byte-level alphabet of tokenizer.json (one character per byte, a leading space
    shown as "Ġ"). Start from its single characters; then, again and again, merge the adjacent pair whose
    merge was learned first (lowest rank), the leftmost one if it occurs twice, until no adjacent pair is in
    `ranks`. With ranks {("h", "e"): 0, ("Ġ", "t"): 1, ("Ġt", "he"): 2}: "Ġthe" -> ["Ġ", "t", "h", "e"]
    -> ["Ġ", "t", "he"] -> ["Ġt", "he"] -> ["Ġthe"].
    """
    # BEGIN EXERCISE 01.1: BPE encode — from single characters, merge the lowest-ranked adjacent pair, repeat
    pieces = list(word)
    while len(pieces) > 1:
        rank, i = min((ranks.get(pair, float("inf")), i) for i, pair in enumerate(zip(pieces, pieces[1:])))
        if rank == float("inf"):
            break
        pieces[i:i + 2] = [pieces[i] + pieces[i + 1]]
    return pieces
    # END EXERCISE


def load_bpe_ranks(path: str | Path) -> dict[tuple[str, str], int]:
    """The merges of a tokenizer.json (or of the tokenizer.json in directory `path`): pair -> rank, 0 = first."""
    path = Path(path)
    model = json.loads((path / "tokenizer.json" if path.is_dir() else path).read_text())["model"]
    pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return {pair: rank for rank, pair in enumerate(pairs)}


def detokenize_incrementally(tokenizer, ids: list[int], prefix_offset: int, read_offset: int):
    """Text that the newest token adds, without breaking a character that spans several tokens.

    ids[:read_offset] have already been printed. Decoding only a short window, ids[prefix_offset:], keeps the
    work constant per token; the window starts a few tokens back because a token's text can depend on the
    one before it (a leading space, a multi-byte character). A window ending in "\ufffd" is an unfinished
    UTF-8 character: print nothing yet. Returns (new_text, prefix_offset, read_offset).
    """
    # BEGIN EXERCISE 01.2: incremental detokenization — decode the window, hold back unfinished characters
    prefix_text = tokenizer.decode(ids[prefix_offset:read_offset])
    text = tokenizer.decode(ids[prefix_offset:])
    if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
        return text[len(prefix_text):], read_offset, len(ids)
    return "", prefix_offset, read_offset
    # END EXERCISE


class Tokenizer:
    """Encode and decode with a checkpoint's tokenizer.json; special tokens from tokenizer_config.json."""

    def __init__(self, path: str | Path):
        path = Path(path)
        self.hf = HFTokenizer.from_file(str(path / "tokenizer.json"))
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        self.bos_token, self.eos_token = _token_str(cfg.get("bos_token")), _token_str(cfg.get("eos_token"))
        self.bos_token_id = self.token_to_id(self.bos_token)
        self.eos_token_id = self.token_to_id(self.eos_token)
        template_file = path / "chat_template.jinja"
        self.chat_template = template_file.read_text() if template_file.exists() else cfg.get("chat_template")

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.hf.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render a conversation with the checkpoint's Jinja chat template, as transformers does."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; pass plain text prompts instead")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "",
        )


class IncrementalDetokenizer:
    """Feeds one sequence's tokens through detokenize_incrementally and accumulates the text."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int] = ()):
        self.tokenizer, self.ids = tokenizer, list(prompt_ids)
        # Start the window a few tokens before the end of the prompt, so the first new token has context.
        self.read_offset = len(self.ids)
        self.prefix_offset = max(self.read_offset - 5, 0)
        self.text = ""

    def add(self, token_id: int) -> str:
        """Append a token and return the text it completes (possibly "")."""
        self.ids.append(token_id)
        delta, self.prefix_offset, self.read_offset = detokenize_incrementally(
            self.tokenizer, self.ids, self.prefix_offset, self.read_offset
        )
        self.text += delta
        return delta


def _token_str(tok) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)
