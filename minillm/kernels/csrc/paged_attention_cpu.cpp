// Paged decode attention on the CPU, read straight from the KV cache through the block tables (no gather).
//
// One task per (sequence, KV head): the group of query heads that share that KV head walk the sequence's
// blocks together, so each key and value is loaded from memory once and reused from the L1 cache by the group.
// An online softmax keeps, per query head, the running max m, the running sum l of exp(score - m) and the
// running weighted sum of values; each update covers a chunk of whole blocks (about 128 keys): the chunk's
// scores first, then one max and exp, then its values, two query heads at a time with their accumulators in
// registers (measured at batch 64, block size 16: the kernel's time fell by a third against one update per block
// and one head at a time). A chunk with a larger max rescales the running sums by exp(m_old - m_new).
// fp32 throughout; an int8 cache (kv_cache_dtype="int8") is converted to floats in registers as it is loaded, and
// each key's and value's scale multiplies its score and its weight, so nothing is dequantized in memory.
// Tasks are handed out one at a time to the threads of at::parallel_for (contexts differ in
// length, and the runner sorts a batch by length, so equal contiguous shares would be unequal work).
// In the spirit of vLLM's csrc/cpu/attention.cpp, much smaller.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

using at::vec::Vectorized;
using Vec = Vectorized<float>;

// Ask for a block's keys and values ahead of use: blocks are scattered, so the hardware cannot guess the next.
template <typename T>
inline void prefetch(const T* k, const T* v, int64_t n, int64_t token_stride, int64_t D) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < D; d += 64 / sizeof(T)) {  // a 64-byte cache line holds 16 floats, 64 int8 numbers
      __builtin_prefetch(k + t * token_stride + d);
      __builtin_prefetch(v + t * token_stride + d);
    }
}

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// {sum(v[0]), ..., sum(v[7])} for 8 AVX2 vectors: three rounds of pairwise adds (8 instructions for 8 sums).
inline void reduce8(const __m256* v, float* out) {
  const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  // each 128-bit half: 4 partial sums
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31)));
}
#endif

// The sums of 8 vectors' lanes, as one vector: {sum(v[0]), ..., sum(v[7])}, in a few rounds of pairwise adds
// instead of one full horizontal reduction per vector (AVX-512 first adds each vector's two halves).
inline void reduce8(const Vec* v, float* out) {
#if defined(CPU_CAPABILITY_AVX2)
  const __m256 h[8] = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
  reduce8(h, out);
#elif defined(CPU_CAPABILITY_AVX512)
  __m256 h[8];
  for (int i = 0; i < 8; ++i) h[i] = _mm256_add_ps(_mm512_castps512_ps256(v[i]), _mm512_extractf32x8_ps(v[i], 1));
  reduce8(h, out);
#else
  for (int i = 0; i < 8; ++i) out[i] = at::vec::vec_reduce_all<float>(std::plus<Vec>(), v[i]);
#endif
}

// Floats of a head's dims at dim c, for loops that go Vec::size() floats at a time: a whole Vec, but a partial
// one at the end when D is not a multiple of it. kD is the head dim when known at compile time (then constant), or 0.
template <int64_t kD>
inline int64_t vec_width(int64_t D, int64_t c) {
  return kD % Vec::size() == 0 && kD ? Vec::size() : std::min<int64_t>(Vec::size(), D - c);
}

// A Vec of the `count` numbers at p (the rest 0) as floats: a float cache's as they are, an int8 cache's converted in
// registers (16 int8 numbers widened to 16 int32 and converted, with AVX-512; 8 with AVX2).
inline Vec load(const float* p, int64_t count) { return Vec::loadu(p, count); }

inline Vec load(const int8_t* p, int64_t count) {
#if defined(CPU_CAPABILITY_AVX512)
  if (count == Vec::size())
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(CPU_CAPABILITY_AVX2)
  if (count == Vec::size())
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#endif
  float f[Vec::size()] = {};
  for (int64_t i = 0; i < count; ++i) f[i] = p[i];
  return Vec::loadu(f);
}

// An int8 cache's scales folded into a chunk's n per-token numbers p (scores, or softmax weights): p[t] *= the scale
// of the chunk's token t, read through its block as the keys are ([blocks, block_size, kv_heads] strides).
inline void fold_scales(float* p, const float* scales, const int64_t* blocks, int64_t n, int64_t block_size,
                        int64_t block_stride, int64_t token_stride) {
  for (int64_t s = 0; s < n; s += block_size) {
    const float* sc = scales + blocks[s / block_size] * block_stride;
    for (int64_t t = s, end = std::min(n, s + block_size); t < end; ++t) p[t] *= sc[(t - s) * token_stride];
  }
}

// Tokens per softmax update: the scores of several blocks are gathered before one max, exp and rescale, so that
// the per-update work (reductions, a scalar exp, rescaling the accumulators) is spread over many keys.
constexpr int64_t kChunk = 128;

// The tokens of one softmax update for a cache of block_size tokens per block: whole blocks, about kChunk.
inline int64_t chunk_tokens(int64_t block_size) {
  return std::max<int64_t>(block_size, kChunk / block_size * block_size);
}

// acc[g] = acc[g] * rescale[g] + Σ_t p[g][t] · v_t for GN (1 or 2) query heads and the dims c0 .. c0 + 4 Vecs of
// one chunk's n values: the accumulators (GN × 4) and a value row's 4 Vecs stay in registers, so each value is
// loaded once for both heads and each weight p is broadcast once per token.
template <int GN, int64_t kD, typename T>
void accumulate(float* acc, const float* rescale, const float* p, int64_t chunk, const T* v_cache,
                int64_t block_stride, int64_t token_stride, int64_t block_size, const int64_t* blocks, int64_t n,
                int64_t D, int64_t c0) {
  constexpr int64_t W = Vec::size();
  const auto width = [D](int64_t c) { return vec_width<kD>(D, c); };
  // 4 whenever the head dim is a known multiple of 4 Vecs: then the loops over j unroll and a stays in registers
  const int64_t nc = kD && kD % (4 * W) == 0 ? 4 : std::min<int64_t>(4, (D - c0 + W - 1) / W);
  Vec a[GN][4], vv[4];
  for (int g = 0; g < GN; ++g)
    for (int64_t j = 0; j < nc; ++j)
      a[g][j] = Vec::loadu(acc + g * D + c0 + j * W, width(c0 + j * W)) * Vec(rescale[g]);
  for (int64_t s = 0; s < n; s += block_size) {
    const T* v = v_cache + blocks[s / block_size] * block_stride + c0;
    for (int64_t t = s, end = std::min(n, s + block_size); t < end; ++t, v += token_stride) {
      for (int64_t j = 0; j < nc; ++j) vv[j] = load(v + j * W, width(c0 + j * W));
      for (int g = 0; g < GN; ++g) {
        const Vec w(p[g * chunk + t]);
        for (int64_t j = 0; j < nc; ++j) a[g][j] = at::vec::fmadd(w, vv[j], a[g][j]);
      }
    }
  }
  for (int g = 0; g < GN; ++g)
    for (int64_t j = 0; j < nc; ++j) a[g][j].store(acc + g * D + c0 + j * W, width(c0 + j * W));
}

// out[g] = softmax(q[g] . k_j * scale) · v_j over the ctx (≥ 1) keys of one sequence and KV head, for its G
// query heads. `table` lists the sequence's blocks; `work` holds G * (2 * D + 3 + chunk_tokens(block_size))
// floats. kD is the head dim when it is one the compiler specialises for (loops unrolled), or 0 (see vec_width).
// T is the cache's type: float, or int8_t with k_scale/v_scale this KV head's scales (strides scale_block and
// scale_token); a float cache has none.
template <typename T, int64_t kD>
void attend(const float* q, int64_t q_head_stride, const T* k_cache, const T* v_cache, int64_t block_stride,
            int64_t token_stride, int64_t block_size, const int64_t* table, int64_t ctx, int64_t G, int64_t head_dim,
            float scale, float* out, int64_t out_head_stride, float* work, const float* k_scale, const float* v_scale,
            int64_t scale_block, int64_t scale_token) {
  constexpr bool kInt8 = std::is_same_v<T, int8_t>;
  const int64_t D = kD ? kD : head_dim, chunk = chunk_tokens(block_size);
  const auto width = [D](int64_t c) { return vec_width<kD>(D, c); };
  float *qs = work, *acc = qs + G * D, *m = acc + G * D, *l = m + G, *rescale = l + G, *p = rescale + G;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t c = 0; c < D; c += Vec::size())
      (Vec::loadu(q + g * q_head_stride + c, width(c)) * Vec(scale)).store(qs + g * D + c, width(c));
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t start = 0; start < ctx; start += chunk) {  // one softmax update per chunk of whole blocks
    const int64_t n = std::min(chunk, ctx - start);
    const int64_t* blocks = table + start / block_size;
    for (int64_t g = 0; g < G; ++g) {  // p[g] = exp(scores - new max) of the chunk's keys, block by block
      float* pg = p + g * chunk;
      for (int64_t s = 0; s < n; s += block_size) {
        const int64_t nb = std::min(block_size, n - s);
        const T* k = k_cache + blocks[s / block_size] * block_stride;
        if (g == 0 && start + s + block_size < ctx) {  // the first head's pass asks for the next block
          const int64_t next = blocks[s / block_size + 1] * block_stride;
          prefetch(k_cache + next, v_cache + next, std::min(block_size, ctx - start - s - block_size), token_stride, D);
        }
        int64_t t = 0;
        for (; t + 8 <= nb; t += 8) {  // scores of 8 keys at once: 8 independent chains, then one reduce8
          Vec sc[8];
          for (int j = 0; j < 8; ++j) sc[j] = Vec(0.f);
          for (int64_t c = 0; c < D; c += Vec::size()) {
            const Vec qv = Vec::loadu(qs + g * D + c, width(c));
            for (int j = 0; j < 8; ++j)
              sc[j] = at::vec::fmadd(qv, load(k + (t + j) * token_stride + c, width(c)), sc[j]);
          }
          reduce8(sc, pg + s + t);
        }
        for (; t < nb; ++t) {  // the last keys, one at a time
          Vec sc(0.f);
          for (int64_t c = 0; c < D; c += Vec::size())
            sc = at::vec::fmadd(Vec::loadu(qs + g * D + c, width(c)), load(k + t * token_stride + c, width(c)), sc);
          pg[s + t] = at::vec::vec_reduce_all<float>(std::plus<Vec>(), sc);
        }
      }
      if constexpr (kInt8) fold_scales(pg, k_scale, blocks, n, block_size, scale_block, scale_token);  // q·k·s_k
      const auto max = [](Vec x, Vec y) { return at::vec::maximum(x, y); };
      const float mx = std::max(m[g], at::vec::reduce_all<float>(max, pg, n));
      at::vec::map([mx](Vec x) { return (x - Vec(mx)).exp_u20(); }, pg, pg, n);
      rescale[g] = std::exp(m[g] - mx);  // 0 on the first chunk (m = -inf)
      l[g] = l[g] * rescale[g] + at::vec::reduce_all<float>(std::plus<Vec>(), pg, n);
      m[g] = mx;
      if constexpr (kInt8) fold_scales(pg, v_scale, blocks, n, block_size, scale_block, scale_token);  // p·s_v
    }
    for (int64_t g = 0; g < G; g += 2)  // acc = acc * rescale + p · V: two heads, 4 Vecs of dims at a time
      for (int64_t c0 = 0; c0 < D; c0 += 4 * Vec::size())
        (G - g >= 2 ? accumulate<2, kD, T> : accumulate<1, kD, T>)(acc + g * D, rescale + g, p + g * chunk, chunk, v_cache,
                                                             block_stride, token_stride, block_size, blocks, n, D, c0);
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < D; c += Vec::size())
      (Vec::loadu(acc + g * D + c, width(c)) * Vec(1.f / l[g])).store(out + g * out_head_stride + c, width(c));
}

// The (sequence, KV head) tasks of a decode step over a cache of T (float, or int8_t with its scales), on all cores.
template <typename T>
at::Tensor run_tasks(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                     const float* k_scale = nullptr, const float* v_scale = nullptr, int64_t scale_block = 0,
                     int64_t scale_token = 0) {
  const auto tables = block_tables.to(at::kLong).contiguous();
  const auto lens = context_lens.to(at::kLong).contiguous();
  const int64_t num_seqs = q.size(0), kv_heads = k_cache.size(2), D = q.size(2), G = q.size(1) / kv_heads;
  const int64_t block_size = k_cache.size(1), width = tables.size(1);
  auto out = at::empty(q.sizes(), q.options());
  const float* q_ptr = q.data_ptr<float>();
  const T *k_ptr = k_cache.data_ptr<T>(), *v_ptr = v_cache.data_ptr<T>();
  const int64_t *table_ptr = tables.data_ptr<int64_t>(), *len_ptr = lens.data_ptr<int64_t>();
  float* out_ptr = out.data_ptr<float>();
  const auto run = D == 32 ? attend<T, 32> : D == 64 ? attend<T, 64> : D == 128 ? attend<T, 128> : attend<T, 0>;
  const int64_t num_tasks = num_seqs * kv_heads;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_tasks), 1, [&](int64_t, int64_t) {
    std::vector<float> work(G * (2 * D + 3 + chunk_tokens(block_size)));
    for (int64_t i; (i = next++) < num_tasks;) {  // one (sequence, KV head) at a time, whichever thread is free
      const int64_t s = i / kv_heads, h = i % kv_heads;
      run(q_ptr + s * q.stride(0) + h * G * q.stride(1), q.stride(1), k_ptr + h * k_cache.stride(2),
          v_ptr + h * v_cache.stride(2), k_cache.stride(0), k_cache.stride(1), block_size, table_ptr + s * width,
          len_ptr[s], G, D, static_cast<float>(scale), out_ptr + i * G * D, D, work.data(),
          k_scale ? k_scale + h : nullptr, v_scale ? v_scale + h : nullptr, scale_block, scale_token);
    }
  });
  return out;
}

// Decode attention over the paged cache, read in place: float32 caches, or int8 caches (kv_cache_dtype="int8")
// with their float32 scales [blocks, block_size, kv_heads], whose numbers become floats in registers and whose
// scales multiply the scores and the weights.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                  const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  const auto cache_type = k_scale.has_value() ? at::kChar : at::kFloat;
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kFloat && k_cache.scalar_type() == cache_type &&
                  v_cache.scalar_type() == cache_type,
              "paged_decode_attention_cpu takes a float32 q and float32 caches (int8 with scales) on the CPU, got q ",
              q.scalar_type(), " on ", q.device(), " and a ", k_cache.scalar_type(), " cache");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.strides() == v_cache.strides() && q.size(2) == k_cache.size(3) &&
                  q.size(1) % k_cache.size(2) == 0 && q.stride(2) == 1 && k_cache.stride(3) == 1,
              "paged_decode_attention_cpu: q [seqs, heads, head_dim] and caches [blocks, block_size, kv_heads, "
              "head_dim] (last dims contiguous, heads a multiple of kv_heads), got ", q.sizes(), " and ",
              k_cache.sizes());
  if (!k_scale.has_value()) return run_tasks<float>(q, k_cache, v_cache, block_tables, context_lens, scale);
  TORCH_CHECK(v_scale.has_value() && k_scale->scalar_type() == at::kFloat && v_scale->scalar_type() == at::kFloat &&
                  k_scale->sizes() == k_cache.sizes().slice(0, 3) && v_scale->sizes() == k_scale->sizes() &&
                  k_scale->strides() == v_scale->strides() && k_scale->stride(2) == 1,
              "paged_decode_attention_cpu: float32 scales [blocks, block_size, kv_heads] (kv_heads contiguous) for "
              "both caches, got ", k_scale->sizes(), " for a ", k_cache.sizes(), " cache");
  return run_tasks<int8_t>(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale->data_ptr<float>(),
                           v_scale->data_ptr<float>(), k_scale->stride(0), k_scale->stride(1));
}

// A layer's whole decode attention as one op that a compiled decode step calls directly (CompiledDecodeSteps):
// store the step's keys and values (padded rows to the spare slot), then attend. The caches are written but
// declared read-only, as the Python attention op hides them from the compiler: declared, torch.compile would copy
// the whole cache around every step to keep the graph free of in-place writes.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                            const at::Tensor& context_lens, double scale, const std::optional<at::Tensor>& k_scale,
                            const std::optional<at::Tensor>& v_scale) {
  using Scale = std::optional<at::Tensor>;
  static const auto store = c10::Dispatcher::singleton().findSchemaOrThrow("minillm_cpu::store_kvcache", "").typed<
      void(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&, bool, const Scale&,
           const Scale&)>();
  at::Tensor k_out = k_cache, v_out = v_cache;  // the same tensors, writable
  store.call(k, v, k_out, v_out, slot_mapping, false, k_scale, v_scale);
  return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale);
}

}  // namespace

TORCH_LIBRARY(minillm_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale, Tensor? k_scale, Tensor? v_scale) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor slot_mapping, "
        "Tensor block_tables, Tensor context_lens, float scale, Tensor? k_scale, Tensor? v_scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(minillm_cpu, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("decode_attention", &decode_attention);
}
