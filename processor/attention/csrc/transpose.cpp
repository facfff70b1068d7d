// A contiguous float32 matrix (rows, cols) -> its transpose (cols, rows), contiguous, in tiles of
// 16 x 16 through ATen's vectorised tile transpose (at::vec::transpose_mxn: in registers at the
// build's vector width), each task a band of rows.
//
// What for: oneDNN's linear reads its operands contiguous, so a weight gradient, grad^T x, first
// has both operands copied transposed (processor/matmul/backends.py); torch's copy of a
// transposed view of a (points, 64) matrix ran at 4-10 GB/s on a Zen 5, several percent of a
// training step.

#include "simd.h"  // first: it sets the vector width ATen's headers are read with

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "transpose.h"

namespace {

constexpr int64_t kTile = 16;

// rows r0 .. r1 of src (rows, cols) into columns r0 .. r1 of dst (cols, rows)
void transpose_band(const float* src, float* dst, int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
    const int64_t n = std::min(kTile, cols - c0);
    for (int64_t i = r0; i < r1; i += kTile) {
      const int64_t m = std::min(kTile, r1 - i);
      const float* from = src + i * cols + c0;
      float* to = dst + c0 * rows + i;
      if (m == kTile && n == kTile) {
        at::vec::transpose_mxn<float, kTile, kTile>(from, cols, to, rows);
      } else {  // a ragged edge: masked tiles on AVX-512, a plain loop elsewhere
        at::vec::transpose_mxn<float>(from, cols, to, rows, static_cast<int>(m), static_cast<int>(n));
      }
    }
  }
}

at::Tensor transpose(const at::Tensor& src) {
  TORCH_CHECK(src.device().is_cpu() && src.scalar_type() == at::kFloat && src.dim() == 2 && src.is_contiguous(),
              "transpose: a contiguous float32 matrix on the CPU");
  const int64_t rows = src.size(0), cols = src.size(1);
  auto dst = at::empty({cols, rows}, src.options());
  const float* from = src.data_ptr<float>();
  float* to = dst.data_ptr<float>();
  // bands of whole tiles, a few thousand values each, so that a small matrix still splits
  const int64_t band_rows = kTile * std::max<int64_t>(1, 4096 / (kTile * std::max<int64_t>(cols, 1)));
  at::parallel_for(0, (rows + band_rows - 1) / band_rows, 1, [&](int64_t begin, int64_t end) {
    transpose_band(from, to, rows, cols, begin * band_rows, std::min(rows, end * band_rows));
  });
  return dst;
}

}  // namespace

void bind_transpose(pybind11::module& m) {
  m.def("transpose", &transpose, "a contiguous float32 matrix (rows, cols) -> its transpose (cols, rows), contiguous",
        pybind11::arg("src"));
}
