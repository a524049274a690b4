"""StructuredOutputManager: the engine core's grammars (vLLM's, in vllm/v1/structured_output/__init__.py).

Compiling a grammar against the vocabulary takes milliseconds to seconds, far longer than a decode step, so it runs
on a thread pool: a request waits (in the engine core's `compiling`) until its future is done while the other
requests keep stepping. Compiled grammars are cached by (kind, spec): the thousandth request with the same schema
reuses the first one's compilation and only gets a fresh matcher, which costs microseconds.
"""

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from minillm.sampling_params import StructuredOutputsParams
from minillm.structured_output.backend_xgrammar import XgrammarBackend, grammar_key
from minillm.structured_output.bitmask import allocate_bitmask
from minillm.structured_output.grammar import StructuredOutputGrammar

MAX_CACHED_GRAMMARS = 256  # compiled grammars kept, least recently used dropped first


class StructuredOutputManager:
    """The xgrammar backend of the checkpoint's vocabulary, its compile pool and the cache of compiled grammars.

    tokenizer_dir holds the checkpoint's tokenizer.json; vocab_size is the model's (config.json: the logits' width,
    which can exceed the tokenizer's); eos_token_ids end a complete match."""

    def __init__(self, tokenizer_dir: Path, vocab_size: int, eos_token_ids: list[int]):
        self.vocab_size = vocab_size
        self.backend = XgrammarBackend(tokenizer_dir, vocab_size, list(eos_token_ids))
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="minillm-grammar")
        self.compiled: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self.cache_hits = self.cache_misses = 0
        self._lock = threading.Lock()

    def grammar_init(self, params: StructuredOutputsParams) -> Future[StructuredOutputGrammar]:
        """A future of a new grammar for one request: done at once when its spec was compiled before, else when
        the pool has compiled it (an error the front end's validate_structured_outputs missed lands in it)."""
        key = grammar_key(params)
        with self._lock:
            compiled = self.compiled.get(key)
            if compiled is None:
                self.cache_misses += 1
                compiled = self.compiled[key] = self.executor.submit(self.backend.compile, *key)
                if len(self.compiled) > MAX_CACHED_GRAMMARS:
                    self.compiled.popitem(last=False)
            else:
                self.cache_hits += 1
                self.compiled.move_to_end(key)
        grammar = Future()
        compiled.add_done_callback(lambda done: _new_grammar(done, grammar))
        return grammar

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        """int32 [rows, ceil(vocab_size / 32)], every token allowed: a row per structured request of a step."""
        return allocate_bitmask(rows, self.vocab_size)

    def close(self) -> None:
        """Stop the compile pool; compilations not yet started are cancelled."""
        self.executor.shutdown(wait=False, cancel_futures=True)


def _new_grammar(compiled: Future, grammar: Future) -> None:
    """Complete `grammar` with a fresh matcher over the compiled grammar, or with the compilation's error."""
    import xgrammar as xgr

    try:
        matcher = xgr.GrammarMatcher(compiled.result())
    except Exception as e:  # the compilation's error, or CancelledError once the pool is closed
        grammar.set_exception(e)
        return
    grammar.set_result(StructuredOutputGrammar(matcher))
