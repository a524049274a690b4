// y = x @ wᵀ (+ bias): the matmuls of the linear layers on the CPU, in two kernels.
//
// 1. `linear`, for one or two rows of x (a decode step at batch 1 or 2): a matrix-vector product.
// At batch 1 a linear layer is a matrix-vector product: every weight is read once from memory and used for
// one multiply-add, so the speed is the memory's. BLAS libraries tune for big products; for a handful of rows
// they pack or split the weight in ways that read it at a fraction of the bandwidth (measured here: MKL's
// sgemm through F.linear at 8-10 GB/s for one row, 3-5 GB/s for 2-8 rows, against ~22 GB/s the memory gives).
// This kernel streams each weight row once per group of up to 4 rows of x, with R weight rows in flight and
// R·B accumulators in registers (AVX2 has 16): the weight leaves memory once and is reused from registers by
// every row of x in the group, and from the L2 cache by the next group (the output features are walked in
// tiles of TILE rows). Output features are split across the threads of at::parallel_for.
//
// 2. `linear_packed`, for more rows: a matrix-matrix product bound by FLOP/s, on a weight packed once at load
// into panels of NR output features, [out / NR, in, NR] (cpu_kernels.pack_weight). A register tile of MR rows of
// x by one panel keeps MR × 2 vectors of sums in registers; each step over the inputs loads the panel's NR weights
// once (two vectors, consecutive in memory) for MR rows and broadcasts one float of each row. BLAS libraries
// (MKL behind F.linear) repack the weight on every call, which at decode batch sizes costs as much as the
// product: measured on this 2-core machine, 1.2-2x faster than F.linear at 16-128 rows, and on par or faster
// for prefill chunks of thousands. This is the kernel llama.cpp's sgemm and oneDNN's packed weights are about.
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

constexpr int64_t NR = 2 * Vec::size();  // output features per panel: two vectors (16 floats with AVX2, 32 with AVX-512)
constexpr int64_t MR = 6;                 // rows of x per register tile: 6 × 2 sums + 2 weights + 1 input ≤ 16

// y[i][0..NR) = x_i · panel (+ bias) for the MR rows x_0 .. x_5 of x (pointers: a short tile repeats its last row)
// and one panel [in][NR]. The 12 sums are named variables, not an array: the compiler keeps them in registers.
void tile(const float* const* x, int64_t in, const float* panel, const float* bias, float* const* y) {
  Vec c00(0.f), c01(0.f), c10(0.f), c11(0.f), c20(0.f), c21(0.f), c30(0.f), c31(0.f), c40(0.f), c41(0.f),
      c50(0.f), c51(0.f);
  const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
  for (int64_t k = 0; k < in; ++k, panel += NR) {
    const Vec w0 = Vec::loadu(panel), w1 = Vec::loadu(panel + Vec::size());
    const auto row = [&](const float* xi, Vec& s0, Vec& s1) {
      const Vec a(xi[k]);
      s0 = at::vec::fmadd(a, w0, s0);
      s1 = at::vec::fmadd(a, w1, s1);
    };
    row(x0, c00, c01), row(x1, c10, c11), row(x2, c20, c21), row(x3, c30, c31), row(x4, c40, c41), row(x5, c50, c51);
  }
  const Vec b0 = bias ? Vec::loadu(bias) : Vec(0.f), b1 = bias ? Vec::loadu(bias + Vec::size()) : Vec(0.f);
  const auto store = [&](float* yi, const Vec& s0, const Vec& s1) {
    (s0 + b0).store(yi);
    (s1 + b1).store(yi + Vec::size());
  };
  store(y[0], c00, c01), store(y[1], c10, c11), store(y[2], c20, c21), store(y[3], c30, c31), store(y[4], c40, c41),
      store(y[5], c50, c51);
}

at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                         int64_t out) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "linear_packed takes float32 CPU tensors, got x ", x.scalar_type(), " on ", x.device(), " and a ",
              packed.scalar_type(), " weight");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(1) == x.size(1) && packed.size(2) == NR &&
                  packed.size(0) * NR >= out && x.is_contiguous() && packed.is_contiguous(),
              "linear_packed: x [rows, in] contiguous and a weight packed by cpu_kernels.pack_weight, [out / ", NR,
              ", in, ", NR, "], got ", x.sizes(), " and ", packed.sizes());
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out),
              "linear_packed: bias must be a contiguous float32 [out]");
  const int64_t rows = x.size(0), in = x.size(1), panels = packed.size(0);
  auto y = at::empty({rows, out}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = packed.data_ptr<float>(), *bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  float tail_bias[NR] = {};  // the last panel's bias when it holds fewer than NR outputs: zeros past `out`
  if (bp && out % NR) std::copy(bp + out / NR * NR, bp + out, tail_bias);
  // Rows of x per task: whole tiles, about 256 KiB of x (it stays in the L2 cache while every panel passes over
  // it), the rows split evenly. Tasks are (row chunk, panel), panels inner: a thread's panels share its chunk.
  const int64_t fit = std::max<int64_t>(MR, (int64_t{1} << 16) / in / MR * MR);
  const int64_t chunks = (rows + fit - 1) / fit, chunk = ((rows + chunks - 1) / chunks + MR - 1) / MR * MR;
  at::parallel_for(0, chunks * panels, 1, [&](int64_t t0, int64_t t1) {
    float spare[MR * NR];  // the output of a tile's padded rows or columns, thrown away
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = t % panels, r0 = t / panels * chunk, r1 = std::min(rows, r0 + chunk), c = p * NR;
      const bool whole = c + NR <= out;  // the last panel may hold fewer than NR real output features
      for (int64_t r = r0; r < r1; r += MR) {
        const float* xr[MR];
        float* yr[MR];
        for (int64_t i = 0; i < MR; ++i) {
          const bool real = r + i < r1 && whole;
          xr[i] = xp + std::min(r + i, r1 - 1) * in;
          yr[i] = real ? yp + (r + i) * out + c : spare + i * NR;
        }
        tile(xr, in, wp + p * in * NR, !bp ? nullptr : whole ? bp + c : tail_bias, yr);
        for (int64_t i = 0; !whole && i < MR && r + i < r1; ++i)
          std::copy(spare + i * NR, spare + i * NR + out - c, yp + (r + i) * out + c);
      }
    }
  });
  return y;
}

int64_t panel_width() { return NR; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(minillm_cpu, m) {
  m.def("linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("linear_packed(Tensor x, Tensor packed, Tensor? bias, int out) -> Tensor");
  m.def("panel_width() -> int", &panel_width);  // NR: pack_weight lays weights out for the vectors built here
}

TORCH_LIBRARY_IMPL(minillm_cpu, CPU, m) {
  m.impl("linear", &linear);
  m.impl("linear_packed", &linear_packed);
}
