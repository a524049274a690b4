// y = x @ wᵀ (+ bias) for few rows of x: the matmuls of a decode step on the CPU.
//
// At batch 1 a linear layer is a matrix-vector product: every weight is read once from memory and used for
// one multiply-add, so the speed is the memory's. BLAS libraries tune for big products; for a handful of rows
// they pack or split the weight in ways that read it at a fraction of the bandwidth (measured here: MKL's
// sgemm through F.linear at 8-10 GB/s for one row, 3-5 GB/s for 2-8 rows, against ~22 GB/s the memory gives).
// This kernel streams each weight row once per group of up to 4 rows of x, with R weight rows in flight and
// R·B accumulators in registers (AVX2 has 16): the weight leaves memory once and is reused from registers by
// every row of x in the group, and from the L2 cache by the next group (the output features are walked in
// tiles of TILE rows). Output features are split across the threads of at::parallel_for.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <optional>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t TILE = 64;  // weight rows per tile: 64 rows of ≤ 4096 floats stay in a 1 MiB L2 cache

// y[b][r] = x[b] · w[r] (+ bias[r]) for B rows of x and the weight rows r0 ≤ r < r1, R of them at a time.
template <int B, int R>
void dot_rows(const float* x, int64_t in, const float* w, const float* bias, int64_t r0, int64_t r1, float* y,
              int64_t out) {
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    Vec acc[R][B];
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < B; ++b) acc[i][b] = Vec(0.f);
    int64_t c = 0;
    for (; c + Vec::size() <= in; c += Vec::size()) {
      Vec xv[B];
      for (int b = 0; b < B; ++b) xv[b] = Vec::loadu(x + b * in + c);
      for (int i = 0; i < R; ++i) {
        const Vec wv = Vec::loadu(w + (r + i) * in + c);
        for (int b = 0; b < B; ++b) acc[i][b] = at::vec::fmadd(wv, xv[b], acc[i][b]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < B; ++b) {
        float s = at::vec::vec_reduce_all<float>(std::plus<Vec>(), acc[i][b]);
        for (int64_t k = c; k < in; ++k) s += w[(r + i) * in + k] * x[b * in + k];  // in not a multiple of 8
        y[b * out + r + i] = bias ? s + bias[r + i] : s;
      }
  }
  if (r < r1) dot_rows<B, 1>(x, in, w, bias, r, r1, y, out);  // the last rows of an odd-sized range
}

// The register tile for a group of B rows of x: R·B accumulators + B inputs + 1 weight vector ≤ 16 registers.
template <int B>
void dot_tile(const float* x, int64_t in, const float* w, const float* bias, int64_t r0, int64_t r1, float* y,
              int64_t out) {
  constexpr int R = B == 1 ? 8 : B == 2 ? 4 : 2;
  dot_rows<B, R>(x, in, w, bias, r0, r1, y, out);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "linear_cpu takes float32 CPU tensors, got x ", x.scalar_type(), " on ", x.device(), " and w ",
              w.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && x.is_contiguous() && w.is_contiguous(),
              "linear_cpu: x [rows, in] and w [out, in], both contiguous, got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == w.size(0)),
              "linear_cpu: bias must be a contiguous float32 [out]");
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  auto y = at::empty({rows, out}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, (out + TILE - 1) / TILE, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * TILE, r1 = std::min(out, r0 + TILE);
      for (int64_t b = 0; b < rows; b += 4) {  // groups of 4 rows of x reuse the tile from the L2 cache
        const auto group = std::min<int64_t>(4, rows - b);
        const auto run = group == 1 ? dot_tile<1> : group == 2 ? dot_tile<2> : group == 3 ? dot_tile<3> : dot_tile<4>;
        run(xp + b * in, in, wp, bp, r0, r1, yp + b * out, out);
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minillm_cpu, m) { m.def("linear(Tensor x, Tensor w, Tensor? bias) -> Tensor"); }

TORCH_LIBRARY_IMPL(minillm_cpu, CPU, m) { m.impl("linear", &linear); }
