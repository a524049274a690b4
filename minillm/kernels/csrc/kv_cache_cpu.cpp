// Store a step's new keys and values into their KV cache slots on the CPU: the C++ twin of the Triton
// store_kvcache (minillm/kernels/triton/kv_cache.py) and of vLLM's reshape_and_cache.
//
// The torch version is two fancy-index writes (plus a mask in prefill) with their Python around them: some
// 25-50 microseconds per layer even at batch 1, where the copy itself is 2 KB. Here each token's row of
// kv_heads × head_dim floats is one memcpy to its slot. Slot -1 means what it means to the torch functions:
// in a prefill (skip_unslotted) a token whose key is already cached, which writes nothing; in a decode step a
// padded row, which writes the spare last slot of the cache (store_decode_kvcache, chapter 07).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

namespace {

// One head's vector of `dim` floats as int8 numbers and a scale (kv_cache_dtype="int8"), exactly as the torch
// reference quantize_kv computes them: scale = max|x| / 127 (1 for an all-zero vector), q = round(x / scale) with
// ties to even (nearbyint in the default rounding mode, as torch.round), clamped to ±127.
inline void quantize_row(const float* x, int64_t dim, int8_t* q, float* scale) {
  float amax = 0.f;
  for (int64_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float s = amax > 0.f ? amax / 127.f : 1.f;
  for (int64_t d = 0; d < dim; ++d) q[d] = static_cast<int8_t>(std::clamp(std::nearbyint(x[d] / s), -127.f, 127.f));
  *scale = s;
}

// Each token's keys and values into its slot: a memcpy of its row into a cache of their dtype, or, given the
// scales of an int8 cache (k_scale/v_scale, float [blocks, block_size, kv_heads]), each head's vector quantized
// straight into its slot of the cache and of the scales (two passes over a head's row, its max then its numbers,
// from L1).
void store_kvcache(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                   const at::Tensor& slot_mapping, bool skip_unslotted, const std::optional<at::Tensor>& k_scale,
                   const std::optional<at::Tensor>& v_scale) {
  const bool int8 = k_scale.has_value();
  TORCH_CHECK(k.device().is_cpu() && k_cache.device().is_cpu() && slot_mapping.scalar_type() == at::kLong &&
                  (int8 ? k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
                              k_cache.scalar_type() == at::kChar && v_cache.scalar_type() == at::kChar &&
                              v_scale.has_value() && k_scale->scalar_type() == at::kFloat &&
                              v_scale->scalar_type() == at::kFloat
                        : k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type()),
              "store_kvcache_cpu: keys and values of the caches' dtype (float32 for an int8 cache with float32 "
              "scales) on the CPU and int64 slots, got ", k.scalar_type(), " keys for a ", k_cache.scalar_type(),
              " cache and ", slot_mapping.scalar_type(), " slots");
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k.size(1) == k_cache.size(2) && k.size(2) == k_cache.size(3) && k_cache.is_contiguous() &&
                  v_cache.is_contiguous() && slot_mapping.dim() == 1 && slot_mapping.size(0) == k.size(0) &&
                  (!int8 || (k_scale->is_contiguous() && v_scale->is_contiguous() &&
                             k_scale->sizes() == k_cache.sizes().slice(0, 3) && v_scale->sizes() == k_scale->sizes())),
              "store_kvcache_cpu: k and v [tokens, kv_heads, head_dim], contiguous caches [blocks, block_size, "
              "kv_heads, head_dim] (and scales [blocks, block_size, kv_heads]) and one slot per token, got ",
              k.sizes(), ", ", k_cache.sizes(), " and ", slot_mapping.sizes());
  const int64_t heads = k.size(1), dim = k.size(2), row = heads * dim, slots = k_cache.size(0) * k_cache.size(1);
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k.stride(1) == dim && v.stride(1) == dim,
              "store_kvcache_cpu: each token's keys and values must be one contiguous row of kv_heads × head_dim");
  const auto slot_tensor = slot_mapping.contiguous();
  const int64_t* slot = slot_tensor.data_ptr<int64_t>();
  for (int64_t t = 0; t < k.size(0); ++t)
    TORCH_CHECK(slot[t] >= -1 && slot[t] < slots, "store_kvcache_cpu: slot ", slot[t], " of token ", t,
                " is outside the cache's ", slots, " slots");
  const int64_t pad_slot = skip_unslotted ? -1 : slots - 1;  // where slot -1 goes: nowhere, or the last slot
  auto *kc = static_cast<char*>(k_cache.data_ptr()), *vc = static_cast<char*>(v_cache.data_ptr());
  const auto *kp = static_cast<const char*>(k.data_ptr()), *vp = static_cast<const char*>(v.data_ptr());
  const auto k_stride = k.stride(0) * k.element_size(), v_stride = v.stride(0) * v.element_size();
  float *ks = int8 ? k_scale->data_ptr<float>() : nullptr, *vs = int8 ? v_scale->data_ptr<float>() : nullptr;
  const auto bytes = row * k_cache.element_size();
  at::parallel_for(0, k.size(0), int8 ? 64 : 256, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = slot[t] >= 0 ? slot[t] : pad_slot;
      if (s >= 0 && !int8) {
        std::memcpy(kc + s * bytes, kp + t * k_stride, bytes);
        std::memcpy(vc + s * bytes, vp + t * v_stride, bytes);
      }
      for (int64_t h = 0; s >= 0 && int8 && h < heads; ++h) {
        const auto in = h * dim * sizeof(float);
        quantize_row(reinterpret_cast<const float*>(kp + t * k_stride + in), dim,
                     reinterpret_cast<int8_t*>(kc) + (s * heads + h) * dim, ks + s * heads + h);
        quantize_row(reinterpret_cast<const float*>(vp + t * v_stride + in), dim,
                     reinterpret_cast<int8_t*>(vc) + (s * heads + h) * dim, vs + s * heads + h);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minillm_cpu, m) {
  m.def("store_kvcache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, "
        "bool skip_unslotted, Tensor(c!)? k_scale, Tensor(d!)? v_scale) -> ()");
}

TORCH_LIBRARY_IMPL(minillm_cpu, CPU, m) { m.impl("store_kvcache", &store_kvcache); }
