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
#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t kVectors = 4;              // AVX2 vectors of 8 floats per panel row
constexpr int64_t kPanel = kVectors * 8;     // output columns per panel
constexpr int64_t kBlockK = 128;             // k per block: a 128 x 32 panel block (16 KiB) stays in L1
constexpr int64_t kBlockRows = 3;            // rows per micro-kernel call: 3 x 4 accumulators

// Continue the chains of rows [0, R) x the panel's 32 columns over k in [k0, k1).
// acc holds the chains so far ([R][32]); it is ignored and the chains start at zero when first.
// Always inlined: out of line, GCC 12 kept the accumulators on the stack (2.7x slower at 128 rows).
template <int R>
__attribute__((always_inline)) inline void micro(const float* x, int64_t ldx, const float* panel, int64_t k0, int64_t k1, float* acc,
                  bool first) {
  __m256 sum[R][kVectors];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVectors; ++v)
      sum[r][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * kPanel + v * 8);
  for (int64_t k = k0; k < k1; ++k) {
    __m256 w[kVectors];
    for (int v = 0; v < kVectors; ++v) w[v] = _mm256_loadu_ps(panel + k * kPanel + v * 8);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      for (int v = 0; v < kVectors; ++v) sum[r][v] = _mm256_fmadd_ps(xv, w[v], sum[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVectors; ++v) _mm256_storeu_ps(acc + r * kPanel + v * 8, sum[r][v]);
}

}  // namespace

// weight [N, K] -> panels [ceil(N / 32), K, 32]: panel p, row k holds w[32p .. 32p + 31][k] (zero past N).
torch::Tensor pack(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32, "pack: a 2-D float32 weight");
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

// x [M, K] float32; panels [>= ceil(n / 32), K, 32] as pack() makes them, rows of a panel contiguous;
// n the weight's rows; bias [n] or None.
torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& panels, int64_t n,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == torch::kFloat32, "linear: a 2-D float32 input");
  TORCH_CHECK(panels.dim() == 3 && panels.size(1) == input.size(1) && panels.size(2) == kPanel &&
                  panels.stride(2) == 1 && panels.stride(1) == kPanel && panels.size(0) * kPanel >= n,
              "linear: panels do not fit the input");
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() &&
                                    bias->numel() == n),
              "linear: the bias must be a contiguous float32 vector of the output size");
  const auto x = input.contiguous();
  // panels may sit apart (a slice of a longer cache): panel p starts p * stride floats in
  const int64_t m = x.size(0), k = x.size(1), count = (n + kPanel - 1) / kPanel, stride = panels.stride(0);
  auto y = torch::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = panels.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, count, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> acc(((m + kBlockRows - 1) / kBlockRows) * kBlockRows * kPanel);
    for (int64_t p = p0; p < p1; ++p) {
      const float* panel = wp + p * stride;
      for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
        const int64_t k1 = std::min(k, k0 + kBlockK);
        for (int64_t row = 0; row < m; row += kBlockRows) {
          const float* xr = xp + row * k;
          float* ar = acc.data() + row * kPanel;
          switch (std::min(kBlockRows, m - row)) {
            case 3: micro<3>(xr, k, panel, k0, k1, ar, k0 == 0); break;
            case 2: micro<2>(xr, k, panel, k0, k1, ar, k0 == 0); break;
            default: micro<1>(xr, k, panel, k0, k1, ar, k0 == 0); break;
          }
        }
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

// Both release the GIL while they compute, as torch's own ops do: the language server's event loop
// and other Python threads keep running while the model worker multiplies.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("pack", &pack, "weight [N, K] -> panels [ceil(N / 32), K, 32]",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("linear", &linear, "x [M, K] @ weight.T (+ bias), each output one fixed fma chain",
             pybind11::call_guard<pybind11::gil_scoped_release>());
}
