// The elementwise layers of a decoder step on the CPU, each one pass over its rows: RMSNorm (with the residual add
// fused in), SiLU-and-mul, and the rotary embedding of queries and keys. The C++ twins of minillm.layers'
// rms_norm, add_rms_norm, silu_and_mul and apply_rotary, as vLLM's CPU backend has its own (csrc/cpu/layernorm.cpp,
// activation.cpp, pos_encoding.cpp).
//
// Eagerly, each of those functions is five to ten torch ops, each a dispatch of a few microseconds and a pass
// over [tokens, hidden] in memory: on SmolLM2-135M (30 layers) some 400 small ops a step. Here each is one call
// that reads its inputs once, in vectors, and splits the rows over the threads when there are enough of them.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t GRAIN = 16384;  // floats of work below which a call stays on one thread

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 && x.stride(-1) == 1,
              name, ": float32 CPU rows with a contiguous last dimension, got ", x.scalar_type(), " ", x.sizes());
}

// out = x / sqrt(mean(x²) + eps) * w over n floats.
void norm_row(const float* x, const float* w, float eps, int64_t n, float* out) {
  const float sum = at::vec::map_reduce_all<float>([](Vec v) { return v * v; }, [](Vec a, Vec b) { return a + b; },
                                                   x, n);
  const Vec scale(1.0f / std::sqrt(sum / n + eps));
  at::vec::map2<float>([&](Vec v, Vec g) { return v * scale * g; }, out, x, w, n);
}

// rms_norm(x, weight, eps) for x [..., hidden] whose rows are contiguous (a view of heads, for Qwen3's q/k norm).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "rms_norm_cpu");
  const int64_t n = x.size(-1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == n, "rms_norm_cpu: weight of ", n, " floats");
  const auto xc = x.contiguous();
  auto out = at::empty_like(xc);
  const int64_t rows = xc.numel() / n;
  const float *xp = xc.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * n, wp, eps, n, op + r * n);
  });
  return out;
}

// add_rms_norm: (rms_norm(x + residual), x + residual) for [tokens, hidden], the sum computed once.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  check_rows(x, "add_rms_norm_cpu");
  TORCH_CHECK(x.sizes() == residual.sizes() && residual.scalar_type() == at::kFloat,
              "add_rms_norm_cpu: x and residual of one shape, got ", x.sizes(), " and ", residual.sizes());
  const int64_t n = x.size(-1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == n, "add_rms_norm_cpu: weight of ", n, " floats");
  const auto xc = x.contiguous(), rc = residual.contiguous();
  auto out = at::empty_like(xc), sum = at::empty_like(xc);
  const int64_t rows = xc.numel() / n;
  const float *xp = xc.data_ptr<float>(), *rp = rc.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float *op = out.data_ptr<float>(), *sp = sum.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      at::vec::map2<float>([](Vec a, Vec b) { return a + b; }, sp + r * n, xp + r * n, rp + r * n, n);
      norm_row(sp + r * n, wp, eps, n, op + r * n);
    }
  });
  return {out, sum};
}

// silu_and_mul: x [..., 2n] = [gate | up] -> silu(gate) * up, [..., n].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_rows(x, "silu_and_mul_cpu");
  const auto xc = x.contiguous();
  const int64_t n = xc.size(-1) / 2, rows = xc.numel() / std::max<int64_t>(1, 2 * n);
  auto sizes = xc.sizes().vec();
  sizes.back() = n;
  auto out = at::empty(sizes, xc.options());
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / std::max<int64_t>(1, n)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      at::vec::map2<float>([](Vec g, Vec u) { return g / (Vec(1.0f) + g.neg().exp_u20()) * u; }, op + r * n,
                           xp + r * 2 * n, xp + r * 2 * n + n, n);
  });
  return out;
}

// One [tokens, heads, dim] tensor rotated: the halves of each head by the token's angles (neox layout).
at::Tensor rotate(const at::Tensor& x, const int64_t* pos, const float* cache, int64_t cache_rows) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2) && x.scalar_type() == at::kFloat,
              "rotary_cpu: q and k [tokens, heads, head_dim], each token's heads one contiguous row, got ", x.sizes());
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  auto out = at::empty({tokens, heads, dim}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, tokens, std::max<int64_t>(1, GRAIN / (heads * dim)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      TORCH_CHECK(pos[t] >= 0 && pos[t] < cache_rows, "rotary_cpu: position ", pos[t], " outside the table");
      const float *c = cache + pos[t] * dim, *s = c + half;
      for (int64_t h = 0; h < heads; ++h) {
        const float* a = xp + t * stride + h * dim;
        float* o = op + (t * heads + h) * dim;
        int64_t i = 0;
        for (; i + Vec::size() <= half; i += Vec::size()) {
          const Vec x1 = Vec::loadu(a + i), x2 = Vec::loadu(a + half + i), cv = Vec::loadu(c + i), sv = Vec::loadu(s + i);
          (x1 * cv - x2 * sv).store(o + i);
          (x2 * cv + x1 * sv).store(o + half + i);
        }
        for (; i < half; ++i) {
          o[i] = a[i] * c[i] - a[half + i] * s[i];
          o[half + i] = a[half + i] * c[i] + a[i] * s[i];
        }
      }
    }
  });
  return out;
}

// rotary(positions, q, k, cos_sin_cache [max_position, head_dim] = cos | sin halves) -> (q rotated, k rotated).
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& cos_sin_cache) {
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1 && positions.size(0) == q.size(0) &&
                  q.size(0) == k.size(0) && q.size(2) == k.size(2) && cos_sin_cache.is_contiguous() &&
                  cos_sin_cache.scalar_type() == at::kFloat && cos_sin_cache.size(1) == q.size(2),
              "rotary_cpu: one int64 position per token and a float32 table [positions, head_dim], got ",
              positions.sizes(), ", q ", q.sizes(), ", k ", k.sizes(), ", table ", cos_sin_cache.sizes());
  const auto pos = positions.contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const float* cache = cos_sin_cache.data_ptr<float>();
  return {rotate(q, pp, cache, cos_sin_cache.size(0)), rotate(k, pp, cache, cos_sin_cache.size(0))};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minillm_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("rotary(Tensor positions, Tensor q, Tensor k, Tensor cos_sin_cache) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(minillm_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rotary", &rotary);
}
