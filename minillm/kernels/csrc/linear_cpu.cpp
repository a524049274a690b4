// y = x @ wᵀ (+ bias): the matmuls of the linear layers on the CPU, on a weight packed once at load.
//
// The weight [out, in] is laid out in panels of NR output features, [out / NR, in, NR] (packing.pack_weight):
// for each input feature, the NR weights of a panel sit side by side, two vectors. Two kernels read it:
//
// 1. `stream`, for one or two rows of x (a decode step at batch 1 or 2): a matrix-vector product. Every weight is read
// once from memory for one multiply-add per row, so the speed is the memory's, and a thread's panels are one contiguous
// stream of bytes: the easiest read there is for the hardware prefetcher, helped along by a software prefetch a few KiB
// ahead, whose hint and distance are arguments: the engine times the variants on the CPU it runs on
// (PackedLinearMethod): which hint helps depends on the vendor's caches and prefetchers. The weights
// live in 2 MiB pages (packing.pack_weight), so a stream of hundreds of MB needs a few hundred TLB entries, not a
// hundred thousand. BLAS libraries tune for big products; for a handful of rows they can read the weight at a fraction
// of the bandwidth (F.linear's MKL: 8-10 GB/s for one row on a 2-core AMD EPYC whose memory gives ~22; on an Intel Xeon
// within 10% at one row, not four).
//
// 2. `tile`, for more rows: a matrix-matrix product bound by FLOP/s. A register tile of MR rows of x by one panel
// keeps MR × 2 vectors of sums in registers; each step over the inputs loads the panel's NR weights once (two
// vectors, consecutive in memory) for MR rows and broadcasts one float of each row. BLAS libraries (MKL behind
// F.linear) repack the weight on every call, which at decode batch sizes costs as much as the product: measured on
// a 2-core machine, 1.2-2x faster than F.linear at 16-128 rows, and on par or faster for prefill chunks of
// thousands. This is the kernel llama.cpp's sgemm and oneDNN's packed weights are about.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/accumulate.h>
#include <sys/mman.h>
#include <unistd.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

#include "linear_tile.h"

namespace {

constexpr int64_t STREAM_ROWS = 2;       // up to how many rows of x `stream` runs; `tile` is faster from 3 or 4 on

// The L2 cache of a core as the OS reports it, or 512 KiB where it does not say.
int64_t l2_bytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  return std::max<int64_t>(sysconf(_SC_LEVEL2_CACHE_SIZE), 512 << 10);
#else
  return 512 << 10;
#endif
}
const int64_t X_BYTES = l2_bytes() / 2;  // bytes of x a task of `tile` works on; the rest holds its panel and the next

// y[b][c..c+NR) = the NR outputs of a panel for rows b < B of x, with a short last panel (out - c < NR) through a
// scratch row: sums s[b][0..1] plus the bias.
template <int B>
void store_panel(const Vec (&s)[B][2], const float* bias, int64_t c, int64_t out, float* y) {
  const int64_t n = std::min(NR, out - c);
  for (int b = 0; b < B; ++b) {
    float row[NR];
    s[b][0].store(row);
    s[b][1].store(row + Vec::size());
    for (int64_t j = 0; j < n; ++j) y[b * out + c + j] = bias ? row[j] + bias[c + j] : row[j];
  }
}

// y[b] = x[b] @ panelsᵀ (+ bias) for B (1 or 2) rows of x and the panels p0 ≤ p < p1. Each step takes U inputs with
// their own sums (U × B × 2 independent multiply-add chains hide the FMA latency), and prefetches (with HINT) what
// is read `ahead` bytes later.
template <int B, int HINT>
void stream(const float* x, int64_t in, const float* w, const float* bias, int64_t p0, int64_t p1, float* y,
            int64_t out, int64_t ahead) {
  constexpr int U = 4 / B;
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = w + p * in * NR;
    Vec s[U][B][2];
    for (int u = 0; u < U; ++u)
      for (int b = 0; b < B; ++b) s[u][b][0] = s[u][b][1] = Vec(0.f);
    int64_t k = 0;
    const auto step = [&](int u, int64_t k, const float* wk) {
      const Vec w0 = Vec::loadu(wk), w1 = Vec::loadu(wk + Vec::size());
      for (int b = 0; b < B; ++b) {
        const Vec a(x[b * in + k]);
        s[u][b][0] = at::vec::fmadd(a, w0, s[u][b][0]);
        s[u][b][1] = at::vec::fmadd(a, w1, s[u][b][1]);
      }
    };
    for (; k + U <= in; k += U, panel += U * NR) {
      for (int64_t line = 0; HINT != NONE && line < U * NR * 4; line += 64)
        prefetch_hint<HINT>(reinterpret_cast<const char*>(panel) + ahead + line);
      for (int u = 0; u < U; ++u) step(u, k + u, panel + u * NR);
    }
    for (; k < in; ++k, panel += NR) step(0, k, panel);
    for (int u = 1; u < U; ++u)
      for (int b = 0; b < B; ++b) s[0][b][0] = s[0][b][0] + s[u][b][0], s[0][b][1] = s[0][b][1] + s[u][b][1];
    store_panel<B>(s[0], bias, p * NR, out, y);
  }
}

// `stream` for B rows of x with the prefetch hint `hint` (a Hint).
template <int B>
auto stream_with(int64_t hint) {
  return hint == NTA ? stream<B, NTA> : hint == T0 ? stream<B, T0> : stream<B, NONE>;
}

// y = x @ wᵀ (+ bias) for x [rows, in] and w packed by pack_weight: `stream` up to STREAM_ROWS rows, prefetching with
// `hint` `ahead` bytes ahead of its reads, and `tile` past it.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias, int64_t out,
                  int64_t hint, int64_t ahead) {
  TORCH_CHECK(hint >= NONE && hint <= NTA && ahead >= 0, "linear_cpu: prefetch hint 0 (none), 1 (t0) or 2 (nta) ",
              "and a distance >= 0, got ", hint, " and ", ahead);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "linear_cpu takes float32 CPU tensors, got x ", x.scalar_type(), " on ", x.device(), " and a ",
              packed.scalar_type(), " weight");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(1) == x.size(1) && packed.size(2) == NR &&
                  packed.size(0) * NR >= out && x.is_contiguous() && packed.is_contiguous(),
              "linear_cpu: x [rows, in] contiguous and a weight packed by packing.pack_weight, [out / ", NR,
              ", in, ", NR, "], got ", x.sizes(), " and ", packed.sizes());
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out),
              "linear_cpu: bias must be a contiguous float32 [out]");
  const int64_t rows = x.size(0), in = x.size(1), panels = packed.size(0);
  auto y = at::empty({rows, out}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = packed.data_ptr<float>(), *bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (rows == 0) return y;  // a chunked prefill's step that samples nothing asks the LM head for no rows
  if (rows <= STREAM_ROWS) {  // the panels split in one contiguous run per thread
    const auto run = rows == 1 ? stream_with<1>(hint) : stream_with<2>(hint);
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) { run(xp, in, wp, bp, p0, p1, yp, out, ahead); });
    return y;
  }
  float tail_bias[NR] = {};  // the last panel's bias when it holds fewer than NR outputs: zeros past `out`
  if (bp && out % NR) std::copy(bp + out / NR * NR, bp + out, tail_bias);
  // Rows of x per task: whole tiles, up to half the L2 cache of x (it stays there while every panel passes over
  // it), the rows split evenly. Tasks are (row chunk, panel), panels inner: a thread's panels share its chunk.
  const int64_t fit = std::max<int64_t>(MR, X_BYTES / 4 / in / MR * MR);
  const int64_t chunks = (rows + fit - 1) / fit, chunk = ((rows + chunks - 1) / chunks + MR - 1) / MR * MR;
  at::parallel_for(0, chunks * panels, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = t % panels, r0 = t / panels * chunk, r1 = std::min(rows, r0 + chunk), c = p * NR;
      const float* next = t + 1 < t1 ? wp + (t + 1) % panels * in * NR : nullptr;  // the next task's panel
      tile_rows(xp, in, r0, r1, wp + p * in * NR, !bp ? nullptr : c + NR <= out ? bp + c : tail_bias, c, out, yp,
                next);
    }
  });
  return y;
}

// An uninitialised float32 tensor in a mapping of its own that starts on a 2 MiB boundary, with the OS advised to
// back it by transparent huge pages (where they are off, or on other systems, it gets ordinary 4 KiB pages).
at::Tensor empty_pages(at::IntArrayRef sizes) {
  constexpr uintptr_t HUGE = uintptr_t{2} << 20;
  const size_t bytes = std::max<int64_t>(c10::multiply_integers(sizes), 1) * sizeof(float), mapped = bytes + HUGE;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(base != MAP_FAILED, "empty_pages: could not map ", bytes, " bytes for a packed weight");
  void* data = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(base) + HUGE - 1) & ~(HUGE - 1));
#ifdef MADV_HUGEPAGE
  madvise(data, bytes, MADV_HUGEPAGE);
#endif
  return at::from_blob(data, sizes, [base, mapped](void*) { munmap(base, mapped); }, at::TensorOptions(at::kFloat));
}

int64_t panel_width() { return NR; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(minillm_cpu, m) {
  m.def("linear(Tensor x, Tensor packed, Tensor? bias, int out, int hint, int ahead) -> Tensor");
  m.def("empty_pages(int[] sizes) -> Tensor", &empty_pages);
  m.def("panel_width() -> int", &panel_width);  // NR: pack_weight lays weights out for the vectors built here
}

TORCH_LIBRARY_IMPL(minillm_cpu, CPU, m) {
  m.impl("linear", &linear);
}
