// y = x @ Wᵀ (+ bias) for a quantized weight W, as minillm.quantization.formats.quant_linear_reference computes it:
// int8 with a float32 scale per output row (I8), or llama.cpp's blocks of 32 weights with a float16 scale d each, as
// a GGUF file holds them (Q8_0: 8-bit q, w = d·q; Q4_0: 4-bit q, w = d·(q − 8); Q4_1: 4-bit q and a float16 minimum
// m, w = d·q + m).
//
// Why decode reads bytes. A decode step multiplies each weight once per row of x: at batch 1 a matrix-vector product,
// one multiply-add per weight loaded, whose speed is the memory's, not the cores'. Its time is the weight's bytes
// over the bandwidth, so int8 (1 byte a weight) and Q4_0 (4.5 bits) take about 4x and 7x less time than float32, as
// long as the work per byte stays below what the memory delivers: it must be a handful of instructions per 64 weights.
//
// Why the activations are quantized too. Each row of x is cut into blocks of 32 like the weight's, each block scaled
// so that its largest value is 127 and rounded to int8 (formats.quantize_activations, to the last bit). A block's 32
// products are then int8 × int8, whose sum is an exact int32: one instruction multiplies 64 (or 32) pairs of bytes
// and adds them four by four into int32 lanes (AVX-512 VNNI's vpdpbusd; AVX2's vpmaddubsw then vpmaddwd). These take
// one unsigned operand, so a signed weight lends its sign to the activation and is used as |w| (the sign trick:
// |w| · (x · sign w) = w · x). The float scales multiply once per block: the block's lanes, converted to float, times
// d_w · d_x, added into float lanes, with one horizontal sum per output at the end.
//
// How a Q4 block is unpacked. Its 16 bytes hold value j in the low four bits of byte j and value j + 16 in the high
// four: loaded twice side by side, the second copy shifted right by four, all masked with 0x0F, they are the block's
// 32 values in order, 0..15, unsigned as vpdpbusd wants them. Q4_1's w = d·q + m adds m · d_x · Σq_x per block, the
// activation block's sum Σq_x computed once when x is quantized; Q4_0's w = d·(q − 8) is the same with m = −8·d.
//
// Decode (up to DECODE_ROWS rows): threads split the output rows, each a contiguous run of the weight's bytes with a
// prefetch_once ahead; up to R_MAX rows of x share each load of a weight block (register blocking), and further rows
// come back to the same weight row while it is in the L1 cache: the weight is read from memory once.
//
// Why int8 rows come in groups of four. A row of 768 int8 weights is read in a dozen steps, and each step of one row
// loads its x block and scales, and each row ends in a horizontal sum: at 1 byte a weight that bookkeeping, not the
// memory, would set the pace when the cores are busy. So the CPU path stores an int8 weight packed
// (packing.pack_int8): rows in groups of GROUP, block by block, [out / 4, in / 32, 4, 32]. A group's blocks are
// still one run of bytes, one load of x serves four rows, and with AVX-512 one register holds a block of two rows
// (x's block loaded into both halves). Measured on a 2-core AMD EPYC over the 49 matmuls of a 100M model's decode
// step, from memory: 1.06x the row-by-row loop (0.97-1.26x); from the L3 cache, 40 -> 62-69 GB/s. A plain software
// prefetch (into the L1 or the L2 cache) made the grouped loop 4-18% slower than none; prefetch_once 8 KiB ahead
// made the engine's int8 decode 1.2-1.34x faster than none. The GGUF formats stay in their file's row order.
//
// Prefill (more rows): a matrix-matrix product, bound by arithmetic, where float FMAs on a register tile beat the
// integer lanes. A panel of NR output rows is dequantized into float32 [in, NR] in a per-thread scratch that stays in
// the L2 cache, x is quantized and dequantized (x' = d_x · q_x blockwise: the same product, in float), and
// linear_cpu.cpp's register-tiled fp32 kernel (linear_tile.h) runs all rows of x' over the panel. Dequantizing costs
// about a cycle per weight (it is a transpose), paid once for all the rows: measured on a 2-core AMD EPYC, the
// integer kernel is as fast up to about 100 rows, hence DECODE_ROWS.
//
// The instruction set is fixed at compile time: the 512-bit VNNI path where -march=native offers AVX-512 VNNI and BW
// and at::vec is built for AVX-512 (CPU_CAPABILITY_AVX512: torch's capability, which ATEN_CPU_CAPABILITY sets), AVX2
// where it offers AVX2, plain C++ otherwise; quant_isa() says which.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "linear_tile.h"

namespace {

constexpr int64_t BLOCK = 32;        // weights (and activations) per block, one scale each
constexpr int64_t R_MAX = 4;         // rows of x that share each load of a weight block
constexpr int64_t DECODE_ROWS = 64;  // up to how many rows of x the integer kernel runs; the fp32 panels past it
constexpr int64_t PREFETCH = 8192;   // bytes ahead of the weight reads that a decode thread asks the cache for
constexpr int64_t GROUP = 4;         // int8 weight rows packed together, block by block (packing.pack_int8)
constexpr int I8 = 24, Q8_0 = 8, Q4_0 = 2, Q4_1 = 3;  // formats.py's type codes (ggml's, and ours for I8)

inline float half(const uint8_t* p) {  // a little-endian float16
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::Half(bits, c10::Half::from_bits());
}

// One step of the integer kernel: the int8 values of STEP blocks in a register (Ints), their products' int32 sums
// four by four (Lanes, 8 a block), those as floats (Floats), and the blocks' two scales (Pair: the weight's d and m,
// or the activation's d_x and d_x · Σq_x, for each block). A step's `n` ≤ STEP blocks are real, the rest zeros: only
// a row's last step may be short, and nothing past it is read.
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr const char* ISA = "avx512_vnni";
constexpr int64_t STEP = 2;
using Ints = __m512i;
using Lanes = __m512i;
using Floats = __m512;
using Pair = __m128;  // dA mA dB mB

// The 32 bytes at p and, when n is 2, the 32 at p + stride (one load when they are contiguous).
inline Ints load(const void* p, int64_t stride, int64_t n) {
  const auto* b = static_cast<const char*>(p);
  if (n > 1 && stride == BLOCK) return _mm512_loadu_si512(b);
  const __m256i hi = n > 1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + stride)) : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))), hi, 1);
}
// The values 0..15 of the Q4 blocks whose 16 bytes are at p and p + stride: the bytes [A | A | B | B] (broadcast
// loads), every other 8 of them shifted right by four, masked to four bits: A's 32 values in order, then B's.
inline Ints nibbles(const uint8_t* p, int64_t stride, int64_t n) {
  const __m512i a = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i ab =
      n > 1 ? _mm512_mask_broadcast_i32x4(a, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride)))
            : _mm512_maskz_mov_epi32(0x00FF, a);
  return _mm512_and_si512(_mm512_srlv_epi64(ab, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
}
inline Lanes dot_unsigned(Ints u, Ints s) { return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s); }
inline Lanes dot_signed(Ints w, Ints x) {  // x negated where w < 0 (x is never -128), times |w|
  return dot_unsigned(_mm512_abs_epi8(w), _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x));
}
// The two float16 at p (a block's d, and m or its first values) and, when n is 2, at p + stride.
inline Pair halves(const uint8_t* p, int64_t stride, int64_t n) {
  uint32_t a, b = 0;
  std::memcpy(&a, p, 4);
  if (n > 1) std::memcpy(&b, p + stride, 4);
  return _mm_cvtph_ps(_mm_cvtsi64_si128(a | uint64_t{b} << 32));
}
inline Pair load_pair(const float* p) { return _mm_loadu_ps(p); }
inline Pair mul(Pair a, Pair b) { return _mm_mul_ps(a, b); }
inline Pair add(Pair a, Pair b) { return _mm_add_ps(a, b); }
inline Pair with_min(Pair p, float c) { return _mm_mul_ps(_mm_moveldup_ps(p), _mm_setr_ps(1, c, 1, c)); }  // m = c · d
inline Floats spread(Pair p) {  // each block's d in its 8 lanes
  const __m512i index = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  return _mm512_permutexvar_ps(index, _mm512_castps128_ps512(p));
}
inline float sum_m(Pair p) {  // mA + mB
  const __m128 m = _mm_movehdup_ps(p);
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehl_ps(m, m)));
}
inline Floats to_float(Lanes s) { return _mm512_cvtepi32_ps(s); }
inline Floats zeros() { return _mm512_setzero_ps(); }
inline Floats broadcast(float d) { return _mm512_set1_ps(d); }
inline Floats fmadd(Floats a, Floats b, Floats c) { return _mm512_fmadd_ps(a, b, c); }
inline float sum(Floats v) { return _mm512_reduce_add_ps(v); }

// A packed int8 group (GROUP rows, block by block) fills a register with one block of PER rows: x's 32 values go in
// each half, and each half's lanes sum to one row's output.
constexpr int64_t PER = 2;
inline Ints rows_block(const int8_t* x) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
inline void row_sums(Floats v, float* s) {
  const __m256 lo = _mm512_castps512_ps256(v), hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  for (int h = 0; h < 2; ++h) {
    const __m256 u = h ? hi : lo;
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    s[h] = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr const char* ISA = "avx2";
constexpr int64_t STEP = 1;
using Ints = __m256i;
using Lanes = __m256i;
using Floats = __m256;
using Pair = __m128;  // d m 0 0

inline Ints load(const void* p, int64_t, int64_t) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline Ints nibbles(const uint8_t* p, int64_t, int64_t) {  // a Q4 block's 16 bytes, twice, the second >> 4, & 0x0F
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}
inline Lanes dot_unsigned(Ints u, Ints s) {  // pairs into int16 (|u · s| ≤ 2 · 128 · 127: no saturation), then 4s
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
inline Lanes dot_signed(Ints w, Ints x) { return dot_unsigned(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)); }
inline Pair halves(const uint8_t* p, int64_t, int64_t) {
  uint32_t h;
  std::memcpy(&h, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(h));
}
inline Pair load_pair(const float* p) { return _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p))); }
inline Pair mul(Pair a, Pair b) { return _mm_mul_ps(a, b); }
inline Pair add(Pair a, Pair b) { return _mm_add_ps(a, b); }
inline Pair with_min(Pair p, float c) { return _mm_mul_ps(_mm_moveldup_ps(p), _mm_setr_ps(1, c, 1, c)); }
inline Floats spread(Pair p) { return _mm256_broadcastss_ps(p); }
inline float sum_m(Pair p) { return _mm_cvtss_f32(_mm_movehdup_ps(p)); }
inline Floats to_float(Lanes s) { return _mm256_cvtepi32_ps(s); }
inline Floats zeros() { return _mm256_setzero_ps(); }
inline Floats broadcast(float d) { return _mm256_set1_ps(d); }
inline Floats fmadd(Floats a, Floats b, Floats c) { return _mm256_fmadd_ps(a, b, c); }
inline float sum(Floats v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
constexpr int64_t PER = 1;  // a register holds one row's block
inline Ints rows_block(const int8_t* x) { return load(x, BLOCK, 1); }
inline void row_sums(Floats v, float* s) { s[0] = sum(v); }

#else
constexpr const char* ISA = "scalar";
constexpr int64_t STEP = 1;
struct Ints {
  int32_t v[BLOCK];
};
using Lanes = int32_t;
using Floats = float;
struct Pair {
  float d, m;
};

inline Ints load(const void* p, int64_t, int64_t) {
  Ints r;
  for (int64_t i = 0; i < BLOCK; ++i) r.v[i] = static_cast<const int8_t*>(p)[i];
  return r;
}
inline Ints nibbles(const uint8_t* p, int64_t, int64_t) {
  Ints r;
  for (int64_t i = 0; i < BLOCK / 2; ++i) r.v[i] = p[i] & 0x0F, r.v[i + BLOCK / 2] = p[i] >> 4;
  return r;
}
inline Lanes dot_unsigned(const Ints& u, const Ints& s) {
  int32_t t = 0;
  for (int64_t i = 0; i < BLOCK; ++i) t += u.v[i] * s.v[i];
  return t;
}
inline Lanes dot_signed(const Ints& w, const Ints& x) { return dot_unsigned(w, x); }
inline Pair halves(const uint8_t* p, int64_t, int64_t) { return {half(p), half(p + 2)}; }
inline Pair load_pair(const float* p) { return {p[0], p[1]}; }
inline Pair mul(Pair a, Pair b) { return {a.d * b.d, a.m * b.m}; }
inline Pair add(Pair a, Pair b) { return {a.d + b.d, a.m + b.m}; }
inline Pair with_min(Pair p, float c) { return {p.d, c * p.d}; }
inline Floats spread(Pair p) { return p.d; }
inline float sum_m(Pair p) { return p.m; }
inline Floats to_float(Lanes s) { return static_cast<float>(s); }
inline Floats zeros() { return 0.f; }
inline Floats broadcast(float d) { return d; }
inline Floats fmadd(Floats a, Floats b, Floats c) { return a * b + c; }
inline float sum(Floats v) { return v; }
constexpr int64_t PER = 1;
inline Ints rows_block(const int8_t* x) { return load(x, BLOCK, 1); }
inline void row_sums(Floats v, float* s) { s[0] = v; }
#endif

// The weight formats, each a row of blocks (int8's rows in groups): the values of a step's n blocks from block b
// (Ints), their scales d and minimums m (Pair), and one block dequantized to 32 floats as formats.py does it.
struct FormatI8 {  // int8 packed by pack_int8, [out / 4, in / 32, 4, 32]; the row's float32 scale multiplies at the end
  static constexpr int64_t BYTES = BLOCK, ROWS = GROUP;
  static void dequantize(const uint8_t* block, float row_scale, float* w) {
    for (int64_t i = 0; i < BLOCK; ++i) w[i] = static_cast<int8_t>(block[i]) * row_scale;
  }
};
struct FormatQ8_0 {  // d, then 32 int8: w = d · q
  static constexpr int64_t BYTES = 2 + BLOCK, ROWS = 1;
  static constexpr bool SIGNED = true, MIN = false;
  static Ints values(const uint8_t* row, int64_t b, int64_t n) { return load(row + b * BYTES + 2, BYTES, n); }
  static Pair scales(const uint8_t* row, int64_t b, int64_t n) { return halves(row + b * BYTES, BYTES, n); }
  static void dequantize(const uint8_t* block, float, float* w) {
    const float d = half(block);
    for (int64_t i = 0; i < BLOCK; ++i) w[i] = d * static_cast<int8_t>(block[2 + i]);
  }
};
struct FormatQ4_0 {  // d, then 16 bytes of 4-bit q: w = d · (q − 8), that is d · q + m with m = −8 · d
  static constexpr int64_t BYTES = 2 + BLOCK / 2, ROWS = 1;
  static constexpr bool SIGNED = false, MIN = true;
  static Ints values(const uint8_t* row, int64_t b, int64_t n) { return nibbles(row + b * BYTES + 2, BYTES, n); }
  static Pair scales(const uint8_t* row, int64_t b, int64_t n) {
    return with_min(halves(row + b * BYTES, BYTES, n), -8);
  }
  static void dequantize(const uint8_t* block, float, float* w) {
    const float d = half(block);
    for (int64_t i = 0; i < BLOCK / 2; ++i)
      w[i] = d * ((block[2 + i] & 0x0F) - 8.f), w[i + BLOCK / 2] = d * ((block[2 + i] >> 4) - 8.f);
  }
};
struct FormatQ4_1 {  // d, m, then 16 bytes of 4-bit q: w = d · q + m
  static constexpr int64_t BYTES = 4 + BLOCK / 2, ROWS = 1;
  static constexpr bool SIGNED = false, MIN = true;
  static Ints values(const uint8_t* row, int64_t b, int64_t n) { return nibbles(row + b * BYTES + 4, BYTES, n); }
  static Pair scales(const uint8_t* row, int64_t b, int64_t n) { return halves(row + b * BYTES, BYTES, n); }
  static void dequantize(const uint8_t* block, float, float* w) {
    const float d = half(block), m = half(block + 2);
    for (int64_t i = 0; i < BLOCK / 2; ++i)
      w[i] = d * (block[4 + i] & 0x0F) + m, w[i + BLOCK / 2] = d * (block[4 + i] >> 4) + m;
  }
};

// Block b of row j of a run of weight rows that starts at a group: ROWS rows interleaved block by block.
template <class F>
const uint8_t* block_at(const uint8_t* rows, int64_t row_bytes, int64_t j, int64_t b) {
  return rows + j / F::ROWS * F::ROWS * row_bytes + (b * F::ROWS + j % F::ROWS) * F::BYTES;
}

// A block of 32 floats at x as formats.quantize_activations quantizes it: round(x · inverse) into q (integers
// -127..127, as floats; halves to even), where inverse is 127 / amax as torch computes it (1 / amax, times 127) or 0
// for a block of zeros. Returns the block's scale, amax / 127 rounded to float16, and its sum Σq into `total`.
inline float quantize_block(const float* x, float* q, float& total) {
  Vec amax(0.f), sum(0.f);
  for (int64_t i = 0; i < BLOCK; i += Vec::size()) amax = at::vec::maximum(amax, Vec::loadu(x + i).abs());
  const float m = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, amax);
  const Vec inverse(m > 0 ? 1.f / m * 127.f : 0.f);
  for (int64_t i = 0; i < BLOCK; i += Vec::size()) {
    const Vec v = (Vec::loadu(x + i) * inverse).round();
    v.store(q + i);
    sum = sum + v;
  }
  total = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum);
  return static_cast<float>(c10::Half(m / 127.f));  // the scale in float16, as llama.cpp keeps it
}

// x quantized for the integer kernel: per row, `blocks` blocks (a multiple of STEP, zeros past the row's end) of 32
// int8 values q, and each block's pair of scales s: d_x and d_x · Σq (for the Q4 formats' minimum term).
struct Acts {
  const int8_t* q;
  const float* s;
  int64_t blocks;
};

// y[r * out] = x[r] · row (plus bias) for the R rows of `a` and one row of a GGUF weight: per step,
// STEP blocks' exact integer sums, times d_w · d_x, into float lanes `acc`, and the Q4 formats' m · d_x · Σq_x into
// `low` (the scale pair's second halves); one horizontal sum per row at the end.
template <class F, int R>
void dot_rows(const Acts& a, const uint8_t* row, int64_t blocks, float bias, float* y, int64_t out) {
  constexpr int SETS = R <= 2 ? 2 : 1;  // sums kept apart for every other step: more chains for the FMA latency
  Floats acc[SETS][R];
  Pair low[SETS][R];
  for (int i = 0; i < SETS; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = zeros(), low[i][r] = Pair{};
  const auto step = [&](int64_t b, int64_t n, int i) {
    for (int64_t line = 0; line < STEP * F::BYTES; line += 64) prefetch_once(row + b * F::BYTES + PREFETCH + line);
    const Ints w = F::values(row, b, n);
    const Pair dm = F::scales(row, b, n);
    for (int r = 0; r < R; ++r) {
      const int64_t at = r * a.blocks + b;
      const Ints x = load(a.q + at * BLOCK, BLOCK, STEP);
      const Pair scale = mul(dm, load_pair(a.s + 2 * at));
      acc[i][r] = fmadd(to_float(F::SIGNED ? dot_signed(w, x) : dot_unsigned(w, x)), spread(scale), acc[i][r]);
      if constexpr (F::MIN) low[i][r] = add(low[i][r], scale);
    }
  };
  int64_t b = 0;
  for (; b + 2 * STEP <= blocks; b += 2 * STEP) step(b, STEP, 0), step(b + STEP, STEP, SETS - 1);
  for (; b < blocks; b += STEP) step(b, std::min(STEP, blocks - b), 0);
  for (int r = 0; r < R; ++r) {
    if constexpr (SETS > 1) acc[0][r] = acc[0][r] + acc[1][r], low[0][r] = add(low[0][r], low[1][r]);
    y[r * out] = sum(acc[0][r]) + (F::MIN ? sum_m(low[0][r]) : 0.f) + bias;
  }
}

// y[r * out + j] = x[r] · (row j of an int8 group) · row_scale[j] (plus bias) for the R rows of `a` and the first
// `rows` rows of the group: per block, the group's GROUP / PER registers of weights loaded once for the R rows of x,
// each row's x block loaded (and its scale broadcast) once for the whole group.
template <int R>
void dot_group(const Acts& a, const uint8_t* group, int64_t blocks, const float* row_scale, const float* bias, float* y,
               int64_t out, int64_t rows) {
  constexpr int K = GROUP / PER, SETS = R * K <= 2 ? 2 : 1;
  Floats acc[SETS][R][K];
  for (int i = 0; i < SETS; ++i)
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < K; ++k) acc[i][r][k] = zeros();
  const auto step = [&](int64_t b, int i) {
    const uint8_t* p = group + b * GROUP * BLOCK;
    for (int64_t line = 0; line < GROUP * BLOCK; line += 64) prefetch_once(p + PREFETCH + line);
    Ints w[K];
    for (int k = 0; k < K; ++k) w[k] = load(p + k * PER * BLOCK, BLOCK, PER);
    for (int r = 0; r < R; ++r) {
      const int64_t at = r * a.blocks + b;
      const Ints x = rows_block(a.q + at * BLOCK);
      const Floats d = broadcast(a.s[2 * at]);
      for (int k = 0; k < K; ++k) acc[i][r][k] = fmadd(to_float(dot_signed(w[k], x)), d, acc[i][r][k]);
    }
  };
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) step(b, 0), step(b + 1, SETS - 1);
  if (b < blocks) step(b, 0);
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) {
      if constexpr (SETS > 1) acc[0][r][k] = acc[0][r][k] + acc[1][r][k];
      float s[PER];
      row_sums(acc[0][r][k], s);
      for (int64_t h = 0, j = k * PER; h < PER && j < rows; ++h, ++j)
        y[r * out + j] = s[h] * row_scale[j] + (bias ? bias[j] : 0.f);
    }
}

// Up to DECODE_ROWS rows: x quantized, then the output rows split among the threads, each weight row read once for
// all rows of x, R_MAX at a time (an int8 group two at a time).
template <class F>
void decode(const float* x, int64_t rows, int64_t in, const uint8_t* w, int64_t row_bytes, const float* scale,
            const float* bias, float* y, int64_t out) {
  const int64_t blocks = in / BLOCK, padded = (blocks + STEP - 1) / STEP * STEP;
  // scratch of the calling thread, reused call after call (a decode step makes dozens of these calls, and two
  // allocations each cost as much as a small matrix's arithmetic); zeros past each row's blocks
  thread_local std::vector<int8_t> quantized;
  thread_local std::vector<float> scales;
  quantized.assign(rows * padded * BLOCK, 0);
  scales.assign(rows * padded * 2, 0.f);
  int8_t* q = quantized.data();
  float* s = scales.data();
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0, at = r * padded; b < blocks; ++b, ++at) {
        float v[BLOCK], total;
        const float d = quantize_block(x + r * in + b * BLOCK, v, total);
        for (int64_t i = 0; i < BLOCK; ++i) q[at * BLOCK + i] = static_cast<int8_t>(v[i]);
        s[2 * at] = d, s[2 * at + 1] = d * total;
      }
  });
  const int64_t run = F::ROWS * row_bytes, grain = std::max<int64_t>(1, (32 << 10) / run);  // ≥ 32 KiB a thread
  at::parallel_for(0, (out + F::ROWS - 1) / F::ROWS, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o = g * F::ROWS;
      if constexpr (F::ROWS > 1) {
        for (int64_t r = 0; r < rows; r += 2) {
          const Acts part{q + r * padded * BLOCK, s + 2 * r * padded, padded};
          (rows - r > 1 ? dot_group<2> : dot_group<1>)(part, w + g * run, blocks, scale + o, bias ? bias + o : nullptr,
                                                        y + r * out + o, out, std::min(F::ROWS, out - o));
        }
      } else {
        constexpr void (*kernels[])(const Acts&, const uint8_t*, int64_t, float, float*, int64_t) = {
            dot_rows<F, 1>, dot_rows<F, 2>, dot_rows<F, 3>, dot_rows<F, 4>};
        for (int64_t r = 0; r < rows; r += R_MAX) {
          const Acts part{q + r * padded * BLOCK, s + 2 * r * padded, padded};
          kernels[std::min(R_MAX, rows - r) - 1](part, w + o * row_bytes, blocks, bias ? bias[o] : 0.f, y + r * out + o,
                                                 out);
        }
      }
    }
  });
}

// Output rows c .. c + NR of the weight dequantized into panel [in, NR] (zeros past `out`): block by block, the NR
// rows' 32 floats each, transposed into the panel Vec::size() × Vec::size() at a time. The NR rows (whole groups:
// NR is a multiple of GROUP) are one run of bytes, copied to `raw` first: read in order they stream at the memory's
// speed, block by block they would be NR streams at once, each waiting on the memory's latency.
template <class F>
void dequantize_panel(const uint8_t* w, int64_t row_bytes, const float* scale, int64_t c, int64_t out, int64_t in,
                      uint8_t* raw, float* panel) {
  constexpr int64_t V = Vec::size();
  static_assert(NR % GROUP == 0, "a panel holds whole int8 groups");
  std::memcpy(raw, w + c * row_bytes, std::min(NR, (out - c + F::ROWS - 1) / F::ROWS * F::ROWS) * row_bytes);
  float stage[NR * BLOCK];  // [NR, 32]
  for (int64_t b = 0; b < in / BLOCK; ++b) {
    for (int64_t j = 0; j < NR; ++j) {
      if (c + j < out)
        F::dequantize(block_at<F>(raw, row_bytes, j, b), scale ? scale[c + j] : 1.f, stage + j * BLOCK);
      else
        std::fill(stage + j * BLOCK, stage + (j + 1) * BLOCK, 0.f);
    }
    for (int64_t j = 0; j < NR; j += V)
      for (int64_t i = 0; i < BLOCK; i += V)
        at::vec::transpose_mxn<float, V, V>(stage + j * BLOCK + i, BLOCK, panel + (b * BLOCK + i) * NR + j, NR);
  }
}

// More rows: x' = x quantized and dequantized, then tasks (panel, chunk of rows), the chunks inner, so that each
// thread dequantizes a panel once and runs all its chunks of x' against it.
template <class F>
void prefill(const float* x, int64_t rows, int64_t in, const uint8_t* w, int64_t row_bytes, const float* scale,
             const float* bias, float* y, int64_t out) {
  auto dequantized = at::empty({rows, in}, at::kFloat);
  float* xq = dequantized.data_ptr<float>();
  at::parallel_for(0, rows * in / BLOCK, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float v[BLOCK], total;
      const Vec d(quantize_block(x + k * BLOCK, v, total));
      for (int64_t i = 0; i < BLOCK; i += Vec::size()) (d * Vec::loadu(v + i)).store(xq + k * BLOCK + i);
    }
  });
  const int64_t panels = (out + NR - 1) / NR;
  const int64_t chunks = std::min((rows + MR - 1) / MR, (at::get_num_threads() + panels - 1) / panels);
  const int64_t chunk = ((rows + chunks - 1) / chunks + MR - 1) / MR * MR;
  float tail_bias[NR] = {};  // the last panel's bias when it holds fewer than NR outputs: zeros past `out`
  if (bias && out % NR) std::copy(bias + out / NR * NR, bias + out, tail_bias);
  at::parallel_for(0, panels * chunks, 1, [&](int64_t t0, int64_t t1) {
    const std::unique_ptr<float[]> panel(new float[in * NR]);
    const std::unique_ptr<uint8_t[]> raw(new uint8_t[NR * row_bytes]);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = t / chunks, r0 = t % chunks * chunk, r1 = std::min(rows, r0 + chunk), c = p * NR;
      if (t == t0 || t % chunks == 0) dequantize_panel<F>(w, row_bytes, scale, c, out, in, raw.get(), panel.get());
      tile_rows(xq, in, r0, r1, panel.get(), !bias ? nullptr : c + NR <= out ? bias + c : tail_bias, c, out, y,
                nullptr);
    }
  });
}

template <class F>
void run(const float* x, int64_t rows, int64_t in, const uint8_t* w, const float* scale, const float* bias, float* y,
         int64_t out) {
  (rows <= DECODE_ROWS ? decode<F> : prefill<F>)(x, rows, in, w, in / BLOCK * F::BYTES, scale, bias, y, out);
}

// y = quant_linear_reference(x, weight, qtype, scale, bias) for float32 x [rows, in], in a multiple of 32 (an int8
// weight packed by pack_int8).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                        const std::optional<at::Tensor>& bias, int64_t qtype, int64_t out) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "quant_linear takes a contiguous float32 CPU x [rows, in], got ", x.scalar_type(), " ", x.sizes(),
              " on ", x.device());
  const int64_t rows = x.size(0), in = x.size(1);
  TORCH_CHECK(in % BLOCK == 0, "quant_linear: in (", in, ") must be a multiple of the block size, 32");
  const int64_t block_bytes = qtype == I8 ? BLOCK : qtype == Q8_0 ? 34 : qtype == Q4_0 ? 18 : qtype == Q4_1 ? 20 : 0;
  TORCH_CHECK(block_bytes, "quant_linear: unknown qtype ", qtype, " (int8 24, Q8_0 8, Q4_0 2, Q4_1 3)");
  const auto dtype = qtype == I8 ? at::kChar : at::kByte;
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == dtype && weight.is_contiguous(),
              "quant_linear: a weight of qtype ", qtype, " is a contiguous ", dtype, " CPU tensor, got ",
              weight.scalar_type(), " on ", weight.device());
  const int64_t groups = (out + GROUP - 1) / GROUP;
  TORCH_CHECK(qtype != I8 || weight.sizes() == at::IntArrayRef({groups, in / BLOCK, GROUP, BLOCK}),
              "quant_linear: an int8 weight is packed for this kernel by minillm.kernels.packing.pack_int8: for ",
              out, " outputs of ", in, " inputs [", groups, ", ", in / BLOCK, ", ", GROUP, ", ", BLOCK, "], got ",
              weight.sizes());
  TORCH_CHECK(qtype == I8 || (weight.dim() == 2 && weight.size(0) == out && weight.size(1) == in / BLOCK * block_bytes),
              "quant_linear: the weight's bytes do not match: qtype ", qtype, " for ", out, " outputs of ", in,
              " inputs is [", out, ", ", in / BLOCK * block_bytes, "] (", block_bytes, " bytes per 32 weights), got ",
              weight.sizes());
  TORCH_CHECK(qtype != I8 || (scale && scale->scalar_type() == at::kFloat && scale->is_contiguous() &&
                              scale->numel() == out),
              "quant_linear: an int8 weight needs its row scales, a contiguous float32 [out]");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out),
              "quant_linear: bias must be a contiguous float32 [out]");
  auto y = at::empty({rows, out}, x.options());
  if (rows == 0 || out == 0) return y;
  const float *xp = x.data_ptr<float>(), *sp = qtype == I8 ? scale->data_ptr<float>() : nullptr;
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  const auto* wp = static_cast<const uint8_t*>(weight.data_ptr());
  float* yp = y.data_ptr<float>();
  switch (qtype) {
    case I8: run<FormatI8>(xp, rows, in, wp, sp, bp, yp, out); break;
    case Q8_0: run<FormatQ8_0>(xp, rows, in, wp, sp, bp, yp, out); break;
    case Q4_0: run<FormatQ4_0>(xp, rows, in, wp, sp, bp, yp, out); break;
    default: run<FormatQ4_1>(xp, rows, in, wp, sp, bp, yp, out);
  }
  return y;
}

std::string quant_isa() { return ISA; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(minillm_cpu, m) {
  m.def("quant_linear(Tensor x, Tensor weight, Tensor? scale, Tensor? bias, int qtype, int out) -> Tensor");
  m.def("quant_isa() -> str", &quant_isa);  // the instruction set the integer kernel was built for
}

TORCH_LIBRARY_IMPL(minillm_cpu, CPU, m) {
  m.impl("quant_linear", &quant_linear);
}
