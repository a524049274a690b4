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
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace {

using at::vec::Vectorized;
using Vec = Vectorized<float>;

// Ask for a block's keys and values ahead of use: blocks are scattered, so the hardware cannot guess the next.
inline void prefetch(const float* k, const float* v, int64_t n, int64_t token_stride, int64_t D) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < D; d += 16) {  // a 64-byte cache line holds 16 floats
      __builtin_prefetch(k + t * token_stride + d);
      __builtin_prefetch(v + t * token_stride + d);
    }
}

// The sums of 8 vectors' lanes, as one vector: {sum(v[0]), ..., sum(v[7])}. With AVX2, three rounds of pairwise
// adds (8 instructions for 8 sums) instead of one full horizontal reduction per vector.
inline void reduce8(const Vec* v, float* out) {
#if defined(CPU_CAPABILITY_AVX2)
  const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  // each 128-bit half: 4 partial sums
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31)));
#else
  for (int i = 0; i < 8; ++i) out[i] = at::vec::vec_reduce_all<float>(std::plus<Vec>(), v[i]);
#endif
}

// out[g] = softmax(q[g] . k_j * scale) · v_j over the ctx (≥ 1) keys of one sequence and KV head, for its G
// query heads. `table` lists the sequence's blocks; `work` holds G * (2 * D + 2 + block_size) floats. Loops over
// a head's dims go Vec::size() floats at a time (8 with AVX2), the last one partial if D is not a multiple of it.
// kD is the head dim when it is one the compiler specialises for (loops unrolled), or 0: D from the argument.
template <int64_t kD>
void attend(const float* q, int64_t q_head_stride, const float* k_cache, const float* v_cache,
            int64_t block_stride, int64_t token_stride, int64_t block_size, const int64_t* table, int64_t ctx,
            int64_t G, int64_t head_dim, float scale, float* out, int64_t out_head_stride, float* work) {
  const int64_t D = kD ? kD : head_dim;
  const auto width = [D](int64_t c) {  // floats at dim c: a whole Vec but at a partial end
    return kD % Vec::size() == 0 && kD ? Vec::size() : std::min<int64_t>(Vec::size(), D - c);
  };
  float *qs = work, *acc = qs + G * D, *m = acc + G * D, *l = m + G, *p = l + G;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t c = 0; c < D; c += Vec::size())
      (Vec::loadu(q + g * q_head_stride + c, width(c)) * Vec(scale)).store(qs + g * D + c, width(c));
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t start = 0, b = 0; start < ctx; start += block_size, ++b) {
    const int64_t n = std::min(block_size, ctx - start);
    const float* k = k_cache + table[b] * block_stride;
    const float* v = v_cache + table[b] * block_stride;
    if (start + block_size < ctx)
      prefetch(k_cache + table[b + 1] * block_stride, v_cache + table[b + 1] * block_stride,
               std::min(block_size, ctx - start - block_size), token_stride, D);
    for (int64_t g = 0; g < G; ++g) {
      float *pg = p + g * block_size, *ag = acc + g * D;
      float mx = m[g];
      int64_t t = 0;
      for (; t + 8 <= n; t += 8) {  // scores of 8 keys at once: 8 independent chains, then one reduce8
        Vec s[8];
        for (int j = 0; j < 8; ++j) s[j] = Vec(0.f);
        for (int64_t c = 0; c < D; c += Vec::size()) {
          const Vec qv = Vec::loadu(qs + g * D + c, width(c));
          for (int j = 0; j < 8; ++j) s[j] = at::vec::fmadd(qv, Vec::loadu(k + (t + j) * token_stride + c, width(c)), s[j]);
        }
        reduce8(s, pg + t);
        for (int j = 0; j < 8; ++j) mx = std::max(mx, pg[t + j]);
      }
      for (; t < n; ++t) {  // the last keys, one at a time
        Vec sc(0.f);
        for (int64_t c = 0; c < D; c += Vec::size())
          sc = at::vec::fmadd(Vec::loadu(qs + g * D + c, width(c)), Vec::loadu(k + t * token_stride + c, width(c)), sc);
        mx = std::max(mx, pg[t] = at::vec::vec_reduce_all<float>(std::plus<Vec>(), sc));
      }
      at::vec::map([mx](Vec x) { return (x - Vec(mx)).exp_u20(); }, pg, pg, n);
      const float rescale = std::exp(m[g] - mx);  // 0 on the first block (m = -inf)
      l[g] = l[g] * rescale + at::vec::reduce_all<float>(std::plus<Vec>(), pg, n);
      m[g] = mx;
      for (int64_t c = 0; c < D; c += Vec::size()) {  // acc = acc * rescale + p · V
        Vec a[4] = {Vec::loadu(ag + c, width(c)) * Vec(rescale), Vec(0.f), Vec(0.f), Vec(0.f)};  // 4 chains
        int64_t t = 0;
        for (; t + 4 <= n; t += 4)
          for (int i = 0; i < 4; ++i)
            a[i] = at::vec::fmadd(Vec(pg[t + i]), Vec::loadu(v + (t + i) * token_stride + c, width(c)), a[i]);
        for (; t < n; ++t) a[0] = at::vec::fmadd(Vec(pg[t]), Vec::loadu(v + t * token_stride + c, width(c)), a[0]);
        ((a[0] + a[1]) + (a[2] + a[3])).store(ag + c, width(c));
      }
    }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < D; c += Vec::size())
      (Vec::loadu(acc + g * D + c, width(c)) * Vec(1.f / l[g])).store(out + g * out_head_stride + c, width(c));
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
  const auto run = D == 32 ? attend<32> : D == 64 ? attend<64> : D == 128 ? attend<128> : attend<0>;
  const int64_t num_tasks = num_seqs * kv_heads;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_tasks), 1, [&](int64_t, int64_t) {
    std::vector<float> work(G * (2 * D + 2 + block_size));
    for (int64_t i; (i = next++) < num_tasks;) {  // one (sequence, KV head) at a time, whichever thread is free
      const int64_t s = i / kv_heads, h = i % kv_heads;
      run(q_ptr + s * q.stride(0) + h * G * q.stride(1), q.stride(1), k_ptr + h * k_cache.stride(2),
          v_ptr + h * v_cache.stride(2), k_cache.stride(0), k_cache.stride(1), block_size, table_ptr + s * width,
          len_ptr[s], G, D, static_cast<float>(scale), out_ptr + i * G * D, D, work.data());
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
