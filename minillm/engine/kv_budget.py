"""How many bytes the KV cache may take (vLLM's memory profiling): on a CPU, what the config says; on CUDA, what
is left of gpu_memory_utilization once the model is loaded and the largest step has run once, measured."""

import torch

from minillm.config import Config
from minillm.engine.input_batch import StepInputs
from minillm.engine.kv_cache import kv_cache_bytes_per_token
from minillm.layers.sampler import SamplingMetadata
from minillm.sampling_params import SamplingParams
from minillm.utils.context import reset_context, set_context
from minillm.utils.pipeline import IntermediateTensors


def kv_cache_budget(runner, config: Config) -> int:
    """Bytes for the KV cache. CPU: kvcache_memory_bytes. CUDA: gpu_memory_utilization of the device, less
    what is in use and what a step needs beside the cache, measured by warm-up runs: the peak of the largest
    step (`warmup`) and, when decode steps will be CUDA graphs, the memory their pool keeps (the activations
    of a forward at the largest bucket); and one layer's context read out of the cache (a prefill over a
    cached prefix copies up to max_model_len keys and values)."""
    if runner.device.type != "cuda":
        return config.kvcache_memory_bytes

    def measured(run) -> int:  # the bytes `run` needed beyond what stays allocated
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(runner.device)
        run()
        stats = torch.cuda.memory_stats(runner.device)
        return stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]

    step = measured(lambda: warmup(runner, config))
    rows = min(runner.buffers.decode_rows, 512)  # the largest bucket's rows, as sequences of one token
    graph_pool = measured(lambda: dummy_forward(runner, rows, 1)) if runner.eager_reason is None else 0
    # its keys and values, copied out per sequence and then packed: twice
    context = (
        2
        * config.max_model_len
        * kv_cache_bytes_per_token(runner.model.config, runner.dtype)
        // (runner.model.config.num_hidden_layers * (runner.group.size if runner.group else 1))
    )
    torch.cuda.empty_cache()  # what the warm-ups left cached is free for the cache
    free, total = torch.cuda.mem_get_info(runner.device)
    return int(total * config.gpu_memory_utilization - (total - free) - step - graph_pool - context)


@torch.inference_mode()
def warmup(runner, config: Config) -> None:
    """The largest step, with no cache yet: a prefill of max_num_batched_tokens tokens (as sequences of
    max_model_len), then the logits and a top-k/top-p sample (a sort of [rows, vocab]) of max_num_seqs rows."""
    max_len = min(config.max_model_len, config.max_num_batched_tokens)
    hidden = dummy_forward(runner, max(1, min(config.max_num_batched_tokens // max_len, config.max_num_seqs)), max_len)
    if isinstance(hidden, IntermediateTensors):  # a pipeline stage before the last: no logits
        return
    logits = runner.model.compute_logits(hidden[torch.arange(config.max_num_seqs, device=runner.device) % len(hidden)])
    if logits is not None:  # rank 0 samples
        params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.9)] * config.max_num_seqs
        runner.sampler(logits, SamplingMetadata.build(params, [None] * len(params), runner.device))


@torch.inference_mode()
def dummy_forward(runner, num_seqs: int, seq_len: int) -> torch.Tensor:
    """The forward pass of num_seqs prompts of seq_len tokens that store nothing (every slot -1); a later pipeline
    stage's starts from zero hidden states."""
    n, cu = num_seqs * seq_len, list(range(0, num_seqs * seq_len + 1, seq_len))
    ctx = runner.load(StepInputs(True, [0] * n, list(range(seq_len)) * num_seqs, [-1] * n, None, cu, cu, []))
    intermediate = None
    if not runner.model.model.is_first_stage:
        zeros = torch.zeros(n, runner.model.config.hidden_size, dtype=runner.dtype, device=runner.device)
        intermediate = IntermediateTensors(zeros, zeros.clone())
    set_context(ctx)
    try:
        return runner.model(ctx.input_ids, ctx.positions, intermediate)
    finally:
        reset_context()
