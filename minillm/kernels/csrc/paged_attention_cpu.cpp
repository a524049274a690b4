// Paged decode attention on the CPU, read straight from the KV cache through the block tables (no gather).
//
// One task per (sequence, KV head): the group of query heads that share that KV head walk the sequence's
// blocks together, so each key and value is loaded from memory once and reused from L1 by the whole group.
// An online softmax keeps, per query head, the running max m, the running sum l of exp(score - m) and the
// running weighted sum of values; a new block with a larger max rescales both by exp(m_old - m_new).
// fp32 throughout. Tasks are handed out one at a time to the threads of at::parallel_for (contexts differ in
// length, and the runner sorts a batch by length, so equal contiguous shares would be unequal work).
// In the spirit of vLLM's csrc/cpu/attention.cpp, much smaller.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// out[g] = softmax(scale * q[g] . k_j) · v_j over the ctx keys of one sequence and KV head, for its G query
// heads. `table` lists the sequence's blocks; `work` holds G * (2 * D + 2 + block_size) floats.
void attend(const float* q, int64_t q_head_stride, const float* k_cache, const float* v_cache,
            int64_t block_stride, int64_t token_stride, int64_t block_size, const int64_t* table, int64_t ctx,
            int64_t G, int64_t D, float scale, float* out, int64_t out_head_stride, float* work) {
  float *qs = work, *acc = qs + G * D, *m = acc + G * D, *l = m + G, *p = l + G;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t d = 0; d < D; ++d) qs[g * D + d] = q[g * q_head_stride + d] * scale;
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t start = 0, b = 0; start < ctx; start += block_size, ++b) {
    const int64_t n = std::min(block_size, ctx - start);
    const float* k = k_cache + table[b] * block_stride;
    const float* v = v_cache + table[b] * block_stride;
    for (int64_t g = 0; g < G; ++g) {
      float* pg = p + g * block_size;
      float mx = m[g];
      for (int64_t t = 0; t < n; ++t) mx = std::max(mx, pg[t] = dot(qs + g * D, k + t * token_stride, D));
      const float rescale = std::exp(m[g] - mx);  // 0 on the first block (m = -inf)
      float* ag = acc + g * D;
      for (int64_t d = 0; d < D; ++d) ag[d] *= rescale;
      float sum = 0.f;
      for (int64_t t = 0; t < n; ++t) {
        const float e = std::exp(pg[t] - mx);
        sum += e;
        const float* vt = v + t * token_stride;
        for (int64_t d = 0; d < D; ++d) ag[d] += e * vt[d];
      }
      l[g] = l[g] * rescale + sum;
      m[g] = mx;
    }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) out[g * out_head_stride + d] = acc[g * D + d] / l[g];
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat,
              "paged_decode_attention_cpu takes float32 CPU tensors, got q ", q.scalar_type(), " on ", q.device(),
              " and a ", k_cache.scalar_type(), " cache");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.strides() == v_cache.strides() && q.size(2) == k_cache.size(3) &&
                  q.size(1) % k_cache.size(2) == 0 && q.stride(2) == 1 && k_cache.stride(3) == 1,
              "paged_decode_attention_cpu: q [seqs, heads, head_dim] and caches [blocks, block_size, kv_heads, "
              "head_dim] (last dims contiguous, heads a multiple of kv_heads), got ", q.sizes(), " and ",
              k_cache.sizes());
  const auto tables = block_tables.to(at::kLong).contiguous();
  const auto lens = context_lens.to(at::kLong).contiguous();
  const int64_t num_seqs = q.size(0), kv_heads = k_cache.size(2), D = q.size(2), G = q.size(1) / kv_heads;
  const int64_t block_size = k_cache.size(1), width = tables.size(1);
  auto out = at::empty(q.sizes(), q.options());
  const float *q_ptr = q.data_ptr<float>(), *k_ptr = k_cache.data_ptr<float>(), *v_ptr = v_cache.data_ptr<float>();
  const int64_t *table_ptr = tables.data_ptr<int64_t>(), *len_ptr = lens.data_ptr<int64_t>();
  float* out_ptr = out.data_ptr<float>();
  std::atomic<int64_t> next{0};
  const int64_t num_tasks = num_seqs * kv_heads;
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_tasks), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> work(G * (2 * D + 2 + block_size));
    for (int64_t i; (i = next++) < num_tasks;) {
      const int64_t s = i / kv_heads, h = i % kv_heads;
      attend(q_ptr + s * q.stride(0) + h * G * q.stride(1), q.stride(1), k_ptr + h * k_cache.stride(2),
             v_ptr + h * v_cache.stride(2), k_cache.stride(0), k_cache.stride(1), block_size,
             table_ptr + s * width, len_ptr[s], G, D, static_cast<float>(scale), out_ptr + (s * kv_heads + h) * G * D,
             D, work.data());
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(minillm_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(minillm_cpu, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
