// The register-tiled fp32 product of linear_cpu.cpp (`tile`, see its header), shared with quant_linear_cpu.cpp,
// whose prefill path runs it on weights dequantized into a panel: x [rows, in] times one panel [in, NR] of NR output
// features, the NR weights of each input feature side by side; and the prefetch both decode kernels stream with.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t NR = 2 * Vec::size();  // outputs per panel: two vectors (16 floats with AVX2, 32 with AVX-512)
constexpr int64_t MR = 6;                 // rows of x per register tile: 6 × 2 sums + 2 weights + 1 input ≤ 16

// Asks for the cache line at p ahead of its use, as data read once (prefetchnta). A decode step reads each weight
// once, and a line fetched with this hint goes to the L1 cache without being kept in the L2 and L3 on its way out (AMD
// documents that it is never evicted to the L2; Intel's skips its non-inclusive L2 and L3): the weight's bytes stop
// displacing what the step reads again (activations, the KV cache) and spend no traffic between the caches. Measured
// in the engine on a 2-core AMD EPYC, 100M model, batch-1 decode: fp32 1.03-1.21x, int8 1.2-1.34x a plain prefetch
// (or none) at the same distance.
inline void prefetch_once(const void* p) { __builtin_prefetch(p, 0, 0); }

// The prefetch hints a stream can be run with (linear_cpu's `prefetch` argument): none, into every cache level (t0),
// or as data read once (nta, prefetch_once). Which is fastest is the CPU's to say: the engine times them
// (PackedLinearMethod) rather than trusting one vendor's measurement.
enum Hint { NONE = 0, T0 = 1, NTA = 2 };
template <int HINT>
inline void prefetch_hint(const void* p) {
  if constexpr (HINT == T0) __builtin_prefetch(p, 0, 3);
  if constexpr (HINT == NTA) prefetch_once(p);
}

// y[i][0..NR) = x_i · panel (+ bias) for the MR rows x_0 .. x_5 of x (pointers: a short tile repeats its last row)
// and one panel [in][NR]. The 12 sums are named variables, not an array: the compiler keeps them in registers.
// `next`, if given, is the panel to fetch into the cache meanwhile, one step of it per step of this one.
inline void tile(const float* const* x, int64_t in, const float* panel, const float* bias, float* const* y,
                 const float* next) {
  Vec c00(0.f), c01(0.f), c10(0.f), c11(0.f), c20(0.f), c21(0.f), c30(0.f), c31(0.f), c40(0.f), c41(0.f),
      c50(0.f), c51(0.f);
  const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
  for (int64_t k = 0; k < in; ++k, panel += NR) {
    for (int64_t line = 0; next && line < NR * 4; line += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(next + k * NR) + line);
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

// y[r][c .. c + NR) = x[r] · panel (+ bias) for the rows r0 ≤ r < r1 of x [rows, in] and the panel of output features
// c .. c + NR, tile by tile: the last tile repeats its last row, and a panel past `out` (the last, out - c < NR)
// writes through a scratch tile. `bias` is the panel's NR biases (zeros past `out`) or null; `next` is prefetched
// during the first tile.
inline void tile_rows(const float* x, int64_t in, int64_t r0, int64_t r1, const float* panel, const float* bias,
                      int64_t c, int64_t out, float* y, const float* next) {
  float spare[MR * NR];  // the output of a tile's padded rows or columns, thrown away
  const bool whole = c + NR <= out;
  for (int64_t r = r0; r < r1; r += MR) {
    const float* xr[MR];
    float* yr[MR];
    for (int64_t i = 0; i < MR; ++i) {
      const bool real = r + i < r1 && whole;
      xr[i] = x + std::min(r + i, r1 - 1) * in;
      yr[i] = real ? y + (r + i) * out + c : spare + i * NR;
    }
    tile(xr, in, panel, bias, yr, r == r0 ? next : nullptr);
    for (int64_t i = 0; !whole && i < MR && r + i < r1; ++i)
      std::copy(spare + i * NR, spare + i * NR + out - c, y + (r + i) * out + c);
  }
}

}  // namespace
