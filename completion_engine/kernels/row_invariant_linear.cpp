// y = x @ w.T (+ bias) in float32, where every output is one fixed chain of fused multiply-adds:
//
//   y[m][n] = fma(x[m][K-1], w[n][K-1], ... fma(x[m][1], w[n][1], fma(x[m][0], w[n][0], 0.0f)) ...) + bias[n]
//
// whatever the number of rows M, the row's place among them, the thread count or the blocking below.
// Blocking only decides which outputs are computed side by side, never the order of a chain, and a
// partial chain parked in memory between k blocks is an exact float32 value. So a row gets the same
// bits alone (a decode step) as inside a 16-row verify block or a 128-row prefill block.
// (completion_engine/row_invariant.py says why, and how fast this is next to MKL.)

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>
#include <atomic>
#include <limits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kVectors = 4;              // AVX2 vectors of 8 floats per panel row
constexpr int64_t kPanel = kVectors * 8;     // output columns per panel
constexpr int64_t kBlockK = 128;             // k per block: a 128 x 32 panel block (16 KiB) stays in L1
constexpr int64_t kBlockRows = 3;            // rows per micro-kernel call: 3 x 4 accumulators
constexpr int64_t kHalfRows = 6;             // bf16 panels, small blocks: tiles of 6 rows x 2 vectors (half a panel)
constexpr int64_t kHalfRowsMost = 16;        // the most rows that take half-panel tiles, or 512-bit ones (a whole verify block)
// How far ahead (in weights) a bf16 panel's tiles ask for the stream, where a few rows multiply the
// weights as they arrive: the hardware prefetcher alone left the multiplies waiting on memory. On 2
// threads of an AMD EPYC with AVX2 (the embedded model, 2,000-token context, the old and new builds
// alternating in one process, best of 4 x 5), the 30 layers' Linears and the LM head: 1 row 10.2 ->
// 9.5 ms, 3 rows 12.3 -> 10.6, 4 rows 13.3 -> 11.1, 8 rows 20.8 -> 17.5, 11 rows 23.0 -> 20.3; a whole
// verify forward of 4 rows 20.9 -> 18.3 ms, of 11 rows 40.2 -> 36.8. A tile of up to 3 rows streams
// each panel once, 2 KiB ahead; half-panel tiles pass over a k block once a tile and half (only the
// first from memory, the rest from L1), 4 KiB ahead. Distances of 1 KiB (tiles of up to 3 rows) and
// 2 KiB (half-panel tiles), 1 and 1, or 2 and 2 did no better in the same kind of run. With 512-bit
// tiles (AVX-512) only a 1-row step takes these tiles: not measured there.
constexpr int64_t kWeightAhead = 1024, kHalfWeightAhead = 2048;
// The passes over a k block after its first (the second half panel, a second tile of rows) read its
// weights from L1 and ask for the next block's instead, a whole block (128 x 32 weights) ahead: with
// the first pass alone asking, memory sat idle while the later passes multiplied. The same chains
// (only prefetches moved). Measured on 2 cores of an AMD EPYC with AVX2 (the 30 layers' Linears and
// the LM head, the old and new builds alternating in one process, 24 rounds on two threads and 10 on
// one, mean of the fastest quarter; two runs on two threads): two threads 4 rows 12.2 -> 11.1 and
// 11.6 -> 10.9 ms, 6 rows 13.5 -> 12.4 and 13.4 -> 12.3, 8 rows 19.5 -> 18.4 and level, 11 and 16
// rows level (compute); one thread 4 rows 20.8 -> 18.9, 6 rows 23.2 -> 21.7, 8 rows 34.6 -> 33.0.
// 1-3 rows take no half-panel tiles.
constexpr int64_t kNextBlockAhead = kBlockK * kPanel;

// Continue the chains of rows [0, R) x the panel's 32 columns over k in [k0, k1).
// acc holds the chains so far ([R][32]); it is ignored and the chains start at zero when first.
// Always inlined: out of line, GCC 12 kept the accumulators on the stack (2.7x slower at 128 rows).
// 8 weights of a panel row as float32: loaded, or widened from bf16 (exactly: the top half of a float32)
inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const uint16_t* w) {
  const __m256i halves = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(halves, 16));
}
// One element of a panel as float32 (a bf16 one widened exactly, as load8 does).
inline float widen(float w) { return w; }
inline float widen(uint16_t w) {
  const uint32_t bits = static_cast<uint32_t>(w) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// V vectors of 8 columns from `panel` on (a panel row is kPanel wide; acc rows too): V = 4 is the whole
// panel, V = 2 half of it, so that up to 6 rows fit the 16 registers beside their weights.
template <int R, int V = kVectors, typename W, int64_t Ahead = 0>
__attribute__((always_inline)) inline void micro(const float* x, int64_t ldx, const W* panel, int64_t k0, int64_t k1, float* acc,
                  bool first) {
  __m256 sum[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      sum[r][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * kPanel + v * 8);
  for (int64_t k = k0; k < k1; ++k) {
    if constexpr (Ahead > 0) {  // a stream (the KV cache, bf16 weights): ask for it `Ahead` weights early
      _mm_prefetch(reinterpret_cast<const char*>(panel + k * kPanel + Ahead), _MM_HINT_T0);
      if constexpr (sizeof(W) == 4)  // a float32 panel row spans two cache lines; a bf16 row fits in one
        _mm_prefetch(reinterpret_cast<const char*>(panel + k * kPanel + Ahead + 16), _MM_HINT_T0);
    }
    if constexpr (R * V + V + 1 > 16) {
      // 3 rows x a whole panel of bf16 weights: 12 sums, 4 widened weight vectors and a broadcast are
      // 17 registers, and GCC 12 kept a sum on the stack, each k waiting on its store. The rows'
      // broadcasts first, then one weight vector at a time: 16 registers, the same fma chains. Float32
      // panels (attention's tiles, prefill's widened blocks) take this order too; `perf annotate` showed
      // the spill in the bf16 tile only, and a 128-row prefill block's Linears timed the same (229 ms
      // on two threads either way). Measured on 2 cores of an AMD EPYC with
      // AVX2 (the embedded model, HEAD's build and this one alternating in one process): the 30
      // layers' Linears and the LM head at 3 rows 10.6 -> 8.5 ms on two threads (1 row 8.9), 20.1 ->
      // 13.6 on one; a whole 3-row verify forward at 2,000 tokens 16.9 -> 15.0 ms (1 row 14.0), 30.9 ->
      // 23.7 on one thread.
      __m256 xv[R];
      for (int r = 0; r < R; ++r) xv[r] = _mm256_broadcast_ss(x + r * ldx + k);
      for (int v = 0; v < V; ++v) {
        const __m256 w = load8(panel + k * kPanel + v * 8);
        for (int r = 0; r < R; ++r) sum[r][v] = _mm256_fmadd_ps(xv[r], w, sum[r][v]);
      }
    } else {
      __m256 w[V];
      for (int v = 0; v < V; ++v) w[v] = load8(panel + k * kPanel + v * 8);
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
        for (int v = 0; v < V; ++v) sum[r][v] = _mm256_fmadd_ps(xv, w[v], sum[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(acc + r * kPanel + v * 8, sum[r][v]);
}

// Cephes' e^x (as in avx_mathfun): clamps, log2(e), ln 2 in two parts for the reduction, and the
// polynomial's coefficients, highest first. exp8 and exp16 (attention on AMX) share them.
constexpr float kExpHigh = 88.0f, kExpLow = -87.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
constexpr float kExpPolynomial[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                    4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// e^x for 8 lanes: Cephes' polynomial after a reduction by ln 2, clamped below at -87 so that 2^n
// stays a normal float. Every lane is the same function of its own input.
// A NaN stays NaN (a diverged model shows as one, not as a dominant weight).
inline __m256 exp8(__m256 input) {
  const __m256 nan = _mm256_cmp_ps(input, input, _CMP_UNORD_Q);
  __m256 x = _mm256_max_ps(_mm256_min_ps(input, _mm256_set1_ps(kExpHigh)), _mm256_set1_ps(kExpLow));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), x);
  __m256 y = _mm256_set1_ps(kExpPolynomial[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpPolynomial[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_blendv_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(bits)), input, nan);
}

// Lanes j .. j + 7 of a row that lie before its length (all ones), the rest zero.
inline __m256 inside_mask(int64_t j, int64_t length) {
  const __m256i index = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(length)), index));
}

// The running maximum of a row's scaled scores s[j .. j + 8) that lie before its length, on 8 lanes
// (lane i sees positions = i mod 8; a maximum is exact in any order). Scores past the length (keys
// that may hold anything) are left out.
inline __m256 max_inside(__m256 most, __m256 scores, int64_t j, int64_t length) {
  if (j + 8 <= length) return _mm256_max_ps(most, scores);
  const __m256 below = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  return _mm256_max_ps(most, _mm256_blendv_ps(below, scores, inside_mask(j, length)));
}

// The softmax of one row of scaled scores s[0, length) in place, given `most`, their maximum on 8
// lanes (max_inside, taken as the scores were written): a pure function of the row's own `length`
// scores. Entries past the length are not written (attention never reads them); the sum's lanes are
// those of exp over whole vectors with zeros past the length (adding a zero changes no lane).
// A NaN score makes the sum, and so every output of the row, NaN whichever shift it gave.
// Each probability is its exp times 1 / sum (a multiply, not a divide: 5x the throughput).
// Measured (one 128-row prefill block at 2,136 keys, one thread): the softmax is a fifth of
// attention's time (with a separate masked pass for the maximum and a mask on every vector, 8.71
// against 8.54 ms for the whole attention).
inline void softmax_row(float* s, int64_t length, __m256 most) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, most);
  float top = lanes[0];
  for (int i = 1; i < 8; ++i) top = std::max(top, lanes[i]);
  const __m256 shift = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= length; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), shift));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (j < length) {  // the tail: exp of the scores inside, zeros outside (stored, but never read)
    const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), shift)), inside_mask(j, length));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  _mm256_store_ps(lanes, sum);
  const float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  const __m256 inverse = _mm256_set1_ps(1.0f / total);
  for (int64_t i = 0; i < length; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), inverse));
}

constexpr int64_t kAhead = 2048;  // attention prefetches the KV cache one key panel (8 KiB; 4 KiB, half a panel, of a bf16 cache) ahead: measured 5-13% faster at 4-11 rows, no change at 1
// query slots (a row's head) handled together: 8 micro-kernel tiles in a prefill block, 4 in a step or
// verify block (more work items for the threads). A chunk streams its kv head's keys and values once,
// so bigger chunks read the cache less often: 24 slots against 12, a 128-row block at 2,136 keys, two
// threads, 3 interleaved runs of 60: median 2-5% faster; no change on one thread. Which chunk a slot
// falls in never changes its output.
constexpr int64_t kSlots = 8 * kBlockRows;

}  // namespace


// Items [0, count) for torch's threads: body(claim) runs once per thread and calls claim() for its next
// item (-1: none left). Dynamic (compute-bound work: prefill blocks): items are handed out one at a
// time, so a core slowed by other work on the host takes fewer instead of the other waiting at the end
// for its fixed share. Static (memory-bound steps): each thread takes one contiguous range, a stream
// the hardware prefetcher follows across items. Which thread computes an item never changes its result.
template <typename Body>
inline void parallel_items(int64_t count, bool dynamic, const Body& body) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), count));
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {  // [t0, t1): one thread, or all run inline
    int64_t item = t0 * count / threads;
    const int64_t end = t1 * count / threads;
    body([&]() -> int64_t {
      if (dynamic) {
        const int64_t claimed = next.fetch_add(1, std::memory_order_relaxed);
        return claimed < count ? claimed : -1;
      }
      return item < end ? item++ : -1;
    });
  });
}

// weight [N, K] -> panels [ceil(N / 32), K, 32]: panel p, row k holds w[32p .. 32p + 31][k] (zero past N).
torch::Tensor pack(const torch::Tensor& weight) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.scalar_type() == torch::kFloat32,
              "pack: a 2-D float32 CPU weight");
  const auto w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kPanel - 1) / kPanel;
  auto out = torch::zeros({panels, k, kPanel}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t j = 0; j < kPanel && p * kPanel + j < n; ++j)
        for (int64_t i = 0; i < k; ++i) dst[(p * k + i) * kPanel + j] = src[(p * kPanel + j) * k + i];
  });
  return out;
}

// The same panels in bfloat16, for weights that are bf16 values (most checkpoints ship in bf16): half
// the bytes to stream, and a bf16 value widens to exactly the float32 it stood for, so every chain is
// the one float32 panels give. -> [ceil(N / 32), K, 32] bfloat16
torch::Tensor pack_bf16(const torch::Tensor& weight) {
  auto wide = pack(weight);
  auto narrow = wide.to(torch::kBFloat16);
  TORCH_CHECK(torch::equal(narrow.to(torch::kFloat32), wide), "pack_bf16: the weight has values that are not bf16 values");
  return narrow;
}

namespace {

// Where the CPU has AVX-512 (checked at run time: the rest of this file is AVX2 code, one build for
// both), verify blocks run tiles of up to 12 rows x one whole panel in 512-bit vectors (24
// accumulators and 2 weight vectors of the 32 registers), so a weight is loaded and widened once per
// 12 rows and a row's value broadcast once per 32 columns. Each lane is the chain micro's 256-bit
// lanes compute, in the same order: the same bits. (AVX2's 16 registers could hold no more than 3
// rows of a whole panel, or 6 of half a panel, which broadcasts every x value twice.)
#define WIDE_TILES __attribute__((target("avx512f")))
constexpr int64_t kWideRows = 12;
std::atomic<bool> wide_tiles_on{__builtin_cpu_supports("avx512f") != 0};

WIDE_TILES inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
WIDE_TILES inline __m512 load16(const uint16_t* w) {
  const __m512i halves = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(halves, 16));
}

template <int R, typename W, int64_t Ahead = 0>
WIDE_TILES __attribute__((always_inline)) inline void micro512(const float* x, int64_t ldx, const W* panel, int64_t k0,
                                                               int64_t k1, float* acc, bool first) {
  __m512 sum[R][2];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v) sum[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * kPanel + v * 16);
  for (int64_t k = k0; k < k1; ++k) {
    if constexpr (Ahead > 0) {  // as micro's
      _mm_prefetch(reinterpret_cast<const char*>(panel + k * kPanel + Ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(panel + k * kPanel + Ahead + 16), _MM_HINT_T0);
    }
    const __m512 w0 = load16(panel + k * kPanel), w1 = load16(panel + k * kPanel + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
      sum[r][0] = _mm512_fmadd_ps(xv, w0, sum[r][0]);
      sum[r][1] = _mm512_fmadd_ps(xv, w1, sum[r][1]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v) _mm512_storeu_ps(acc + r * kPanel + v * 16, sum[r][v]);
}

// The rows of tile t of `tiles` as even as can be, `left` rows not yet in a tile: the first tiles take
// the odd rows (the tiling never changes a row's chain).
inline int64_t even_tile(int64_t left, int64_t tiles, int64_t t) {
  return (left + tiles - t - 1) / (tiles - t);
}

// Rows [0, m) in tiles of at most kWideRows, as even as can be.
template <typename W, int64_t Ahead = 0>
WIDE_TILES void wide_tiles(const float* xp, int64_t m, int64_t k, const W* panel, int64_t k0, int64_t k1, float* acc) {
  const int64_t tiles = (m + kWideRows - 1) / kWideRows;
  const bool first = k0 == 0;
  for (int64_t t = 0, row = 0; t < tiles; ++t) {
    const int64_t size = even_tile(m - row, tiles, t);
    const float* xr = xp + row * k;
    float* ar = acc + row * kPanel;
    switch (size) {
      case 1: micro512<1, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 2: micro512<2, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 3: micro512<3, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 4: micro512<4, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 5: micro512<5, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 6: micro512<6, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 7: micro512<7, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 8: micro512<8, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 9: micro512<9, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 10: micro512<10, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      case 11: micro512<11, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
      default: micro512<12, W, Ahead>(xr, k, panel, k0, k1, ar, first); break;
    }
    row += size;
  }
}

// A tile of `size` rows (3 to 6: a verify block's tiles are as even as can be) x half a panel over
// the k block [k0, k1), prefetching Ahead weights on (micro's).
template <typename W, int64_t Ahead>
__attribute__((always_inline)) inline void half_tile(int64_t size, const float* xr, int64_t k, const W* panel,
                                                     int64_t k0, int64_t k1, float* ar) {
  switch (size) {
    case 3: micro<3, 2, W, Ahead>(xr, k, panel, k0, k1, ar, k0 == 0); break;
    case 4: micro<4, 2, W, Ahead>(xr, k, panel, k0, k1, ar, k0 == 0); break;
    case 5: micro<5, 2, W, Ahead>(xr, k, panel, k0, k1, ar, k0 == 0); break;
    default: micro<6, 2, W, Ahead>(xr, k, panel, k0, k1, ar, k0 == 0); break;
  }
}

// Rows [0, m) (4 or more) x a panel over the k block [k0, k1) in tiles of up to kHalfRows rows, as even
// as can be, over each half panel (a Linear's verify block; attention's slots of a bf16 cache): the
// first pass streams the block, asking for it First weights ahead; the later ones read it from L1,
// asking for the next block (kNextBlockAhead). acc as in micro.
template <typename W, int64_t First>
inline void half_panels(const float* xp, int64_t m, int64_t k, const W* panel, int64_t k0, int64_t k1, float* acc) {
  const int64_t tiles = (m + kHalfRows - 1) / kHalfRows;
  for (int64_t half = 0; half < kPanel; half += kPanel / 2) {
    for (int64_t t = 0, row = 0; t < tiles; ++t) {
      const int64_t size = even_tile(m - row, tiles, t);
      const float* xr = xp + row * k;
      float* ar = acc + row * kPanel + half;
      if (half == 0 && t == 0)
        half_tile<W, First>(size, xr, k, panel + half, k0, k1, ar);
      else
        half_tile<W, kNextBlockAhead>(size, xr, k, panel + half, k0, k1, ar);
      row += size;
    }
  }
}

// Rows [0, m) of x against one panel's k block [k0, k1); acc as in micro. A bf16 panel is widened in
// registers for one tile of rows (a decode step streams half the bytes); for more, its block is
// widened once into `wide` (64-byte aligned, k x 32 floats) and every tile reads it from L1.
template <typename W>
inline void rows_block(const float* xp, int64_t m, int64_t k, const W* panel, int64_t k0, int64_t k1, float* acc,
                       float* wide) {
  // 2 to 16 rows (a verify block): 512-bit tiles where the CPU has them. Not prefill blocks:
  // compute-bound there, 512-bit tiles ran no faster (128 rows, the 30 layers' Linears and the LM
  // head, 256-bit against 512-bit tiles: 356.0 against 357.9 ms on one thread, 182.0 against 179.9
  // on two)
  if (m >= 2 && m <= kHalfRowsMost && wide_tiles_on.load(std::memory_order_relaxed)) {
    wide_tiles(xp, m, k, panel, k0, k1, acc);
    return;
  }
  if constexpr (std::is_same_v<W, uint16_t>) {
    if (m > kBlockRows && m <= kHalfRowsMost) {
      // a verify block: half panels, each widened in registers once per tile of up to 6 rows
      half_panels<W, kHalfWeightAhead>(xp, m, k, panel, k0, k1, acc);
      return;
    }
    if (m > kBlockRows) {
      for (int64_t i = k0 * kPanel; i < k1 * kPanel; i += 8) _mm256_store_ps(wide + i, load8(panel + i));
      rows_block(xp, m, k, static_cast<const float*>(wide), k0, k1, acc, nullptr);
      return;
    }
  }
  for (int64_t row = 0; row < m; row += kBlockRows) {
    const float* xr = xp + row * k;
    float* ar = acc + row * kPanel;
    // bf16 panels stream from memory here (a step, up to 3 rows); float32 ones are a widened block in L1
    // (more rows) or a float32 checkpoint's weights (no prefetch: not measured)
    constexpr int64_t ahead = std::is_same_v<W, uint16_t> ? kWeightAhead : 0;
    switch (std::min(kBlockRows, m - row)) {
      case 3: micro<3, kVectors, W, ahead>(xr, k, panel, k0, k1, ar, k0 == 0); break;
      case 2: micro<2, kVectors, W, ahead>(xr, k, panel, k0, k1, ar, k0 == 0); break;
      default: micro<1, kVectors, W, ahead>(xr, k, panel, k0, k1, ar, k0 == 0); break;
    }
  }
}

// Where the CPU has AVX512-BF16 and the mode is on (set_bf16_dot; row_invariant.py turns it on there
// by default), a Linear over bf16 panels rounds its input rows to bf16 (round to nearest even, as
// torch's .to(bfloat16)) and multiplies pairs of k with vdpbf16ps: each output is then one fixed chain
// of dot-pair steps over k = 0, 2, 4, .. from zero (each step adds x[k] w[k] and x[k + 1] w[k + 1] in
// the instruction's own order and rounding, denormals flushed), for every row count, a 1-row step
// included: row-invariant as the fma chains are, but not their bits (the input is rounded). Twice the
// multiply-adds an instruction and no widening: blocks of rows (verify, prefill) gain; a step, which
// streams the weights, runs at memory speed either way.
#define DOT_TILES __attribute__((target("avx512f,avx512bw,avx512bf16")))
constexpr int64_t kDotRows = 12;
std::atomic<bool> bf16_dot_on{false};

// Two panel rows k, k + 1 (32 bf16 each) interleave into pairs: lo holds columns 8L + i, hi 8L + 4 + i
// in its dword 4L + i (L the 128-bit lane, i < 4). kDotColumns[h][j]: the column in dword j of lo
// (h = 0) or hi (h = 1), as _mm512_permutex2var_ps indexes two vectors of columns 0-15 and 16-31;
// kDotPlaces[h][c]: where column 16h + c sits in (lo, hi) (16 + j: hi's dword j). Constants: the
// tiles run them for every panel and k block.
alignas(64) constexpr int32_t kDotColumns[2][16] = {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
                                                    {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}};
alignas(64) constexpr int32_t kDotPlaces[2][16] = {{0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
                                                   {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};

// Continue rows [0, R) x one panel's 32 columns over k in [k0, k1) (both even); acc as in micro.
template <int R>
DOT_TILES __attribute__((always_inline)) inline void micro_dot(const uint16_t* x, int64_t ldx, const uint16_t* panel,
                                                               int64_t k0, int64_t k1, float* acc, bool first) {
  const __m512i lo_columns = _mm512_load_si512(kDotColumns[0]), hi_columns = _mm512_load_si512(kDotColumns[1]);
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    if (first) {
      lo[r] = hi[r] = _mm512_setzero_ps();
    } else {  // columns 0..31 of acc -> the interleaved order
      const __m512 a = _mm512_loadu_ps(acc + r * kPanel), b = _mm512_loadu_ps(acc + r * kPanel + 16);
      lo[r] = _mm512_permutex2var_ps(a, lo_columns, b);
      hi[r] = _mm512_permutex2var_ps(a, hi_columns, b);
    }
  }
  for (int64_t k = k0; k < k1; k += 2) {
    const __m512i a = _mm512_loadu_si512(panel + k * kPanel), b = _mm512_loadu_si512(panel + (k + 1) * kPanel);
    const __m512bh wl = (__m512bh)_mm512_unpacklo_epi16(a, b), wh = (__m512bh)_mm512_unpackhi_epi16(a, b);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + k, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      lo[r] = _mm512_dpbf16_ps(lo[r], xv, wl);
      hi[r] = _mm512_dpbf16_ps(hi[r], xv, wh);
    }
  }
  // back to columns 0..31
  const __m512i first_half = _mm512_load_si512(kDotPlaces[0]), second_half = _mm512_load_si512(kDotPlaces[1]);
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(acc + r * kPanel, _mm512_permutex2var_ps(lo[r], first_half, hi[r]));
    _mm512_storeu_ps(acc + r * kPanel + 16, _mm512_permutex2var_ps(lo[r], second_half, hi[r]));
  }
}

// Rows [0, m) in tiles of at most kDotRows, as even as can be (the tiling never changes a row's chain).
DOT_TILES void dot_tiles(const uint16_t* xb, int64_t m, int64_t k, const uint16_t* panel, int64_t k0, int64_t k1,
                         float* acc) {
  const int64_t tiles = (m + kDotRows - 1) / kDotRows;
  const bool first = k0 == 0;
  for (int64_t t = 0, row = 0; t < tiles; ++t) {
    const int64_t size = even_tile(m - row, tiles, t);
    const uint16_t* xr = xb + row * k;
    float* ar = acc + row * kPanel;
    switch (size) {
      case 1: micro_dot<1>(xr, k, panel, k0, k1, ar, first); break;
      case 2: micro_dot<2>(xr, k, panel, k0, k1, ar, first); break;
      case 3: micro_dot<3>(xr, k, panel, k0, k1, ar, first); break;
      case 4: micro_dot<4>(xr, k, panel, k0, k1, ar, first); break;
      case 5: micro_dot<5>(xr, k, panel, k0, k1, ar, first); break;
      case 6: micro_dot<6>(xr, k, panel, k0, k1, ar, first); break;
      case 7: micro_dot<7>(xr, k, panel, k0, k1, ar, first); break;
      case 8: micro_dot<8>(xr, k, panel, k0, k1, ar, first); break;
      case 9: micro_dot<9>(xr, k, panel, k0, k1, ar, first); break;
      case 10: micro_dot<10>(xr, k, panel, k0, k1, ar, first); break;
      case 11: micro_dot<11>(xr, k, panel, k0, k1, ar, first); break;
      default: micro_dot<12>(xr, k, panel, k0, k1, ar, first); break;
    }
    row += size;
  }
}


// Where the CPU has AMX-BF16 (Intel Xeon from Sapphire Rapids on) and the AMX mode is on (set_amx;
// row_invariant.py turns it on there by default), the bf16 dot mode multiplies with AMX tiles instead
// of vdpbf16ps: the input rows, rounded to bf16 as above and zero-padded to whole tiles (16 rows x 32
// k), against a panel's k pairs interleaved into two 16 x 16 column tiles, each output one fixed chain
// of tdpbf16ps steps over k blocks of 32, in order, from zero (each step adds the block's 16 pairs in
// the instruction's own order and rounding, denormals flushed). Every output row is computed from its
// own input row alone, in a tile of any height (a call of fewer than 16 rows configures its tiles that
// high: kTileConfigs), so a row gets the same bits in a 1-row step as in any block: row-invariant, but
// neither the fma chains' nor vdpbf16ps's bits. A 16 x 16 x 32 product a step: a prefill block
// multiplies ~4x faster than with vdpbf16ps, and a verify block's rows come almost free next to
// reading the weights.
#define AMX_TILES __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
constexpr int64_t kAmxRows = 16, kAmxK = 32;  // a tile: 16 rows x 64 bytes (32 bf16, or 16 floats)
std::atomic<bool> amx_on{false};

// Whether this process may use AMX-BF16 tiles: the CPU has them (and the AVX-512 parts the inputs and
// outputs use), and Linux granted the tile state, which it gives a process only when asked (arch_prctl
// ARCH_REQ_XCOMP_PERM; refused before Linux 5.16). -> "" where it may, else why not.
const std::string& amx_refusal() {
  static const std::string refusal = []() -> std::string {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))  // AMX-BF16, AMX-TILE
      return "the CPU has no AMX-BF16";
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl") ||
        !__builtin_cpu_supports("avx512bf16"))
      return "the CPU lacks AVX512-BW, -VL or -BF16";
    constexpr long kRequestPermission = 0x1023, kTileData = 18;
    if (syscall(SYS_arch_prctl, kRequestPermission, kTileData) != 0)
      return std::string("Linux refused the AMX tile state (arch_prctl: ") + std::strerror(errno) + ")";
    return "";
  }();
  return refusal;
}

// ldtilecfg's 64 bytes: palette 1; tiles 0-7 of 64 bytes a row, 16 rows but for the first row tile's
// (outputs tmm0, 1 and inputs tmm4) in a call of fewer than 16 rows: `rows` there, so that a 1-row
// step multiplies 1 row, not 16 (a tdpbf16ps computes each row from its own input row alone, so a
// row's bits are the same in a tile of any height: tested). Constants in memory: GCC 12 does not see
// _tile_loadconfig read its argument, and dropped the stores that filled one on the stack.
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};
constexpr TileConfig tile_config(uint8_t rows, uint8_t second = 16) {
  TileConfig config{1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
  config.rows[0] = config.rows[1] = config.rows[4] = rows;
  config.rows[2] = config.rows[3] = config.rows[5] = second;
  return config;
}
static_assert(sizeof(TileConfig) == 64);
alignas(64) constexpr TileConfig kTileConfigs[kAmxRows + 1] = {
    tile_config(16), tile_config(1),  tile_config(2),  tile_config(3),  tile_config(4),  tile_config(5),
    tile_config(6),  tile_config(7),  tile_config(8),  tile_config(9),  tile_config(10), tile_config(11),
    tile_config(12), tile_config(13), tile_config(14), tile_config(15), tile_config(16)};

// tmm0-3: outputs (row tile i, column half j in tmm 2i + j); tmm4, 5: input row tiles; tmm6, 7: the
// panel's column halves. Each thread configures its own tiles, for a call of m rows.
AMX_TILES void amx_configure(int64_t m) { _tile_loadconfig(&kTileConfigs[std::min(m, kAmxRows)]); }

// Attention's calls of 17 to 48 slots (a verify block or tree of 6-16 rows with 3 heads a kv head, as
// the embedded model's) end in a row tile that is mostly padding (18 slots: 16 + 2); with these the
// last row tile, in the second place of amx_panel's last pair (tmm2, 3, 5), multiplies only its own
// rows (`tail_rows`, below), not 16 (amx_attention says when). Measured before (eval.bench_verify_rows,
// two threads, 1,900 tokens): +0.9 ms at the 6th row and +1.3 ms at the 11th, +0.5 a row between.
alignas(64) constexpr TileConfig kTailConfigs[kAmxRows + 1] = {
    tile_config(16, 16), tile_config(16, 1),  tile_config(16, 2),  tile_config(16, 3),  tile_config(16, 4),
    tile_config(16, 5),  tile_config(16, 6),  tile_config(16, 7),  tile_config(16, 8),  tile_config(16, 9),
    tile_config(16, 10), tile_config(16, 11), tile_config(16, 12), tile_config(16, 13), tile_config(16, 14),
    tile_config(16, 15), tile_config(16, 16)};

// The rows of the last row tile of m > 16 rows (1 .. 16), or 0 for m <= 16 (one tile: amx_configure's).
inline int64_t tail_rows(int64_t m) { return m <= kAmxRows ? 0 : m - (m - 1) / kAmxRows * kAmxRows; }

// amx_configure for a call whose last row tile is `tail_rows(m)` high (amx_panel's `tail`).
AMX_TILES void amx_configure_tail(int64_t m) {
  const int64_t tail = tail_rows(m);
  if (tail == 0)
    amx_configure(m);
  else
    _tile_loadconfig(&kTailConfigs[tail]);
}

// k pairs [kk0, kk1) of a bf16 panel [k, 32] (within one block of 32 k) -> the block's two AMX tiles
// at out: 16 k pairs x 16 dwords each, a dword the pair (w[k][c], w[k + 1][c]) of one column c (k past
// the weight's is zero). The first tile holds columns 8L + i, the second 8L + 4 + i, in dword 4L + i
// (L < 4, i < 4): unpacklo/hi's order, which the outputs undo through kDotPlaces.
AMX_TILES inline void amx_interleave(const uint16_t* panel, int64_t k, int64_t kk0, int64_t kk1, uint16_t* out) {
  for (int64_t kk = kk0; kk < kk1; kk += 2) {
    const __m512i a = kk < k ? _mm512_loadu_si512(panel + kk * kPanel) : _mm512_setzero_si512();
    const __m512i b = kk + 1 < k ? _mm512_loadu_si512(panel + (kk + 1) * kPanel) : _mm512_setzero_si512();
    uint16_t* row = out + (kk % kAmxK) / 2 * kPanel;
    _mm512_store_si512(row, _mm512_unpacklo_epi16(a, b));
    _mm512_store_si512(row + kAmxRows * kPanel, _mm512_unpackhi_epi16(a, b));
  }
}

constexpr int64_t kAmxTile = kAmxRows * kPanel;  // a B tile's bf16 elements (1 KiB)

// Rows [0, m16) of xa (bf16, rows lda elements apart, m16 a multiple of 16) over k blocks [0, blocks)
// against one bf16 panel (a weight's, or a layer's keys or values in a bf16 KV cache) -> acc [m16][32]
// (columns in the tiles' order). Up to 32 rows (a step, a verify block) interleave each block just before its products,
// into a ring of two blocks that stays in L1; more rows (prefill) interleave the whole panel into b
// first and run two row tiles at a time over it. An output row is the same chain over the blocks
// either way.
// A panel already in that order (pack_amx's, `interleaved`: its blocks' two B tiles one after
// another, k a multiple of 32) is read as it lies, with nothing re-laid.
// With `tail` (amx_configure_tail's tiles, m16 > 16) the last row tile runs in the second place of
// the last pair, the tiles before that pair one at a time: the same chains, row by row.
AMX_TILES void amx_panel(const uint16_t* xa, int64_t lda, int64_t m16, int64_t blocks, const uint16_t* panel, int64_t k,
                         uint16_t* b, float* acc, bool interleaved = false, bool tail = false) {
  const int64_t ld = lda * 2;  // bytes per input row
  const bool streamed = m16 <= 2 * kAmxRows;
  if (!streamed && !interleaved)
    for (int64_t block = 0; block < blocks; ++block)
      amx_interleave(panel, k, block * kAmxK, (block + 1) * kAmxK, b + 2 * block * kAmxTile);
  asm volatile("" ::: "memory");  // as in tiles_of
  const auto tiles_of = [&](int64_t block) -> const uint16_t* {  // the block's B tiles, interleaved now where streamed
    if (interleaved) return panel + 2 * block * kAmxTile;  // software prefetch 2-4 blocks ahead: slower
    uint16_t* at = b + 2 * (streamed ? block % 2 : block) * kAmxTile;
    if (streamed) amx_interleave(panel, k, block * kAmxK, (block + 1) * kAmxK, at);
    // GCC's _tile_loadd is an asm with no memory operand: keep the stores above before the loads
    asm volatile("" ::: "memory");
    return at;
  };
  const auto pair = [&](int64_t row) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t block = 0; block < blocks; ++block) {
      const uint16_t* bb = tiles_of(block);
      _tile_loadd(4, xa + row * lda + block * kAmxK, ld);
      _tile_loadd(5, xa + (row + kAmxRows) * lda + block * kAmxK, ld);
      _tile_loadd(6, bb, 64);
      _tile_loadd(7, bb + kAmxTile, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, acc + row * kPanel, kPanel * 4);
    _tile_stored(1, acc + row * kPanel + 16, kPanel * 4);
    _tile_stored(2, acc + (row + kAmxRows) * kPanel, kPanel * 4);
    _tile_stored(3, acc + (row + kAmxRows) * kPanel + 16, kPanel * 4);
  };
  const auto single = [&](int64_t row) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t block = 0; block < blocks; ++block) {
      const uint16_t* bb = tiles_of(block);
      _tile_loadd(4, xa + row * lda + block * kAmxK, ld);
      _tile_loadd(6, bb, 64);
      _tile_loadd(7, bb + kAmxTile, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
    }
    _tile_stored(0, acc + row * kPanel, kPanel * 4);
    _tile_stored(1, acc + row * kPanel + 16, kPanel * 4);
  };
  int64_t row = 0;
  if (tail && m16 > kAmxRows) {
    for (; row + 2 * kAmxRows < m16; row += kAmxRows) single(row);  // (m16 > 32: not streamed)
    pair(row);
  } else {
    for (; row + 2 * kAmxRows <= m16; row += 2 * kAmxRows) pair(row);
    if (row < m16) single(row);
  }
  asm volatile("" ::: "memory");  // nor has _tile_stored: keep later reads of acc after the stores
}

AMX_TILES void amx_release() { _tile_release(); }

// B-tile room for `tiles` tiles in a thread's buffer, 64-byte aligned (as _mm512_store_si512 needs).
inline uint16_t* aligned_tiles(std::vector<uint16_t>& buffer, int64_t tiles) {
  buffer.resize(std::max<size_t>(buffer.size(), tiles * kAmxTile + 32));
  return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
}

// amx_panel's B tiles for m16 rows over `blocks` k blocks: a ring of 2 blocks for up to 32 rows.
inline uint16_t* amx_b_buffer(std::vector<uint16_t>& buffer, int64_t m16, int64_t blocks) {
  return aligned_tiles(buffer, (m16 <= 2 * kAmxRows ? 2 : blocks) * 2);
}

// (dot_attention calls this on CPUs without AMX, as it does amx_softmax: neither may hold a tile
// instruction.)
// x rounded to bf16 (to nearest even; vcvtneps2bf16, whose flushed denormals tdpbf16ps would flush
// anyway) into xa [m16, blocks * 32], zero past x's k columns and, where the tiles may read them (16
// rows and more: amx_configure; amx_configure_tail's read none), past its m rows.
AMX_TILES void amx_inputs(const float* x, int64_t m, int64_t k, int64_t m16, int64_t blocks, uint16_t* xa) {
  const int64_t width = blocks * kAmxK, read = m < kAmxRows ? m : m16;
  std::memset(xa + m * width, 0, (read - m) * width * sizeof(uint16_t));
  for (int64_t row = 0; row < m; ++row) {
    std::memset(xa + row * width + k, 0, (width - k) * sizeof(uint16_t));
    int64_t i = 0;
    for (; i + 16 <= k; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xa + row * width + i),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + row * k + i)));
    if (i < k) {
      const __mmask16 tail = static_cast<__mmask16>((1u << (k - i)) - 1);
      _mm256_mask_storeu_epi16(xa + row * width + i, tail, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail, x + row * k + i)));
    }
  }
}

// Row `row` of amx_panel's acc (the tiles' column order) -> columns 0-15 and 16-31 in order.
AMX_TILES inline void amx_row(const float* acc, __m512& first, __m512& second) {
  const __m512 a = _mm512_loadu_ps(acc), b = _mm512_loadu_ps(acc + 16);
  first = _mm512_permutex2var_ps(a, _mm512_load_si512(kDotPlaces[0]), b);
  second = _mm512_permutex2var_ps(a, _mm512_load_si512(kDotPlaces[1]), b);
}

// The first `cols` of a panel's 32 columns as masks of its two halves (columns 0-15, 16-31).
inline void column_masks(int64_t cols, __mmask16& lo, __mmask16& hi) {
  lo = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
  hi = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
}

// A panel's outputs from acc (columns in the tiles' order: kDotPlaces) to y's rows (n apart), its
// first `cols` columns, plus the bias where there is one.
AMX_TILES void amx_outputs(const float* acc, int64_t m, int64_t cols, const float* bias, float* y, int64_t n) {
  __mmask16 lo, hi;
  column_masks(cols, lo, hi);
  const __m512 bias_lo = bias ? _mm512_maskz_loadu_ps(lo, bias) : _mm512_setzero_ps();
  const __m512 bias_hi = bias ? _mm512_maskz_loadu_ps(hi, bias + 16) : _mm512_setzero_ps();
  for (int64_t row = 0; row < m; ++row) {
    __m512 first, second;
    amx_row(acc + row * kPanel, first, second);
    if (bias) {
      first = _mm512_add_ps(first, bias_lo);
      second = _mm512_add_ps(second, bias_hi);
    }
    _mm512_mask_storeu_ps(y + row * n, lo, first);
    _mm512_mask_storeu_ps(y + row * n + 16, hi, second);
  }
}

// y = x @ panels (+ bias) on AMX tiles.
void amx_linear(const float* xp, int64_t m, int64_t k, const uint16_t* hp, int64_t stride, int64_t n, const float* bp,
                float* yp, bool interleaved) {
  const int64_t blocks = (k + kAmxK - 1) / kAmxK, m16 = (m + kAmxRows - 1) / kAmxRows * kAmxRows;
  thread_local std::vector<uint16_t> inputs;  // kept by the calling thread between calls
  inputs.resize(std::max<size_t>(inputs.size(), m16 * blocks * kAmxK));
  amx_inputs(xp, m, k, m16, blocks, inputs.data());
  const uint16_t* xa = inputs.data();
  const int64_t count = (n + kPanel - 1) / kPanel;
  parallel_items(count, m > kHalfRowsMost, [&](const auto& claim) {
    amx_configure(m);
    thread_local std::vector<float> acc;
    thread_local std::vector<uint16_t> buffer;  // B tiles: a ring of 2 blocks, or a whole panel's
    acc.resize(std::max<size_t>(acc.size(), m16 * kPanel));
    uint16_t* b = interleaved ? nullptr : amx_b_buffer(buffer, m16, blocks);  // tiles read as they lie
    for (int64_t p; (p = claim()) >= 0;) {
      amx_panel(xa, blocks * kAmxK, m16, blocks, hp + p * stride, k, b, acc.data(), interleaved);
      amx_outputs(acc.data(), m, std::min(kPanel, n - p * kPanel), bp ? bp + p * kPanel : nullptr, yp + p * kPanel, n);
    }
    amx_release();
  });
}

}  // namespace

// bf16 panels (pack_bf16's) with their k blocks re-laid as amx_panel's B tiles once, here, instead of
// at every product: [ceil(N / 32), K / 32, 1024] bfloat16, block j of panel p its two tiles (K a
// multiple of 32). The same products, so the same bits, without the re-laying: a decode step that
// streams them does less work per weight. Where AMX tiles are on only (linear refuses them elsewhere).
torch::Tensor pack_amx(const torch::Tensor& weight) {
  TORCH_CHECK(bf16_dot_on.load(std::memory_order_relaxed) && amx_on.load(std::memory_order_relaxed),
              "pack_amx: AMX tiles are off (row_invariant.numerics)");  // linear()'s condition for these panels
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) % kAmxK == 0, "pack_amx: in_features must be a multiple of 32");
  const auto panels = pack_bf16(weight);
  const int64_t count = panels.size(0), k = panels.size(1), blocks = k / kAmxK;
  auto out = torch::empty({count, blocks, 2 * kAmxTile}, panels.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(dst) % 64 == 0, "pack_amx: the allocator gave a buffer not 64-byte aligned");
  for (int64_t p = 0; p < count; ++p)
    for (int64_t block = 0; block < blocks; ++block)
      amx_interleave(src + p * k * kPanel, k, block * kAmxK, (block + 1) * kAmxK, dst + (p * blocks + block) * 2 * kAmxTile);
  return out;
}

// x [M, K] float32; panels [>= ceil(n / 32), K, 32] as pack() or pack_bf16() makes them, rows of a panel
// contiguous, or [>= ceil(n / 32), K / 32, 1024] as pack_amx() makes them (AMX numerics only); n the
// weight's rows; bias [n] or None.
torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& panels, int64_t n,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(input.device().is_cpu() && panels.device().is_cpu() && (!bias.has_value() || bias->device().is_cpu()),
              "linear: CPU tensors only");
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == torch::kFloat32, "linear: a 2-D float32 input");
  const bool narrow = panels.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(narrow || panels.scalar_type() == torch::kFloat32, "linear: float32 or bfloat16 panels");
  if (panels.dim() == 3 && panels.size(2) == 2 * kAmxTile) {  // pack_amx's layout
    TORCH_CHECK(narrow && panels.size(1) * kAmxK == input.size(1) && panels.stride(2) == 1 &&
                    panels.stride(1) == 2 * kAmxTile && panels.size(0) * kPanel >= n,
                "linear: AMX-ordered panels do not fit the input");
    TORCH_CHECK(bf16_dot_on.load(std::memory_order_relaxed) && amx_on.load(std::memory_order_relaxed),
                "linear: these panels are in AMX tile order (pack_amx), and AMX tiles are off now "
                "(row_invariant.numerics): pack the weight again under the numerics in use");
    TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() &&
                                      bias->numel() == n),
                "linear: the bias must be a contiguous float32 vector of the output size");
    const auto x = input.contiguous();
    auto y = torch::empty({x.size(0), n}, x.options());
    amx_linear(x.data_ptr<float>(), x.size(0), x.size(1), reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>()),
               panels.stride(0), n, bias.has_value() ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>(), true);
    return y;
  }
  TORCH_CHECK(panels.dim() == 3 && panels.size(1) == input.size(1) && panels.size(2) == kPanel &&
                  panels.stride(2) == 1 && panels.stride(1) == kPanel && panels.size(0) * kPanel >= n,
              "linear: panels do not fit the input");
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() &&
                                    bias->numel() == n),
              "linear: the bias must be a contiguous float32 vector of the output size");
  const auto x = input.contiguous();
  // panels may sit apart (a slice of a longer cache): panel p starts p * stride elements in
  const int64_t m = x.size(0), k = x.size(1), count = (n + kPanel - 1) / kPanel, stride = panels.stride(0);
  auto y = torch::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = narrow ? nullptr : panels.data_ptr<float>();
  const uint16_t* hp = narrow ? reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>()) : nullptr;
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // bf16 panels in the dot mode: pairs of k (kBlockK is even), the input rounded to bf16 once
  const bool dot = narrow && k % 2 == 0 && bf16_dot_on.load(std::memory_order_relaxed);
  if (dot && amx_on.load(std::memory_order_relaxed)) {
    amx_linear(xp, m, k, hp, stride, n, bp, yp, false);
    return y;
  }
  const auto xb = dot ? x.to(torch::kBFloat16).contiguous() : torch::Tensor();
  const uint16_t* xbp = dot ? reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>()) : nullptr;
  // bf16 panels: widened as rows_block says
  parallel_items(count, m > kHalfRowsMost, [&](const auto& claim) {
    std::vector<float> acc(((m + kBlockRows - 1) / kBlockRows) * kBlockRows * kPanel);
    // 64-byte aligned, as torch's tensors are: unaligned, half the 32-byte loads split a cache line
    std::vector<float> wide_buffer(narrow && !dot && m > kHalfRowsMost ? k * kPanel + 16 : 0);
    float* wide = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(wide_buffer.data()) + 63) & ~uintptr_t{63});
    for (int64_t p; (p = claim()) >= 0;) {
      for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
        const int64_t k1 = std::min(k, k0 + kBlockK);
        if (dot)
          dot_tiles(xbp, m, k, hp + p * stride, k0, k1, acc.data());
        else if (narrow)
          rows_block(xp, m, k, hp + p * stride, k0, k1, acc.data(), wide);
        else
          rows_block(xp, m, k, wp + p * stride, k0, k1, acc.data(), nullptr);
      }
      const int64_t cols = std::min(kPanel, n - p * kPanel);
      for (int64_t row = 0; row < m; ++row) {
        const float* chain = acc.data() + row * kPanel;
        float* out = yp + row * n + p * kPanel;
        for (int64_t j = 0; j < cols; ++j) out[j] = bp ? chain[j] + bp[p * kPanel + j] : chain[j];
      }
    }
  });
  return y;
}

namespace {

// Whether `count` slots take half-panel tiles against a bf16 cache's panel (score_tiles, value_tiles):
// a verify block's 2 to 8 rows (6 to 24 slots at 3 heads a kv head) and chunks of more, not a step's
// one tile. A tile of up to kHalfRows slots x half a panel widens each key or value once a tile,
// where tiles of kBlockRows x a whole panel widen it once per 3 slots: the same chain of fmas for
// every slot either way (a slot's chain never depends on its tile), so the same bits. Measured on 2
// cores of an AMD EPYC with AVX2 (30 layers' attention at 2,000 keys, 9 heads over 3 kv heads, a bf16
// cache, this build and the one before alternating in one process, 12 rounds, mean of the fastest 3,
// ms; every output equal): rows 1 / 2 / 3 / 4 / 6 / 8 / 11 / 16 / 128: 2.21 / 3.06 / 4.38 / 5.68 /
// 8.03 / 10.59 / 15.77 / 20.15 / 140.95 -> 2.16 / 2.93 / 4.15 / 5.07 / 7.09 / 9.33 / 14.67 / 18.54 /
// 128.77 (a 1-row step's 3 slots take the old tile: the same code). Chunks of more than kFewRows rows
// still widen each key panel once for all their score tiles (with_panel): their value tiles gain.
template <typename W>
inline bool half_panel_slots(int64_t count) {
  return std::is_same_v<W, uint16_t> && count > kBlockRows;
}

// The output chains of a tile of up to kBlockRows slots (kWideRows with 512-bit tiles, kHalfRows over a
// bf16 cache's half panels: value_tiles) over the keys
// [k0, k1) of one value panel: the keys every slot of the tile sees run together, then each slot alone
// runs the rest of its own (keys past lengths[i] are never read). x: the tile's probability rows, ld
// apart; acc: their chains so far ([tile][32]), parked between key blocks, started at k0 == 0.
template <typename W>
inline void value_tile(const float* x, int64_t ld, const W* panel, int64_t k0, int64_t k1, const int64_t* lengths,
                       int64_t tile, float* acc, bool wide) {
  int64_t common = lengths[0];
  for (int64_t i = 1; i < tile; ++i) common = std::min(common, lengths[i]);
  const int64_t together = std::min(k1, common);
  if (k0 < together) {
    if (wide) {
      wide_tiles<W, kAhead>(x, tile, ld, panel, k0, together, acc);
    } else if (tile > kBlockRows) {  // a bf16 cache's tile of 4 to 6 slots (value_tiles)
      half_panels<W, kAhead>(x, tile, ld, panel, k0, together, acc);
    } else {
      switch (tile) {
        case 3: micro<3, kVectors, W, kAhead>(x, ld, panel, k0, together, acc, k0 == 0); break;
        case 2: micro<2, kVectors, W, kAhead>(x, ld, panel, k0, together, acc, k0 == 0); break;
        default: micro<1, kVectors, W, kAhead>(x, ld, panel, k0, together, acc, k0 == 0); break;
      }
    }
  }
  for (int64_t i = 0; i < tile; ++i) {
    const int64_t from = std::max(k0, common), to = std::min(k1, lengths[i]);
    if (from >= to) continue;
    if (wide)
      wide_tiles<W, kAhead>(x + i * ld, 1, ld, panel, from, to, acc + i * kPanel);
    else
      micro<1, kVectors, W, kAhead>(x + i * ld, ld, panel, from, to, acc + i * kPanel, from == 0);
  }
}

// The output chains of slots [0, count) over the keys [k0, k1) of one value panel (value_tile's
// arguments; lengths[count]) in tiles: of up to kWideRows slots where the CPU has 512-bit vectors
// (wide_tiles_on), else kHalfRows over half panels for more than kBlockRows slots of a bf16 cache
// (half_panel_slots), else kBlockRows. The same chain of fmas over the keys, in order, either way.
template <typename W>
inline void value_tiles(const float* x, int64_t ld, const W* panel, int64_t k0, int64_t k1, const int64_t* lengths,
                        int64_t count, float* acc) {
  const bool wide = wide_tiles_on.load(std::memory_order_relaxed);
  if (!wide && half_panel_slots<W>(count)) {  // tiles of up to kHalfRows slots, as even as can be
    const int64_t tiles = (count + kHalfRows - 1) / kHalfRows;
    for (int64_t t = 0, s = 0; t < tiles; ++t) {
      const int64_t size = even_tile(count - s, tiles, t);
      value_tile(x + s * ld, ld, panel, k0, k1, lengths + s, size, acc + s * kPanel, false);
      s += size;
    }
    return;
  }
  const int64_t step = wide ? kWideRows : kBlockRows;
  for (int64_t s = 0; s < count; s += step)
    value_tile(x + s * ld, ld, panel, k0, k1, lengths + s, std::min(step, count - s), acc + s * kPanel, wide);
}

// The score chains of slots [0, count) (queries d apart) against one key panel -> acc [count][32]: the
// fma chain over d, in tiles of up to kWideRows slots where the CPU has 512-bit vectors, else kHalfRows over
// half panels (half_panel_slots: more than kBlockRows slots of a bf16 cache), else kBlockRows.
template <typename W>
inline void score_tiles(const float* q, int64_t count, int64_t d, const W* panel, float* acc) {
  if (wide_tiles_on.load(std::memory_order_relaxed)) {
    wide_tiles<W, kAhead>(q, count, d, panel, 0, d, acc);
    return;
  }
  if (half_panel_slots<W>(count)) {
    half_panels<W, kAhead>(q, count, d, panel, 0, d, acc);
    return;
  }
  for (int64_t s = 0; s < count; s += kBlockRows) {
    switch (std::min(kBlockRows, count - s)) {
      case 3: micro<3, kVectors, W, kAhead>(q + s * d, d, panel, 0, d, acc + s * kPanel, true); break;
      case 2: micro<2, kVectors, W, kAhead>(q + s * d, d, panel, 0, d, acc + s * kPanel, true); break;
      default: micro<1, kVectors, W, kAhead>(q + s * d, d, panel, 0, d, acc + s * kPanel, true); break;
    }
  }
}

// Runs body(panel) over a panel of n elements (float or bf16). Where several tiles of slots will read a
// bf16 panel (tiles > 1), it is widened once into `wide` (exactly, as load8 widens) and body reads
// that: the tiles' chains are the same, each element widened once instead of once a tile.
template <typename W, typename Body>
inline void with_panel(const W* panel, int64_t n, int64_t tiles, std::vector<float>& wide, const Body& body) {
  if constexpr (std::is_same_v<W, uint16_t>) {
    if (tiles > 1) {
      if (wide.size() < static_cast<size_t>(n)) wide.resize(n);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(wide.data() + i, load8(panel + i));
      for (; i < n; ++i) wide[i] = widen(panel[i]);
      body(static_cast<const float*>(wide.data()));
      return;
    }
  }
  body(panel);
}

// Tiles of slots that score_tiles and value_tiles run for `count` slots.
inline int64_t slot_tiles(int64_t count) {
  const int64_t step = wide_tiles_on.load(std::memory_order_relaxed) ? kWideRows : kBlockRows;
  return (count + step - 1) / step;
}

constexpr int64_t kKeyBlock = 8;  // key panels per scores item of a few-row call: 256 keys, 64 KiB at d = 64
// The most rows that take attention_few. Measured (30 layers' attention at 2,000 keys, SmolLM2-135M's
// 9 heads over 3 kv heads, two threads, interleaved with the chunked pass, best of 20-30): 1 row
// 8.1 -> 6.9 ms, 2 rows 8.1 -> 6.6, 4 rows 12.3 -> 10.1, 6 rows 12.3 -> 10.7; 8 to 12 rows level;
// 16 rows level to 14% slower (each value item then streams every slot's probabilities, 390 KB).
// One thread: level at 1, 4 and 11 rows.
constexpr int64_t kFewRows = 8;

// The cache of one layer as attention reads it, and the rows asking.
struct AttentionCall {
  const float* q;  // [rows, heads, d]
  const float* keys;  // float32 caches; bf16 ones (a bf16 checkpoint's, any numerics): keys16, values16
  int64_t key_head, key_panel;  // strides: keys [kv_heads, panels, d, 32]
  const float* values;
  int64_t value_head, value_panel;  // strides: values [kv_heads, ceil(d / 32), positions, 32]
  const int64_t* len;  // [rows]
  int64_t rows, heads, kv_heads, d, longest;
  float scale;
  float* out;  // [rows, heads * d]
  // A token tree (else nullptr): node j's keys and values lie at position start + j, and row i, one of
  // the last `rows` of its `nodes` nodes, attends to positions [0, start) and then to its node's
  // root-to-node path, whose t-th node is paths[i][t] (>= t: a parent lies before its children).
  const std::vector<std::vector<int64_t>>* paths = nullptr;
  int64_t start = 0, nodes = 0;
  const uint16_t* keys16 = nullptr;
  const uint16_t* values16 = nullptr;
};

// Where key t of a tree node's row lies in the cache: its own place, or (past `start`) the place of
// the t-th node of its path.
inline int64_t tree_position(const AttentionCall& a, int64_t row, int64_t t) {
  return t < a.start ? t : a.start + (*a.paths)[row][t - a.start];
}

// Attention of a decode step or a small verify block (up to kFewRows rows) in three passes, each over
// every kv head at once: scores (items: a kv head's block of kKeyBlock key panels, all its slots),
// the softmax of each slot's row, outputs (items: a kv head's value panel, all its slots). So every
// key and value is read from memory once, whatever the row count, and the threads share a 1-row
// step evenly (chunks of slots per kv head read a head's keys and values once per chunk, and gave
// a 1-row step one item per kv head: 3 items for 2 threads). Each score, maximum, softmax and output
// chain is the one the chunked pass computes: the same bits.
// A token tree's rows read the cache below `start` as above; their path's keys (past `start`) are
// scored one by one in the softmax pass and their values added to the chains after the cache's, each
// the same fma chain that a chain of those nodes written at start, start + 1, ... would get: a
// node's output has the bits of decoding its path one token at a time.
// W: the cache's element, float or bf16 (uint16_t: the float32 numerics' bf16 cache, each key and value
// widened exactly as it is read, so the chains are those of a float32 cache holding the rounded values).
template <typename W>
void attention_few(const AttentionCall& a) {
  const W* keys = nullptr;
  const W* values = nullptr;
  if constexpr (std::is_same_v<W, float>) {
    keys = a.keys, values = a.values;
  } else {
    keys = a.keys16, values = a.values16;
  }
  const int64_t group = a.heads / a.kv_heads, slots = a.rows * group, tiles = (slots + kBlockRows - 1) / kBlockRows;
  const auto cached = [&](int64_t row) { return a.paths ? std::min(a.len[row], a.start) : a.len[row]; };
  int64_t cache_longest = 0;  // keys any row reads in place
  for (int64_t row = 0; row < a.rows; ++row) cache_longest = std::max(cache_longest, cached(row));
  const int64_t padded = (a.longest + kPanel - 1) / kPanel * kPanel;
  const int64_t panels = (cache_longest + kPanel - 1) / kPanel;
  const int64_t blocks = (panels + kKeyBlock - 1) / kKeyBlock, value_panels = (a.d + kPanel - 1) / kPanel;
  // shared by the passes; kept by the calling thread between calls (no page faults on each step)
  thread_local std::vector<float> query, probs, most;
  query.resize(std::max<size_t>(query.size(), a.kv_heads * slots * a.d));
  probs.resize(std::max<size_t>(probs.size(), a.kv_heads * slots * padded));
  most.resize(std::max<size_t>(most.size(), a.kv_heads * blocks * slots * 8));
  for (int64_t kv = 0; kv < a.kv_heads; ++kv)
    for (int64_t s = 0; s < slots; ++s) {
      const float* from = a.q + ((s / group) * a.heads + kv * group + s % group) * a.d;
      std::copy(from, from + a.d, query.data() + (kv * slots + s) * a.d);
    }
  const __m256 scale8 = _mm256_set1_ps(a.scale);
  float* probs_p = probs.data();
  float* most_p = most.data();
  const float* query_p = query.data();
  // scores, scaled, and each block's maximum per slot (max_inside)
  parallel_items(a.kv_heads * blocks, false, [&](const auto& claim) {
    std::vector<float> acc(tiles * kBlockRows * kPanel);
    for (int64_t item; (item = claim()) >= 0;) {
      const int64_t kv = item / blocks, b = item % blocks;
      const float* q = query_p + kv * slots * a.d;
      float* rows_out = probs_p + kv * slots * padded;
      float* block_most = most_p + (kv * blocks + b) * slots * 8;
      for (int64_t s = 0; s < slots; ++s) _mm256_storeu_ps(block_most + s * 8, _mm256_set1_ps(-std::numeric_limits<float>::infinity()));
      for (int64_t p = b * kKeyBlock; p < std::min(panels, (b + 1) * kKeyBlock); ++p) {
        score_tiles(q, slots, a.d, keys + kv * a.key_head + p * a.key_panel, acc.data());
        for (int64_t s = 0; s < slots; ++s) {
          const int64_t length = cached(s / group);
          __m256 m = _mm256_loadu_ps(block_most + s * 8);
          for (int64_t v = 0; v < kVectors; ++v) {
            const int64_t j = p * kPanel + v * 8;
            const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(acc.data() + s * kPanel + v * 8), scale8);
            _mm256_storeu_ps(rows_out + s * padded + j, scaled);
            if (j < length) m = max_inside(m, scaled, j, length);
          }
          _mm256_storeu_ps(block_most + s * 8, m);
        }
      }
    }
  });
  // each slot's softmax, given the maximum over its blocks (a maximum is exact in any order)
  parallel_items(a.kv_heads * slots, false, [&](const auto& claim) {
    for (int64_t item; (item = claim()) >= 0;) {
      const int64_t kv = item / slots, s = item % slots, row = s / group;
      __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      for (int64_t b = 0; b < blocks; ++b) m = _mm256_max_ps(m, _mm256_loadu_ps(most_p + ((kv * blocks + b) * slots + s) * 8));
      float* scores = probs_p + (kv * slots + s) * padded;
      const float* q = query_p + (kv * slots + s) * a.d;
      for (int64_t t = cached(row); t < a.len[row]; ++t) {  // a tree's path: the chain of fmas micro runs
        const int64_t position = tree_position(a, row, t);
        const W* key = keys + kv * a.key_head + (position / kPanel) * a.key_panel + position % kPanel;
        float score = 0.0f;
        for (int64_t i = 0; i < a.d; ++i) score = std::fma(q[i], widen(key[i * kPanel]), score);
        scores[t] = score * a.scale;
        m = _mm256_max_ps(m, _mm256_set1_ps(scores[t]));
      }
      softmax_row(scores, a.len[row], m);
    }
  });
  // outputs: a kv head's value panel against all its slots, chains as in the chunked pass
  parallel_items(a.kv_heads * value_panels, false, [&](const auto& claim) {
    std::vector<float> acc(tiles * kBlockRows * kPanel);
    std::vector<int64_t> lengths(slots);
    for (int64_t s = 0; s < slots; ++s) lengths[s] = cached(s / group);
    for (int64_t item; (item = claim()) >= 0;) {
      const int64_t kv = item / value_panels, c = item % value_panels;
      const W* panel = values + kv * a.value_head + c * a.value_panel;
      const float* rows_in = probs_p + kv * slots * padded;
      for (int64_t k0 = 0; k0 < padded; k0 += kBlockK)
        value_tiles(rows_in, padded, panel, k0, std::min(padded, k0 + kBlockK), lengths.data(), slots, acc.data());
      if (a.paths) {  // a tree's path: micro's step for each key, in order after the cache's
        for (int64_t s = 0; s < slots; ++s) {
          const int64_t row = s / group;
          const float* p = rows_in + s * padded;
          float* acc_s = acc.data() + s * kPanel;
          __m256 sum[kVectors];
          for (int64_t v = 0; v < kVectors; ++v) sum[v] = cached(row) ? _mm256_loadu_ps(acc_s + v * 8) : _mm256_setzero_ps();
          for (int64_t t = cached(row); t < a.len[row]; ++t) {
            const W* value = panel + tree_position(a, row, t) * kPanel;
            const __m256 weight = _mm256_broadcast_ss(p + t);
            for (int64_t v = 0; v < kVectors; ++v) sum[v] = _mm256_fmadd_ps(weight, load8(value + v * 8), sum[v]);
          }
          for (int64_t v = 0; v < kVectors; ++v) _mm256_storeu_ps(acc_s + v * 8, sum[v]);
        }
      }
      const int64_t cols = std::min(kPanel, a.d - c * kPanel);
      for (int64_t s = 0; s < slots; ++s) {
        const int64_t row = s / group, head = kv * group + s % group;
        std::copy(acc.data() + s * kPanel, acc.data() + s * kPanel + cols, a.out + (row * a.heads + head) * a.d + c * kPanel);
      }
    }
  });
}


// Attention on AMX tiles, for a bf16 KV cache (the amx numerics' cache: keys and values rounded to
// bf16 as they were written). q is rounded to bf16 (nearest even) as it is read; each score is one
// chain of tdpbf16ps over d in blocks of 32 from zero, times scale; the softmax is amx_softmax's
// (float32 on 16 lanes, a function of the row's own scores); the probabilities are rounded to bf16
// and each output is one chain of tdpbf16ps over the keys in blocks of 32 from position 0 (then
// +0.0, so that a zero output is +0 whatever its chain's signs). A row's probabilities are zero past
// its length, so where its chain runs on past its own last block, over the values of longer rows
// (and zeros past the longest), it adds exact zeros, provided those values are finite (0 x Inf is
// NaN): a row's bits do not depend on the rows beside it, their count or the threads. Where a value
// that some row's chain would read past its length is not finite, every row runs its own blocks past
// the rows' shortest length over its own values only, zero past its length, as a tree's node does.
// Neither the fma chains' bits nor torch's.
// A token tree's node scores its path's keys where they lie (a score is a function of its query and
// key alone) and puts them in path order before its softmax; its outputs run the blocks below the one
// holding `start` with every row, then the node's own blocks from there, over its path's values
// gathered in order: the chain that decoding the path one token at a time computes.
// Calls of up to 16 rows, and trees, run three passes over every kv head at once, as
// attention_few's: scores (items: a kv head's block of kKeyBlock key panels), softmaxes (a slot),
// outputs (a kv head's value panel); longer calls (prefill blocks) run amx_chunk's items.

// The chains of rows [0, R) (R as amx_configure set the first row tile) continued over `blocks` more k
// blocks: xa [R, >= blocks * 32] bf16 (lda apart), b_tiles the blocks' interleaved B tiles (two each),
// acc [R][32] in the tiles' column order, in and out.
AMX_TILES void amx_continue(const uint16_t* xa, int64_t lda, int64_t blocks, const uint16_t* b_tiles, float* acc) {
  asm volatile("" ::: "memory");  // the B tiles and acc were just written: before the tile loads
  _tile_loadd(0, acc, kPanel * 4);
  _tile_loadd(1, acc + 16, kPanel * 4);
  for (int64_t block = 0; block < blocks; ++block) {
    _tile_loadd(4, xa + block * kAmxK, lda * 2);
    _tile_loadd(6, b_tiles + 2 * block * kAmxTile, 64);
    _tile_loadd(7, b_tiles + (2 * block + 1) * kAmxTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
  }
  _tile_stored(0, acc, kPanel * 4);
  _tile_stored(1, acc + 16, kPanel * 4);
  asm volatile("" ::: "memory");
}

// What the steps share: the call, its slots and their buffers: every kv head's (the passes of a step
// or a verify block), or one kv head's chunk of slots (a prefill block's work items).
struct AmxAttention {
  const AttentionCall& a;
  int64_t group, slots, m16;  // slots (row * group + head in the group) in row tiles of 16
  int64_t dwidth;             // d rounded up to a k block
  int64_t width;              // a score / probability row: the keys scored where they lie, in whole panels
  int64_t shortest, longest;  // the rows' lengths, least and most
  int64_t tile_rows;          // rows of the first row tile (amx_configure's for the whole call)
  const uint16_t* qa;         // [kv_heads][m16][dwidth] bf16 queries
  float* scores;              // [kv_heads][slots][width]
  uint16_t* pa;               // [kv_heads][m16][width] bf16 probabilities
  int64_t first = 0;          // a chunk: the call's slot that is slot 0 here
  bool chunk = false;         // the buffers hold one kv head's slots (first ..), not every kv head's
  bool tail = false;          // the threads' tiles are amx_configure_tail's (amx_panel's `tail`)
  const uint16_t* queries(int64_t kv) const { return qa + (chunk ? 0 : kv * m16 * dwidth); }
  float* score_row(int64_t kv, int64_t s) const { return scores + ((chunk ? 0 : kv * slots) + s) * width; }
  uint16_t* probs(int64_t kv) const { return pa + (chunk ? 0 : kv * m16 * width); }
  int64_t row(int64_t s) const { return (first + s) / group; }
  int64_t head(int64_t kv, int64_t s) const { return kv * group + (first + s) % group; }
};


// Scores of every slot of kv head `kv` against key panels [p0, p1), scaled, into x.scores.
AMX_TILES void amx_scores(const AmxAttention& x, int64_t kv, int64_t p0, int64_t p1, std::vector<float>& acc,
                          std::vector<uint16_t>& buffer) {
  const AttentionCall& a = x.a;
  const int64_t dblocks = x.dwidth / kAmxK;
  acc.resize(std::max<size_t>(acc.size(), x.m16 * kPanel));
  uint16_t* b = amx_b_buffer(buffer, x.m16, dblocks);
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t p = p0; p < p1; ++p) {
    amx_panel(x.queries(kv), x.dwidth, x.m16, dblocks, a.keys16 + kv * a.key_head + p * a.key_panel, a.d, b,
              acc.data(), false, x.tail);
    for (int64_t s = 0; s < x.slots; ++s) {
      __m512 first, second;
      amx_row(acc.data() + s * kPanel, first, second);
      float* row = x.score_row(kv, s) + p * kPanel;
      _mm512_storeu_ps(row, _mm512_mul_ps(first, scale));
      _mm512_storeu_ps(row + 16, _mm512_mul_ps(second, scale));
    }
  }
}

// exp8's values on 16 lanes for every input a softmax gives it (a score less its row's maximum: at or
// below 0, or NaN), in fewer instructions: no clamp above (inputs are never above 0, where exp8
// clamps at 88), NaN kept by the operand order of the clamp below (vmaxps returns its second operand,
// the input, where either is NaN) rather than a compare and blend, and 2^n applied by vscalefps
// rather than built in the exponent bits and multiplied (both exact: n >= -126 at the clamp, where
// the polynomial gives about 1.4, so the result is a normal float). Checked on every float32 at or
// below 0 and every quiet NaN against the former exp16 (exp8's steps on 16 lanes): the same bits.
// Measured (exp over a row of 1,900 scores, one core, best of 2): 0.376 -> 0.274 us.
// Precondition: no input above 0 (amx_softmax's only; above 0 the result is not exp8's).
AMX_TILES inline __m512 exp16(__m512 input) {
  __m512 x = _mm512_max_ps(_mm512_set1_ps(kExpLow), input);
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), x);
  __m512 y = _mm512_set1_ps(kExpPolynomial[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kExpPolynomial[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// Lanes j .. j + 15 of a row that lie before its length.
AMX_TILES inline __mmask16 inside16(int64_t j, int64_t length) {
  const int64_t inside = std::clamp<int64_t>(length - j, 0, 16);
  return static_cast<__mmask16>((1u << inside) - 1);
}

// (Also dot_attention's, on CPUs without AMX: no tile instruction here.)
// Slot s of kv head kv: its scores in key order (a tree node's path after `start`), then its softmax
// as bf16 probabilities into x.pa, zero past its length: exp of each score less the row's maximum,
// times 1 / their sum (16 lanes over the row's scores in order, the lanes added by one fixed
// reduction), rounded to nearest even. A function of the row's own scores; a NaN score makes the
// row's outputs NaN.
AMX_TILES void amx_softmax(const AmxAttention& x, int64_t kv, int64_t s) {
  const AttentionCall& a = x.a;
  const int64_t row = x.row(s), length = a.len[row];
  float* scores = x.score_row(kv, s);
  // a path's node t sits at start + path[t] >= start + t: in place, in order, nothing read is overwritten
  if (a.paths)
    for (int64_t t = a.start; t < length; ++t) scores[t] = scores[tree_position(a, row, t)];
  __m512 most = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < length; j += 16) most = _mm512_max_ps(most, _mm512_mask_loadu_ps(most, inside16(j, length), scores + j));
  const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(most));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < length; j += 16) {
    const __mmask16 inside = inside16(j, length);
    const __m512 e = _mm512_maskz_mov_ps(inside, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(inside, scores + j), shift)));
    _mm512_storeu_ps(scores + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  uint16_t* probs = x.probs(kv) + s * x.width;
  for (int64_t j = 0; j < x.width; j += 16) {
    const __mmask16 inside = inside16(j, length);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs + j),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_mul_ps(inside, _mm512_loadu_ps(scores + j), inverse)));
  }
}

// Whether any of bf16 rows [from, to) of a value panel is Inf or NaN (every exponent bit set).
AMX_TILES bool any_not_finite(const uint16_t* panel, int64_t from, int64_t to) {
  const __m512i exponent = _mm512_set1_epi16(0x7F80);
  for (int64_t p = from; p < to; ++p) {
    const __m512i bits = _mm512_and_si512(_mm512_loadu_si512(panel + p * kPanel), exponent);
    if (_mm512_cmpeq_epi16_mask(bits, exponent)) return true;
  }
  return false;
}

// Continue the chains of slots [s0, s1) (one row's heads, at most x.tile_rows) in acc over the row's
// own keys from `from` to its length: `blocks` blocks of B tiles in b, zero past the row's keys.
AMX_TILES void amx_own_blocks(const AmxAttention& x, const uint16_t* probs, int64_t s0, int64_t s1, int64_t from,
                              int64_t blocks, const uint16_t* b, float* acc) {
  thread_local std::vector<float> chains;
  thread_local std::vector<uint16_t> inputs;
  inputs.assign(x.tile_rows * blocks * kAmxK, 0);
  chains.assign(x.tile_rows * kPanel, 0.0f);
  for (int64_t s = s0; s < s1; ++s) {
    std::copy_n(probs + s * x.width + from, blocks * kAmxK, inputs.data() + (s - s0) * blocks * kAmxK);
    std::copy_n(acc + s * kPanel, kPanel, chains.data() + (s - s0) * kPanel);
  }
  amx_continue(inputs.data(), blocks * kAmxK, blocks, b, chains.data());
  for (int64_t s = s0; s < s1; ++s) std::copy_n(chains.data() + (s - s0) * kPanel, kPanel, acc + s * kPanel);
}

// Outputs of every slot of kv head kv for value panel c (d columns 32c ..) into a.out: every row
// together over the blocks all of them run (all, or those below `from`), then where rows run their
// own blocks (a tree's nodes, or a value past some row's length that is not finite), each row alone
// from `from` on over its own values in order, gathered (a tree's path) and zero past its length.
AMX_TILES void amx_outputs_of(const AmxAttention& x, int64_t kv, int64_t c, std::vector<float>& acc,
                              std::vector<uint16_t>& buffer) {
  const AttentionCall& a = x.a;
  acc.resize(std::max<size_t>(acc.size(), x.m16 * kPanel));
  const uint16_t* panel = a.values16 + kv * a.value_head + c * a.value_panel;  // [positions][32]
  const uint16_t* probs = x.probs(kv);
  const bool own = a.paths || any_not_finite(panel, x.shortest, x.longest);
  const int64_t together = own ? (a.paths ? a.start : x.shortest) / kAmxK : (x.longest + kAmxK - 1) / kAmxK;
  if (together > 0)
    amx_panel(probs, x.width, x.m16, together, panel, own ? together * kAmxK : x.longest,
              amx_b_buffer(buffer, x.m16, together), acc.data(), false, x.tail);
  else
    std::fill(acc.begin(), acc.begin() + x.m16 * kPanel, 0.0f);
  if (own) {
    const int64_t from = together * kAmxK;
    thread_local std::vector<uint16_t> gathered, tiles;
    for (int64_t s0 = 0, s1; s0 < x.slots; s0 = s1) {  // a row's slots [s0, s1), its heads here
      const int64_t row = x.row(s0), keys = a.len[row] - from, blocks = (keys + kAmxK - 1) / kAmxK;
      for (s1 = s0; s1 < x.slots && x.row(s1) == row;) ++s1;
      gathered.assign(blocks * kAmxK * kPanel, 0);
      for (int64_t t = 0; t < keys; ++t) {
        const int64_t position = a.paths ? tree_position(a, row, from + t) : from + t;
        std::copy_n(panel + position * kPanel, kPanel, gathered.data() + t * kPanel);
      }
      uint16_t* b = aligned_tiles(tiles, blocks * 2);
      for (int64_t block = 0; block < blocks; ++block)
        amx_interleave(gathered.data(), keys, block * kAmxK, (block + 1) * kAmxK, b + 2 * block * kAmxTile);
      for (int64_t s = s0; s < s1; s += x.tile_rows)  // a tile holds tile_rows of the row's heads
        amx_own_blocks(x, probs, s, std::min(s1, s + x.tile_rows), from, blocks, b, acc.data());
    }
  }
  __mmask16 lo, hi;
  column_masks(std::min(kPanel, a.d - c * kPanel), lo, hi);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t s = 0; s < x.slots; ++s) {
    __m512 first, second;
    amx_row(acc.data() + s * kPanel, first, second);
    float* out = a.out + (x.row(s) * a.heads + x.head(kv, s)) * a.d + c * kPanel;
    _mm512_mask_storeu_ps(out, lo, _mm512_add_ps(first, zero));  // + 0: a zero output is +0
    _mm512_mask_storeu_ps(out + 16, hi, _mm512_add_ps(second, zero));
  }
}

// The least and the most length of the rows of slots [first, first + count): a chunk's keys (a
// prefill block's first chunks see few of the block's).
std::pair<int64_t, int64_t> slot_lengths(const AmxAttention& all, int64_t first, int64_t count) {
  int64_t shortest = std::numeric_limits<int64_t>::max(), longest = 0;
  for (int64_t s = first; s < first + count; ++s) {
    shortest = std::min(shortest, all.a.len[s / all.group]);
    longest = std::max(longest, all.a.len[s / all.group]);
  }
  return {shortest, longest};
}

// A prefill block's work items: a kv head's chunk of kAmxChunk slots (two row tiles), its scores,
// softmaxes and outputs at once, so that its score rows (kAmxChunk x the keys) stay in L2. Measured
// (30 layers' attention, 128 rows at 2,000 keys, two threads): 67 ms in three passes over every slot
// (each score stored into a 9 MB buffer), 38 ms in chunks.
constexpr int64_t kAmxChunk = 2 * kAmxRows;

AMX_TILES void amx_chunk(const AmxAttention& all, int64_t kv, int64_t first, std::vector<float>& scores,
                         std::vector<uint16_t>& probs, std::vector<float>& acc, std::vector<uint16_t>& buffer) {
  const int64_t count = std::min(kAmxChunk, all.slots - first);
  const auto [shortest, longest] = slot_lengths(all, first, count);
  const int64_t width = (longest + kPanel - 1) / kPanel * kPanel;
  scores.resize(std::max<size_t>(scores.size(), kAmxChunk * width));
  probs.resize(std::max<size_t>(probs.size(), kAmxChunk * width));
  // the chunk's second row tile past the slots: zero, as the tiles read it
  std::fill(probs.begin() + count * width, probs.begin() + kAmxChunk * width, uint16_t{0});
  AmxAttention x{all.a,    all.group, count,         (count + kAmxRows - 1) / kAmxRows * kAmxRows,
                 all.dwidth, width,   shortest,      longest,
                 all.tile_rows, all.qa + (kv * all.m16 + first) * all.dwidth, scores.data(), probs.data(),
                 first,    true};
  amx_scores(x, kv, 0, x.width / kPanel, acc, buffer);
  for (int64_t s = 0; s < count; ++s) amx_softmax(x, kv, s);
  for (int64_t c = 0; c < (x.a.d + kPanel - 1) / kPanel; ++c) amx_outputs_of(x, kv, c, acc, buffer);
}

// Every kv head's query slots (slot = row * group + head in the group) rounded to bf16 as
// amx_inputs rounds them, into qa [kv_heads][m16][32 * dblocks] (m16 >= the slots): what the bf16
// caches' attention multiplies, on AMX tiles or with vdpbf16ps.
void bf16_queries(const AttentionCall& a, int64_t m16, int64_t dblocks, std::vector<uint16_t>& qa) {
  const int64_t group = a.heads / a.kv_heads, slots = a.rows * group;
  thread_local std::vector<float> query;
  query.resize(std::max<size_t>(query.size(), slots * a.d));
  qa.resize(std::max<size_t>(qa.size(), a.kv_heads * m16 * dblocks * kAmxK));
  for (int64_t kv = 0; kv < a.kv_heads; ++kv) {
    for (int64_t s = 0; s < slots; ++s) {
      const float* from = a.q + ((s / group) * a.heads + kv * group + s % group) * a.d;
      std::copy(from, from + a.d, query.data() + s * a.d);
    }
    amx_inputs(query.data(), slots, a.d, m16, dblocks, qa.data() + kv * m16 * dblocks * kAmxK);
  }
}

// The least length of a call's rows.
int64_t shortest_length(const AttentionCall& a) {
  return *std::min_element(a.len, a.len + a.rows);
}

void amx_attention(const AttentionCall& a) {
  const int64_t group = a.heads / a.kv_heads, slots = a.rows * group;
  const int64_t m16 = (slots + kAmxRows - 1) / kAmxRows * kAmxRows, dblocks = (a.d + kAmxK - 1) / kAmxK;
  const int64_t scored = a.paths ? a.start + a.nodes : a.longest;  // keys scored where they lie
  const int64_t width = (scored + kPanel - 1) / kPanel * kPanel, panels = width / kPanel;
  const bool chunked = a.rows > kHalfRowsMost && !a.paths;
  // the last row tile only as high as its slots (amx_configure_tail) where that adds no pass: up to
  // three row tiles (amx_panel runs one alone and a pair, as it would a pair and one alone); with
  // more, the tiles before the last pair would each run alone (4 tiles: 3 passes, not 2)
  const bool tail = !chunked && slots <= 3 * kAmxRows;
  thread_local std::vector<float> scores;
  thread_local std::vector<uint16_t> qa, pa;
  bf16_queries(a, m16, dblocks, qa);
  if (!chunked) {
    scores.resize(std::max<size_t>(scores.size(), a.kv_heads * slots * width));
    pa.resize(std::max<size_t>(pa.size(), a.kv_heads * m16 * width));
  }
  // probability rows past the slots: zero where the tiles read them (16 rows and more under
  // amx_configure; none under amx_configure_tail's; a chunk zeroes its own: amx_chunk)
  if (!chunked && !tail && slots >= kAmxRows)
    for (int64_t kv = 0; kv < a.kv_heads; ++kv)
      std::fill_n(pa.data() + (kv * m16 + slots) * width, (m16 - slots) * width, uint16_t{0});
  const int64_t shortest = shortest_length(a);
  AmxAttention x{a,        group,         slots,       m16,       dblocks * kAmxK, width, shortest,
                 a.longest, std::min(slots, kAmxRows), qa.data(), scores.data(),  pa.data()};
  x.tail = tail;
  if (chunked) {
    const int64_t chunks = (slots + kAmxChunk - 1) / kAmxChunk;
    parallel_items(a.kv_heads * chunks, true, [&](const auto& claim) {
      amx_configure(slots);
      thread_local std::vector<float> chunk_scores, acc;
      thread_local std::vector<uint16_t> chunk_probs, buffer;
      for (int64_t item; (item = claim()) >= 0;)
        amx_chunk(x, item / chunks, (item % chunks) * kAmxChunk, chunk_scores, chunk_probs, acc, buffer);
      amx_release();
    });
    return;
  }
  const int64_t blocks = (panels + kKeyBlock - 1) / kKeyBlock, value_panels = (a.d + kPanel - 1) / kPanel;
  const bool dynamic = false;  // up to 16 rows here (a step, a verify block, a tree): memory-bound
  parallel_items(a.kv_heads * blocks, dynamic, [&](const auto& claim) {
    tail ? amx_configure_tail(slots) : amx_configure(slots);
    thread_local std::vector<float> acc;
    thread_local std::vector<uint16_t> buffer;
    for (int64_t item; (item = claim()) >= 0;) {
      const int64_t kv = item / blocks, p0 = (item % blocks) * kKeyBlock;
      amx_scores(x, kv, p0, std::min(panels, p0 + kKeyBlock), acc, buffer);
    }
    amx_release();
  });
  parallel_items(a.kv_heads * slots, dynamic, [&](const auto& claim) {
    for (int64_t item; (item = claim()) >= 0;) amx_softmax(x, item / slots, item % slots);
  });
  parallel_items(a.kv_heads * value_panels, false, [&](const auto& claim) {
    tail ? amx_configure_tail(slots) : amx_configure(slots);
    thread_local std::vector<float> acc;
    thread_local std::vector<uint16_t> buffer;
    for (int64_t item; (item = claim()) >= 0;) amx_outputs_of(x, item / value_panels, item % value_panels, acc, buffer);
    amx_release();
  });
}


// Attention over a bf16 KV cache with vdpbf16ps, where the bf16 dot numerics run without AMX: q
// rounded to bf16 as amx_inputs rounds it; each score one chain of vdpbf16ps over d in pairs from
// zero (micro_dot's, the key panel [d][32] as a weight panel whose columns are keys), times scale;
// amx_softmax's softmax and bf16 probabilities; each output one chain of vdpbf16ps over the keys in
// pairs from position 0 (the value panel [positions][32] as a weight panel over k = positions), then
// +0.0. Every slot runs the pairs below the call's shortest length (a tree's: `start`) together, then
// each row alone the rest of its own keys, gathered (a tree's path in order) and zero past its length:
// the split never changes a chain, and no row reads a value past its own keys. So a row's bits
// depend on nothing beside it, as the other paths'; they are neither the fma chains' nor AMX's.
// Half the bytes of a float32 cache to stream, and twice the multiply-adds an instruction.

// Scores of the slots of kv head kv against key panels [p0, p1), scaled, into x.scores.
DOT_TILES void dot_scores(const AmxAttention& x, int64_t kv, int64_t p0, int64_t p1, std::vector<float>& acc) {
  const AttentionCall& a = x.a;
  acc.resize(std::max<size_t>(acc.size(), x.slots * kPanel));
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t p = p0; p < p1; ++p) {
    dot_tiles(x.queries(kv), x.slots, x.dwidth, a.keys16 + kv * a.key_head + p * a.key_panel, 0, a.d, acc.data());
    for (int64_t s = 0; s < x.slots; ++s) {
      float* row = x.score_row(kv, s) + p * kPanel;
      _mm512_storeu_ps(row, _mm512_mul_ps(_mm512_loadu_ps(acc.data() + s * kPanel), scale));
      _mm512_storeu_ps(row + 16, _mm512_mul_ps(_mm512_loadu_ps(acc.data() + s * kPanel + 16), scale));
    }
  }
}

// Outputs of the slots of kv head kv for value panel c (d columns 32c ..) into a.out.
DOT_TILES void dot_outputs_of(const AmxAttention& x, int64_t kv, int64_t c, std::vector<float>& acc,
                              std::vector<uint16_t>& gathered) {
  const AttentionCall& a = x.a;
  acc.resize(std::max<size_t>(acc.size(), x.slots * kPanel));
  const uint16_t* panel = a.values16 + kv * a.value_head + c * a.value_panel;  // [positions][32]
  const uint16_t* probs = x.probs(kv);
  const int64_t together = (a.paths ? a.start : x.shortest) / 2 * 2;  // a tree's rows: longer than start
  if (together > 0) dot_tiles(probs, x.slots, x.width, panel, 0, together, acc.data());
  for (int64_t s0 = 0, s1; s0 < x.slots; s0 = s1) {  // a row's slots [s0, s1): the rest of its keys
    const int64_t row = x.row(s0), length = a.len[row], end = (length + 1) / 2 * 2;
    for (s1 = s0; s1 < x.slots && x.row(s1) == row;) ++s1;
    if (end == together) continue;
    gathered.resize(std::max<size_t>(gathered.size(), end * kPanel));
    for (int64_t t = together; t < end; ++t) {
      uint16_t* to = gathered.data() + t * kPanel;
      if (t < length)
        std::copy_n(panel + (a.paths ? tree_position(a, row, t) : t) * kPanel, kPanel, to);
      else
        std::fill_n(to, kPanel, uint16_t{0});
    }
    dot_tiles(probs + s0 * x.width, s1 - s0, x.width, gathered.data(), together, end, acc.data() + s0 * kPanel);
  }
  __mmask16 lo, hi;
  column_masks(std::min(kPanel, a.d - c * kPanel), lo, hi);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t s = 0; s < x.slots; ++s) {
    float* out = a.out + (x.row(s) * a.heads + x.head(kv, s)) * a.d + c * kPanel;
    _mm512_mask_storeu_ps(out, lo, _mm512_add_ps(_mm512_loadu_ps(acc.data() + s * kPanel), zero));  // a zero output is +0
    _mm512_mask_storeu_ps(out + 16, hi, _mm512_add_ps(_mm512_loadu_ps(acc.data() + s * kPanel + 16), zero));
  }
}

// A prefill block's work item: a kv head's chunk of kDotChunk slots, its scores, softmaxes and
// outputs at once, so that its score rows stay in L2 (as amx_chunk's).
constexpr int64_t kDotChunk = 2 * kDotRows;

DOT_TILES void dot_chunk(const AmxAttention& all, int64_t kv, int64_t first) {
  thread_local std::vector<float> scores, acc;
  thread_local std::vector<uint16_t> probs, gathered;
  const int64_t count = std::min(kDotChunk, all.slots - first);
  const auto [shortest, longest] = slot_lengths(all, first, count);
  const int64_t width = (longest + kPanel - 1) / kPanel * kPanel;
  scores.resize(std::max<size_t>(scores.size(), count * width));
  probs.resize(std::max<size_t>(probs.size(), count * width));
  AmxAttention x{all.a,   all.group, count,     count,         all.dwidth, width, shortest, longest,
                 count,   all.qa + (kv * all.m16 + first) * all.dwidth, scores.data(), probs.data(), first, true};
  dot_scores(x, kv, 0, width / kPanel, acc);
  for (int64_t s = 0; s < count; ++s) amx_softmax(x, kv, s);
  for (int64_t c = 0; c < (x.a.d + kPanel - 1) / kPanel; ++c) dot_outputs_of(x, kv, c, acc, gathered);
}

void dot_attention(const AttentionCall& a) {
  const int64_t group = a.heads / a.kv_heads, slots = a.rows * group, dblocks = (a.d + kAmxK - 1) / kAmxK;
  const int64_t scored = a.paths ? a.start + a.nodes : a.longest;  // keys scored where they lie
  const int64_t width = (scored + kPanel - 1) / kPanel * kPanel, panels = width / kPanel;
  const bool chunked = a.rows > kHalfRowsMost && !a.paths;
  thread_local std::vector<float> scores;
  thread_local std::vector<uint16_t> qa, pa;
  bf16_queries(a, slots, dblocks, qa);
  if (!chunked) {
    scores.resize(std::max<size_t>(scores.size(), a.kv_heads * slots * width));
    pa.resize(std::max<size_t>(pa.size(), a.kv_heads * slots * width));
  }
  const int64_t shortest = shortest_length(a);
  const AmxAttention x{a,         group, slots,     slots,         dblocks * kAmxK, width, shortest,
                       a.longest, slots, qa.data(), scores.data(), pa.data()};
  if (chunked) {
    const int64_t chunks = (slots + kDotChunk - 1) / kDotChunk;
    parallel_items(a.kv_heads * chunks, true, [&](const auto& claim) {
      for (int64_t item; (item = claim()) >= 0;) dot_chunk(x, item / chunks, (item % chunks) * kDotChunk);
    });
    return;
  }
  const int64_t blocks = (panels + kKeyBlock - 1) / kKeyBlock, value_panels = (a.d + kPanel - 1) / kPanel;
  parallel_items(a.kv_heads * blocks, false, [&](const auto& claim) {
    thread_local std::vector<float> acc;
    for (int64_t item; (item = claim()) >= 0;) {
      const int64_t kv = item / blocks, p0 = (item % blocks) * kKeyBlock;
      dot_scores(x, kv, p0, std::min(panels, p0 + kKeyBlock), acc);
    }
  });
  parallel_items(a.kv_heads * slots, false, [&](const auto& claim) {
    for (int64_t item; (item = claim()) >= 0;) amx_softmax(x, item / slots, item % slots);
  });
  parallel_items(a.kv_heads * value_panels, false, [&](const auto& claim) {
    thread_local std::vector<float> acc;
    thread_local std::vector<uint16_t> gathered;
    for (int64_t item; (item = claim()) >= 0;) dot_outputs_of(x, item / value_panels, item % value_panels, acc, gathered);
  });
}

}  // namespace

// Causal attention of `rows` query rows over the KV cache of one layer, in the panel layout:
//   q [rows, heads, d]; keys [kv_heads, >= ceil(max length / 32), d, 32]; values [kv_heads, ceil(d / 32), >= max length, 32];
//   lengths [rows] int64: row i attends to keys [0, lengths[i]); heads share a kv head in groups of heads / kv_heads.
// Every score is the fixed fma chain over d (as linear() makes it), times scale; the softmax is a
// function of the row's own scores (softmax_row); every output is the fixed fma chain over the row's own
// keys, in order. Keys and values past a row's length are never used (they may hold anything). So a row's
// output does not depend on the rows beside it, how many there are, or the threads. -> [rows, heads * d]
// Keys and values in bfloat16: under the bf16 dot numerics (amx, bf16dot) on AMX tiles, or with
// vdpbf16ps (an even d), with the same invariances (amx_attention and dot_attention say how); under the
// float32 numerics the fma chains above, each key and value widened exactly as it is read (half the
// bytes to stream; the bits of a float32 cache holding the same rounded values). A prefill block's
// chunks widen each key panel once for all their tiles (with_panel). Measured on 2 cores of an AMD
// EPYC with AVX2 (30 layers' attention at 2,000 keys, 9 heads over 3 kv heads, head_dim 64, a float32
// cache and a bf16 one of the same values in one process, 12 interleaved rounds, mean of the fastest
// 3, ms): rows 1 / 2 / 4 / 8 / 16 / 128: 3.97 / 4.28 / 6.48 / 11.9 / 19.2 / 126 against 2.10 / 3.07 /
// 5.59 / 11.0 / 19.9 / 143. with_panel against the same source without it (two builds alternating in
// one process, 10 rounds, best 3, the bf16 cache): rows 16 / 128 / 512 21.6 / 151 / 519 against 22.4 /
// 152 / 556 ms. Widening every key and value panel into a buffer for 2-8 rows too lost the gain: 2 rows
// 5.43 ms against the float32 cache's 5.29 in that run, where widening in registers gives 3.07 against
// 4.28 (the run above).
// parents [nodes] (a token tree, else none): node j's keys and values lie at start + j, parents[j] < j
// or -1 (a root: several may be); the rows are the last `rows` nodes (a verify step's: every node; a
// draft head's: the level it adds), each attending to [0, start) and then its root-to-node path.
template <typename W>
torch::Tensor attention_chunked(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                                const int64_t* len, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                                double scale);

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                        const torch::Tensor& lengths, double scale, const c10::optional<torch::Tensor>& parents,
                        int64_t start) {
  TORCH_CHECK(q.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu() && lengths.device().is_cpu(),
              "attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(), "attention: q [rows, heads, d] contiguous float32");
  // a bf16 cache: under the bf16 dot numerics attention on AMX tiles, or with vdpbf16ps (amx); under
  // the float32 numerics the fma chains over its widened values
  const bool bf16 = keys.scalar_type() == torch::kBFloat16, amx = bf16 && bf16_dot_on.load();
  TORCH_CHECK((bf16 || keys.scalar_type() == torch::kFloat32) && values.scalar_type() == keys.scalar_type(),
              "attention: keys and values both float32, or both bfloat16");
  TORCH_CHECK(!amx || amx_on.load() || q.size(2) % 2 == 0,
              "attention: a bfloat16 cache without AMX tiles needs an even head_dim (vdpbf16ps multiplies pairs)");
  TORCH_CHECK(keys.dim() == 4 && keys.size(2) == q.size(2) && keys.size(3) == kPanel && keys.stride(3) == 1 &&
                  keys.stride(2) == kPanel,
              "attention: keys [kv_heads, panels, d, 32]");
  TORCH_CHECK(values.dim() == 4 && values.size(0) == keys.size(0) && values.size(1) * kPanel >= q.size(2) &&
                  values.size(3) == kPanel && values.stride(3) == 1 && values.stride(2) == kPanel,
              "attention: values [kv_heads, ceil(d / 32), positions, 32]");
  TORCH_CHECK(lengths.dim() == 1 && lengths.scalar_type() == torch::kInt64 && lengths.size(0) == q.size(0),
              "attention: lengths [rows] int64");
  const int64_t rows = q.size(0), heads = q.size(1), d = q.size(2), kv_heads = keys.size(0);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "attention: heads must be a multiple of kv_heads");
  if (rows == 0) return torch::empty({0, heads * d}, q.options());  // no row asks: nothing to read
  const auto length = lengths.contiguous();
  const int64_t* len = length.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t padded = (len[r] + kPanel - 1) / kPanel * kPanel;
    TORCH_CHECK(len[r] >= 1 && padded <= keys.size(1) * kPanel && padded <= values.size(2), "attention: a length is out of range");
    longest = std::max(longest, len[r]);
  }
  std::vector<std::vector<int64_t>> paths;  // a token tree's: each row's path from its root
  int64_t nodes = 0;
  if (parents.has_value()) {
    TORCH_CHECK(parents->dim() == 1 && parents->scalar_type() == torch::kInt64 && parents->size(0) >= rows &&
                    rows <= kHalfRowsMost && start >= 0,
                "attention: parents [nodes >= rows] int64, for at most 16 rows");
    nodes = parents->size(0);
    TORCH_CHECK(start + nodes <= keys.size(1) * kPanel && start + nodes <= values.size(2),
                "attention: the cache does not hold the tree's nodes");
    const auto up = parents->contiguous();
    const int64_t* parent = up.data_ptr<int64_t>();
    std::vector<std::vector<int64_t>> all;  // every node's path
    for (int64_t node = 0; node < nodes; ++node) {
      TORCH_CHECK(parent[node] == -1 || (0 <= parent[node] && parent[node] < node),
                  "attention: a tree needs parents[i] == -1 (a root) or 0 <= parents[i] < i");
      std::vector<int64_t> path = parent[node] >= 0 ? all[parent[node]] : std::vector<int64_t>{};
      path.push_back(node);
      all.push_back(std::move(path));
    }
    for (int64_t row = 0; row < rows; ++row) {
      paths.push_back(std::move(all[nodes - rows + row]));
      TORCH_CHECK(len[row] == start + static_cast<int64_t>(paths.back().size()),
                  "attention: a tree node's length is start + its depth + 1");
    }
  }
  if (rows <= kFewRows || parents.has_value() || amx) {
    auto out = torch::empty({rows, heads * d}, q.options());
    AttentionCall call{q.data_ptr<float>(), bf16 ? nullptr : keys.data_ptr<float>(), keys.stride(0), keys.stride(1),
                       bf16 ? nullptr : values.data_ptr<float>(), values.stride(0), values.stride(1), len, rows, heads,
                       kv_heads, d, longest, static_cast<float>(scale), out.data_ptr<float>()};
    if (parents.has_value()) {
      call.paths = &paths;
      call.start = start;
      call.nodes = nodes;
    }
    if (bf16) {
      call.keys16 = reinterpret_cast<const uint16_t*>(keys.data_ptr<at::BFloat16>());
      call.values16 = reinterpret_cast<const uint16_t*>(values.data_ptr<at::BFloat16>());
    }
    if (amx)
      amx_on.load() ? amx_attention(call) : dot_attention(call);
    else if (bf16)
      attention_few<uint16_t>(call);
    else
      attention_few<float>(call);
    return out;
  }
  return bf16 ? attention_chunked<uint16_t>(q, keys, values, len, rows, heads, kv_heads, d, scale)
              : attention_chunked<float>(q, keys, values, len, rows, heads, kv_heads, d, scale);
}

// Attention of more than kFewRows rows of a chain (prefill blocks) in items of a kv head's chunk of
// slots, attention()'s arguments; W: the cache's element, float or bf16 (uint16_t).
template <typename W>
torch::Tensor attention_chunked(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                                const int64_t* len, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                                double scale) {
  const int64_t group = heads / kv_heads, slots = rows * group;
  const int64_t chunk = rows > kHalfRowsMost ? kSlots : kSlots / 2, chunks = (slots + chunk - 1) / chunk;
  const int64_t value_panels = (d + kPanel - 1) / kPanel;
  auto out = torch::empty({rows, heads * d}, q.options());
  const float* qp = q.data_ptr<float>();
  const W* kp = static_cast<const W*>(keys.data_ptr());
  const W* vp = static_cast<const W*>(values.data_ptr());
  float* op = out.data_ptr<float>();
  const __m256 scale8 = _mm256_set1_ps(static_cast<float>(scale));
  // a work item: one kv head's chunk of up to kSlots slots (slot = row * group + head in the group)
  parallel_items(kv_heads * chunks, rows > kHalfRowsMost, [&](const auto& claim) {
    std::vector<float> query(kSlots * d), acc(kSlots * kPanel), probs, wide;
    __m256 most[kSlots];
    for (int64_t item; (item = claim()) >= 0;) {
      const int64_t kv = item / chunks, first = (item % chunks) * chunk, count = std::min(chunk, slots - first);
      int64_t span = 0;  // keys any slot of the chunk sees
      int64_t lengths[kSlots];
      for (int64_t s = 0; s < count; ++s) {
        const int64_t row = (first + s) / group, head = kv * group + (first + s) % group;
        lengths[s] = len[row];
        std::copy(qp + (row * heads + head) * d, qp + (row * heads + head + 1) * d, query.data() + s * d);
        span = std::max(span, len[row]);
      }
      const int64_t padded = (span + kPanel - 1) / kPanel * kPanel;
      if (probs.size() < static_cast<size_t>(count * padded)) probs.resize(count * padded);  // no zeros needed
      for (int64_t s = 0; s < count; ++s) most[s] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      // scores: key panel by key panel, every slot of the chunk against it (the panel stays in L1)
      const W* key_head = kp + kv * keys.stride(0);
      for (int64_t p = 0; p < padded / kPanel; ++p) {
        with_panel(key_head + p * keys.stride(1), d * kPanel, slot_tiles(count), wide,
                   [&](const auto* panel) { score_tiles(query.data(), count, d, panel, acc.data()); });
        for (int64_t s = 0; s < count; ++s) {
          const int64_t length = len[(first + s) / group];
          for (int64_t v = 0; v < kVectors; ++v) {
            const int64_t j = p * kPanel + v * 8;
            const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(acc.data() + s * kPanel + v * 8), scale8);
            _mm256_storeu_ps(probs.data() + s * padded + j, scaled);
            if (j < length) most[s] = max_inside(most[s], scaled, j, length);
          }
        }
      }
      for (int64_t s = 0; s < count; ++s) softmax_row(probs.data() + s * padded, len[(first + s) / group], most[s]);
      // outputs: value panel by value panel, chains over the keys in blocks of kBlockK parked in acc;
      // each slot's chain ends at its own length (keys past it are never read): a tile of slots
      // runs the keys all of them see together, then each slot alone runs the rest of its own
      const W* value_head = vp + kv * values.stride(0);
      for (int64_t c = 0; c < value_panels; ++c) {
        const W* panel = value_head + c * values.stride(1);
        for (int64_t k0 = 0; k0 < padded; k0 += kBlockK)
          value_tiles(probs.data(), padded, panel, k0, std::min(padded, k0 + kBlockK), lengths, count, acc.data());
        const int64_t cols = std::min(kPanel, d - c * kPanel);
        for (int64_t s = 0; s < count; ++s) {
          const int64_t row = (first + s) / group, head = kv * group + (first + s) % group;
          std::copy(acc.data() + s * kPanel, acc.data() + s * kPanel + cols, op + row * heads * d + head * d + c * kPanel);
        }
      }
    }
  });
  return out;
}

// The small per-layer steps of the exact forward on this kernel, each a fixed function of its own row
// (and, where it says, of its own element): one call each instead of several torch ops, so a 1-row
// decode step spends its time in the matmuls rather than in dispatch.

// A row's sum of squares: 8 lanes over whole blocks of 8, the lanes added in a fixed tree, then the
// tail in order. A function of the row alone.
inline float sum_of_squares(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) total = std::fma(x[i], x[i], total);
  return total;
}

// y = x / sqrt(mean(x^2) + eps) * w, row by row: x [rows, n] float32, w [n].
torch::Tensor rms_norm(const torch::Tensor& input, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(input.device().is_cpu() && weight.device().is_cpu(), "rms_norm: CPU tensors only");
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                  weight.numel() == input.size(1),
              "rms_norm: x [rows, n] and weight [n], float32");
  const auto x = input.contiguous();
  const auto w = weight.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  auto y = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * n;
      const float scale = 1.0f / std::sqrt(sum_of_squares(xr, n) / static_cast<float>(n) + feps);
      float* yr = yp + r * n;
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * scale) * wp[i];
    }
  });
  return y;
}

// Rotary position embedding of the q and k parts of a qkv projection [rows, (heads + 2 kv_heads) * d]
// with cos, sin [rows, d]: each element x[i] * cos[i] + (i < d/2 ? -x[i + d/2] : x[i - d/2]) * sin[i].
// -> q [rows, heads, d], k [rows, kv_heads, d] (new tensors); v stays where it is in qkv.
std::vector<torch::Tensor> rotary(const torch::Tensor& input, int64_t heads, int64_t kv_heads, const torch::Tensor& cos,
                                  const torch::Tensor& sin) {
  TORCH_CHECK(input.device().is_cpu() && cos.device().is_cpu() && sin.device().is_cpu(), "rotary: CPU tensors only");
  TORCH_CHECK(cos.dim() == 2 && sin.sizes() == cos.sizes() && cos.scalar_type() == torch::kFloat32 &&
                  sin.scalar_type() == torch::kFloat32 && cos.size(1) % 2 == 0,
              "rotary: cos and sin [rows, d] float32, d even");
  const int64_t rows = cos.size(0), d = cos.size(1), half = d / 2;
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == torch::kFloat32 && input.size(0) == rows &&
                  input.size(1) == (heads + 2 * kv_heads) * d,
              "rotary: qkv [rows, (heads + 2 kv_heads) * d] float32");
  const auto x = input.contiguous();
  const auto c = cos.contiguous();
  const auto sn = sin.contiguous();
  auto q = torch::empty({rows, heads, d}, x.options());
  auto k = torch::empty({rows, kv_heads, d}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* sp = sn.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kp = k.data_ptr<float>();
  const int64_t width = x.size(1);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* cr = cp + r * d;
      const float* sr = sp + r * d;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const float* xh = xp + r * width + h * d;
        float* out = h < heads ? qp + (r * heads + h) * d : kp + (r * kv_heads + h - heads) * d;
        for (int64_t i = 0; i < half; ++i) out[i] = xh[i] * cr[i] + (-xh[i + half]) * sr[i];
        for (int64_t i = half; i < d; ++i) out[i] = xh[i] * cr[i] + xh[i - half] * sr[i];
      }
    }
  });
  return {q, k};
}

// silu(gate) * up of a gate_up projection [rows, 2n] (gate first): each element from its own pair, with
// silu(g) = g / (1 + e^-g) on exp8 (the tail of a row through the same 8-lane code). -> [rows, n]
torch::Tensor silu_mul(const torch::Tensor& input) {
  TORCH_CHECK(input.device().is_cpu() && input.dim() == 2 && input.scalar_type() == torch::kFloat32 &&
                  input.size(1) % 2 == 0,
              "silu_mul: gate_up [rows, 2n] float32 on the CPU");
  const auto x = input.contiguous();
  const int64_t rows = x.size(0), n = x.size(1) / 2;
  auto y = torch::empty({rows, n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    alignas(32) float gate[8], up[8], out[8];
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t r = r0; r < r1; ++r) {
      const float* gr = xp + r * 2 * n;
      const float* ur = gr + n;
      float* yr = yp + r * n;
      const auto silu_times = [&](__m256 g, __m256 u) {
        return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)))), u);
      };
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(yr + i, silu_times(_mm256_loadu_ps(gr + i), _mm256_loadu_ps(ur + i)));
      if (i < n) {  // the tail through the same lanes
        const int64_t m = n - i;
        std::fill(gate, gate + 8, 0.0f);
        std::fill(up, up + 8, 0.0f);
        std::copy(gr + i, gr + i + m, gate);
        std::copy(ur + i, ur + i + m, up);
        _mm256_store_ps(out, silu_times(_mm256_load_ps(gate), _mm256_load_ps(up)));
        std::copy(out, out + m, yr + i);
      }
    }
  });
  return y;
}

// Keys and values of `rows` positions from `start` into one layer's panel-layout cache (kv.KVCache with
// panels): keys [kv_heads, panels, d, 32] take k [rows, kv_heads, d] transposed per panel of 32
// positions; values [kv_heads, value panels, positions, 32] take v (rows of qkv's v part) with zeros past d.
// A bf16 cache (T = at::BFloat16) takes them rounded to nearest even, as torch's .to(bfloat16).
template <typename T>
void write_kv_as(const torch::Tensor& k, const float* v, int64_t v_stride, torch::Tensor& keys, torch::Tensor& values,
                 int64_t start) {
  const int64_t rows = k.size(0), kv_heads = k.size(1), d = k.size(2);
  const float* kp = k.data_ptr<float>();
  T* keys_p = keys.data_ptr<T>();
  T* values_p = values.data_ptr<T>();
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t position = start + r, panel = position / kPanel, column = position % kPanel;
      T* key_panel = keys_p + h * keys.stride(0) + panel * keys.stride(1) + column;
      const float* kr = kp + (r * kv_heads + h) * d;
      for (int64_t i = 0; i < d; ++i) key_panel[i * kPanel] = static_cast<T>(kr[i]);
      const float* vr = v + r * v_stride + h * d;
      for (int64_t c = 0; c < values.size(1); ++c) {
        T* value_row = values_p + h * values.stride(0) + c * values.stride(1) + position * kPanel;
        for (int64_t j = 0; j < kPanel; ++j) value_row[j] = static_cast<T>(c * kPanel + j < d ? vr[c * kPanel + j] : 0.0f);
      }
    }
}

void write_kv(const torch::Tensor& k, const float* v, int64_t v_stride, torch::Tensor& keys, torch::Tensor& values,
              int64_t start) {
  const int64_t rows = k.size(0), kv_heads = k.size(1), d = k.size(2);
  TORCH_CHECK(start >= 0 && keys.size(0) == kv_heads && keys.size(2) == d && (start + rows + kPanel - 1) / kPanel <= keys.size(1) &&
                  start + rows <= values.size(2) && values.size(1) * kPanel >= d,
              "layer: the KV cache does not hold these positions");
  if (keys.scalar_type() == torch::kBFloat16)
    write_kv_as<at::BFloat16>(k, v, v_stride, keys, values, start);
  else
    write_kv_as<float>(k, v, v_stride, keys, values, start);
}

// One decoder layer of the exact forward (Llama-style: pre-norms, rotary, GQA, SiLU-gated MLP), the
// very calls, in the same order, that the runner makes one by one from Python: a fixed function of each
// row's own inputs, so the same bits, without ~25 Python-level operations a layer between the parallel
// calls (two threads, a 1-row step of SmolLM2-135M after 2,000 tokens: 22 -> 17 ms; one thread: no change). x [rows, hidden] sits at positions start ..; its keys and values
// are written into the layer's cache (keys, values: views of kv.KVCache's panels); rows [first, end)
// go on past attention (a prefill block needs none of the last layer's, its last block one).
// linears: (panels, out_features, bias or None) for qkv, out, gate_up, down. -> x [end - first, hidden]
// parents (a token tree, as attention takes it): the rows are its last nodes, written at start + nodes - rows ...
torch::Tensor layer(const torch::Tensor& x, const torch::Tensor& input_norm, const torch::Tensor& post_norm, double eps,
                    const std::vector<torch::Tensor>& panels, const std::vector<int64_t>& out_features,
                    const std::vector<c10::optional<torch::Tensor>>& biases, const torch::Tensor& cos,
                    const torch::Tensor& sin, int64_t heads, int64_t kv_heads, torch::Tensor keys, torch::Tensor values,
                    int64_t start, const torch::Tensor& lengths, double scale, int64_t first, int64_t end,
                    const c10::optional<torch::Tensor>& parents) {
  TORCH_CHECK(panels.size() == 4 && out_features.size() == 4 && biases.size() == 4, "layer: four Linears");
  const int64_t rows = x.size(0), d = cos.size(1);
  TORCH_CHECK(0 <= first && first <= end && end <= rows && lengths.size(0) == rows, "layer: rows out of range");
  TORCH_CHECK((keys.scalar_type() == torch::kFloat32 || keys.scalar_type() == torch::kBFloat16) &&
                  values.scalar_type() == keys.scalar_type() && keys.stride(3) == 1 && keys.stride(2) == kPanel &&
                  values.stride(3) == 1 && values.stride(2) == kPanel,
              "layer: keys and values in the panel layout, both float32 or both bfloat16");
  const auto qkv = linear(rms_norm(x, input_norm, eps), panels[0], out_features[0], biases[0]);
  const auto qk = rotary(qkv, heads, kv_heads, cos, sin);
  TORCH_CHECK(!parents.has_value() || (parents->dim() == 1 && parents->scalar_type() == torch::kInt64 &&
                                       parents->size(0) >= rows && first == 0 && end == rows),
              "layer: a token tree's parents [nodes >= rows] int64, and every row computed");
  const int64_t written = start + (parents.has_value() ? parents->size(0) - rows : 0);  // a tree's rows: its last nodes
  write_kv(qk[1], qkv.data_ptr<float>() + (heads + kv_heads) * d, qkv.size(1), keys, values, written);
  if (first == end) return x.narrow(0, 0, 0);
  const auto q = qk[0].narrow(0, first, end - first).contiguous();
  const auto attended = attention(q, keys, values, lengths.narrow(0, first, end - first), scale, parents, start);
  const auto h = x.narrow(0, first, end - first) + linear(attended, panels[1], out_features[1], biases[1]);
  const auto act = silu_mul(linear(rms_norm(h, post_norm, eps), panels[2], out_features[2], biases[2]));
  return h + linear(act, panels[3], out_features[3], biases[3]);
}

// Turns the 512-bit tiles on (where the CPU has AVX-512) or off: the Linears' verify tiles and
// attention's tiles (in every call, prefill included). The bits are the same either way: to compare
// the two, and for the tests that say so. -> whether they were on before (to restore).
bool set_wide_tiles(bool on) {
  return wide_tiles_on.exchange(on && __builtin_cpu_supports("avx512f"));
}

// Turns the bf16 dot mode on (where the CPU has AVX512-BF16) or off; -> whether it was on before.
// Every cache computed in the other mode is then stale: the caller starts from an empty cache.
bool set_bf16_dot(bool on) {
  const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return bf16_dot_on.exchange(on && cpu);
}

bool bf16_dot() { return bf16_dot_on.load(); }

// Turns AMX tiles for the bf16 dot mode on (where the CPU has AMX-BF16 and Linux grants its tile
// state) or off; -> whether they were on before. As with set_bf16_dot, caches of the other setting are stale.
bool set_amx(bool on) { return amx_on.exchange(on && amx_refusal().empty()); }

// Why AMX tiles cannot be used here ("" where they can).
std::string amx_unavailable() { return amx_refusal(); }

bool amx() { return amx_on.load(); }

// Both release the GIL while they compute, as torch's own ops do: the language server's event loop
// and other Python threads keep running while the model worker multiplies.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("set_wide_tiles", &set_wide_tiles, "512-bit tiles (verify blocks, attention) on (with AVX-512) or off");
  module.def("set_bf16_dot", &set_bf16_dot, "bf16 inputs and vdpbf16ps for bf16 panels (AVX512-BF16) on or off");
  module.def("bf16_dot", &bf16_dot, "whether the bf16 dot mode is on");
  module.def("set_amx", &set_amx, "AMX tiles for the bf16 dot mode (AMX-BF16) on or off");
  module.def("amx", &amx, "whether the bf16 dot mode multiplies on AMX tiles");
  module.def("amx_unavailable", &amx_unavailable, "why AMX tiles cannot be used here (empty where they can)");
  module.def("pack", &pack, "weight [N, K] -> panels [ceil(N / 32), K, 32]",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("pack_bf16", &pack_bf16, "weight [N, K] of bf16 values -> bfloat16 panels [ceil(N / 32), K, 32]",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("pack_amx", &pack_amx, "weight [N, K] of bf16 values -> panels in AMX tile order [ceil(N / 32), K / 32, 1024]",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("linear", &linear, "x [M, K] @ weight.T (+ bias), each output one fixed fma chain",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("rms_norm", &rms_norm, "x / sqrt(mean(x^2) + eps) * weight, row by row",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("rotary", &rotary, "rotary embedding of qkv's q and k parts -> (q, k)",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("silu_mul", &silu_mul, "silu(gate) * up of a gate_up projection",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("layer", &layer, "one decoder layer of the exact forward, writing its keys and values",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("attention", &attention, "causal attention over panel-layout keys and values, row-invariant",
             pybind11::call_guard<pybind11::gil_scoped_release>());
}
