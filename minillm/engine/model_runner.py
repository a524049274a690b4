"""ModelRunner: owns the model and the KV cache; turns a batch of sequences into flat tensors, runs, samples."""
import torch

from minillm.config import Config
from minillm.engine.kv_cache import allocate_kv_cache, kv_cache_bytes_per_token
from minillm.engine.sequence import Sequence
from minillm.layers.paged_attention import slot_mapping_for
from minillm.layers.sampler import sample
from minillm.models import build_model
from minillm.utils.context import Context, reset_context, set_context


class ModelRunner:
    def __init__(self, config: Config, model_path):
        self.device = torch.device(config.device)
        self.model = build_model(model_path, getattr(torch, config.dtype), config.device)
        self.block_size = config.kvcache_block_size
        bytes_per_block = kv_cache_bytes_per_token(self.model.config, getattr(torch, config.dtype)) * self.block_size
        self.num_kvcache_blocks = config.num_kvcache_blocks or self.kv_cache_budget(config) // bytes_per_block
        if self.num_kvcache_blocks < 1:
            raise ValueError(f"no memory is left for the KV cache (one block needs {bytes_per_block} bytes): "
                             "raise kvcache_memory_bytes / gpu_memory_utilization or use a smaller model")
        self.kv_cache = allocate_kv_cache(self.model, self.num_kvcache_blocks, self.block_size)

    def kv_cache_budget(self, config: Config) -> int:
        """Bytes for the KV cache. CPU: kvcache_memory_bytes. CUDA: gpu_memory_utilization of the device, less
        what is in use and the activation peak of one full prefill step (measured by a warm-up run)."""
        if self.device.type != "cuda":
            return config.kvcache_memory_bytes
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.warmup(config)
        free, total = torch.cuda.mem_get_info(self.device)
        stats = torch.cuda.memory_stats(self.device)
        peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
        return int(total * config.gpu_memory_utilization - (total - free) - (peak - current))

    @torch.inference_mode()
    def warmup(self, config: Config) -> None:
        """One prefill of max_num_batched_tokens tokens (as sequences of max_model_len), with no cache yet."""
        max_len = min(config.max_model_len or 1 << 30, self.model.config.max_position_embeddings,
                      config.max_num_batched_tokens)
        n = max(1, min(config.max_num_batched_tokens // max_len, config.max_num_seqs))
        cu = torch.arange(0, n * max_len + 1, max_len, device=self.device)
        set_context(Context(is_prefill=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                            slot_mapping=torch.full((n * max_len,), -1, device=self.device)))
        try:
            self.model(torch.zeros(n * max_len, dtype=torch.long, device=self.device),
                       torch.arange(max_len, device=self.device).repeat(n))
        finally:
            reset_context()
        torch.cuda.empty_cache()

    def tensor(self, data, dtype=torch.long) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)

    def block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        """[num_seqs, max_blocks] block ids, padded with -1."""
        width = max(len(seq.block_table) for seq in seqs)
        return self.tensor([seq.block_table + [-1] * (width - len(seq.block_table)) for seq in seqs])

    def prepare_prefill(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pack each sequence's scheduled tokens end to end; set cu_seqlens, slot_mapping (and block_tables
        when some keys come from the cache)."""
        input_ids, positions, slot_mapping, cu_q, cu_k = [], [], [], [0], [0]
        for seq in seqs:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + seq.num_scheduled_tokens
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            cu_q.append(cu_q[-1] + end - start)
            cu_k.append(cu_k[-1] + end)
            slots = slot_mapping_for(seq.block_table, start, end, self.block_size)
            # a fully cached prompt recomputes its last token; its K/V are in a shared block already
            slot_mapping += [-1 if pos < seq.num_cached_tokens else s for pos, s in zip(range(start, end), slots)]
        block_tables = self.block_tables(seqs) if cu_k[-1] > cu_q[-1] else None
        set_context(Context(is_prefill=True, cu_seqlens_q=self.tensor(cu_q), cu_seqlens_k=self.tensor(cu_k),
                            slot_mapping=self.tensor(slot_mapping), block_tables=block_tables))
        return self.tensor(input_ids), self.tensor(positions)

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per sequence, its newest, at position len - 1."""
        slot_mapping = [slot_mapping_for(seq.block_table, len(seq) - 1, len(seq), self.block_size)[0] for seq in seqs]
        set_context(Context(slot_mapping=self.tensor(slot_mapping), block_tables=self.block_tables(seqs),
                            context_lens=self.tensor([len(seq) for seq in seqs])))
        return self.tensor([seq.last_token for seq in seqs]), self.tensor([len(seq) - 1 for seq in seqs])

    def prepare_sample(self, seqs: list[Sequence]):
        """Per-row sampling parameters: temperatures, top_k, top_p and each request's generator."""
        sp = [seq.sampling_params for seq in seqs]
        for seq in seqs:  # a seeded request's own random stream, on the device that samples
            if seq.generator is None and seq.sampling_params.seed is not None:
                seq.generator = torch.Generator(self.device).manual_seed(seq.sampling_params.seed)
        return (self.tensor([p.temperature for p in sp], torch.float), self.tensor([p.top_k for p in sp]),
                self.tensor([p.top_p for p in sp], torch.float), [seq.generator for seq in seqs])

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int | None]:
        """One forward step; a token for each sequence that reached its end, None for a prefill chunk."""
        input_ids, positions = (self.prepare_prefill if is_prefill else self.prepare_decode)(seqs)
        try:
            hidden = self.model(input_ids, positions)
        finally:
            reset_context()
        rows = [i for i, seq in enumerate(seqs) if seq.samples_this_step]
        out = [None] * len(seqs)
        if rows:
            last = self.tensor([seq.num_scheduled_tokens for seq in seqs]).cumsum(0) - 1  # each one's last token
            logits = self.model.compute_logits(hidden[last[rows]])
            for i, token in zip(rows, sample(logits, *self.prepare_sample([seqs[i] for i in rows])).tolist()):
                out[i] = token
        return out
