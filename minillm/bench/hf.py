"""The transformers peers: padded static batches with generate(), and transformers' continuous batching.

Both are greedy and never stop early. generate() fills every option a call leaves unset from
model.generation_config, so EOS is removed there, not only from the call; continuous batching takes
eos_token_id=-1 as "no EOS". Each request keeps exactly the tokens it asked for, and the bench checks it.
"""

import math
import time

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers.generation.continuous_batching.utils import WorkloadHints

from minillm.bench.backends import PAD, Models, Run, progress
from minillm.bench.workloads import Workload

AUTO_BATCH_SIZES = (8, 16, 32, 64, 128)


def batch_sizes(spec: str | int, num_prompts: int) -> list[int]:
    """--hf-batch-size: that size, or for "auto" the sizes of AUTO_BATCH_SIZES capped at the number of prompts."""
    if spec == "auto":
        return sorted({min(b, num_prompts) for b in AUTO_BATCH_SIZES})
    return [spec]


@torch.inference_mode()
def generate_padded(model, workload: Workload, batch_size: int, bar=None) -> list[list[int]]:
    """Like vLLM's run_hf: requests in order, left-padded batches of batch_size, each batch generating up to
    its longest requested output; each request keeps the tokens it asked for."""
    tokens = []
    for i in range(0, len(workload), batch_size):
        prompts, lens = workload.prompts[i : i + batch_size], workload.output_lens[i : i + batch_size]
        width = max(map(len, prompts))
        input_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts], device=model.device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max(lens))
        tokens += [row[:n] for row, n in zip(out[:, width:].tolist(), lens)]
        if bar is not None:
            bar.update(1)
    return tokens


def run_hf_generate(models: Models, workload: Workload, warmup: Workload, args) -> Run:
    """Padded static batches; with --hf-batch-size auto every size in batch_sizes() runs the whole workload
    and the fastest counts (all are recorded)."""
    model = models.hf_model
    generate_padded(model, warmup, len(warmup))
    tried, best = [], None
    for batch_size in batch_sizes(args.hf_batch_size, len(workload)):
        with progress(math.ceil(len(workload) / batch_size), f"hf-generate bs={batch_size}", "batch") as bar:
            start = time.perf_counter()
            tokens = generate_padded(model, workload, batch_size, bar)
            elapsed = time.perf_counter() - start
        tried.append(
            dict(
                batch_size=batch_size,
                elapsed_time=elapsed,
                output_tokens_per_second=workload.num_output_tokens / elapsed,
            )
        )
        if best is None or elapsed < best.elapsed:
            best = Run(elapsed, tokens, None, {"batch_size": batch_size})
    best.info["tried"] = tried
    return best


# transformers' continuous batching (5.x): a paged KV cache, chunked prefill, prefix sharing, and requests
# joining and leaving the batch at every step. Its entry points:
# - model.generate_batch(inputs, max_new_tokens=N): one N for every prompt, and a fresh manager per call (its
#   cache allocation inside the call). It is a loop over the manager below.
# - model.continuous_batching_context_manager(...) yields that manager, whose add_request(input_ids,
#   max_new_tokens=n, record_timestamps=True) takes each request's own length and stamps every token.
# So the bench drives the manager: per-request lengths, one manager for the warm-up and the timed run (set up
# outside the timing, like minillm's engine), greedy (do_sample=False), no EOS (eos_token_id=-1, which every
# request inherits). Left to itself on a CPU, the manager sizes its KV cache, and an attention mask of
# batch tokens x (cache + batch tokens), from 90% of free RAM: gigabytes, seconds to fill. It gets minillm's
# budgets instead: max_num_batched_tokens per step, max_num_seqs requests per batch, and a cache for that many
# requests of the longest length.
def run_hf_generate_batch(models: Models, workload: Workload, warmup: Workload, args) -> Run:
    """transformers' continuous batching, each request with its own output length."""
    model = models.hf_model
    hints = WorkloadHints(
        max_prompt_length=max(map(len, workload.prompts)),
        max_generated_length=max(workload.output_lens),
        num_requests=len(workload),
    )
    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=PAD)
    seqs = min(len(workload), models.engine_option("max_num_seqs"))
    budgets = ContinuousBatchingConfig(
        max_batch_tokens=models.engine_option("max_num_batched_tokens"), max_requests_per_batch=seqs
    )
    budgets.num_blocks = seqs * (math.ceil(workload.max_len / budgets.page_size) + 1)
    with model.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=budgets, workload_hints=hints
    ) as manager:
        info = dict(
            attn_implementation=model.config._attn_implementation,
            max_batch_tokens=budgets.max_batch_tokens,
            max_requests_per_batch=seqs,
            num_blocks=budgets.num_blocks,
            page_size=budgets.page_size,
        )
        complete(manager, warmup, "warmup")
        with progress(len(workload), "hf-generate-batch", "req") as bar:
            start = time.perf_counter()
            results = complete(manager, workload, "req", bar)
            elapsed = time.perf_counter() - start
    return Run(
        elapsed,
        [r.generated_tokens for r in results],
        [(r.created_time, r.timestamps[0], r.timestamps[-1]) for r in results],
        info,
    )


def complete(manager, workload: Workload, tag: str, bar=None) -> list:
    """Add every request with its own max_new_tokens, wait for all; their GenerationOutputs in request order."""
    ids = [
        manager.add_request(prompt, request_id=f"{tag}-{i}", max_new_tokens=n, record_timestamps=True)
        for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens))
    ]
    if None in ids:
        raise RuntimeError("transformers' continuous batching refused a request (its manager is not accepting any)")
    results = {}
    while len(results) < len(ids):
        result = manager.get_result(timeout=1)
        if result is None and not manager.is_running():
            raise RuntimeError("transformers' continuous batching stopped before finishing the requests")
        if result is not None and result.error is not None:
            raise RuntimeError(f"transformers' continuous batching failed request {result.request_id}: {result.error}")
        if result is not None and result.is_finished():
            results[result.request_id] = result
            if bar is not None:
                bar.update(1)
    return [results[i] for i in ids]
