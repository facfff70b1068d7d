// Register-tiled products for thin head dimensions, where BLAS runs well below its rate:
// measured on AMD Zen 3 (one thread, 64-row tiles against 1088 keys), MKL's sgemm reached 36-45
// GFLOP/s for products with a side of 16 against 68-75 for large squares, and those products
// are most of the kernel's work at head dims 16-32. Written once in ATen's Vectorized (simd.h):
// 8 lanes on AVX2, 16 on AVX-512.
//
// One micro-kernel does every product the attention needs:
//   C(m, 0:L*NV) = alpha * sum_k A(m, k) B(k, 0:L*NV)   (+ C(m, :) when accumulating)
// with L = simd::kLanes, A(m, k) = a[m * a_row + k * a_col] (so A may be read transposed), B's
// rows L*NV contiguous floats b + k * b_row, C's rows c + m * c_row. An MR x L*NV block of C
// stays in registers for the whole k loop: per k, NV loads of B and MR broadcasts of A feed
// MR * NV FMAs.
#pragma once

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace small_gemm {

using simd::kLanes;
using simd::Vec;

constexpr int64_t kPanel = 16;  // keys per panel of the scores' B (small_gemm::wide_product)

struct Operand {
  const float* data;
  int64_t row;  // step between rows of the product's operand
  int64_t col;  // step between columns (1 for B and C)
};

// Where each row of a product's A may be nonzero: row r in columns [lo[r], hi[r]), both
// nondecreasing in r (a sliding window's band).
struct Reach {
  const int64_t* lo;
  const int64_t* hi;
};

#if GRIDSHARD_SIMD

// Rows of C per register block for NV vectors of columns: MR * NV accumulators, NV vectors of B
// and a broadcast (6 x 16 on AVX2, as in BLAS's kernels). AVX-512's 32 registers would hold 14 x
// 32, but on AMD Zen 4 (512-bit FMAs issued as two 256-bit halves) blocks of 16 and 14 rows ran
// at 0.51 / 0.60 of the GEMM at head dims 16 / 32 and these 8 and 6 at 0.61 / 0.67 (12 / 10:
// 0.56 / 0.61; 4 / 4: 0.62 / 0.51), fwd+bwd, N = 16384: the same blocks for both widths.
#ifndef GRIDSHARD_ROWS_1  // -D overrides for tuning runs
#define GRIDSHARD_ROWS_1 8
#endif
#ifndef GRIDSHARD_ROWS_2
#define GRIDSHARD_ROWS_2 6
#endif
constexpr int rows_for(int nv) { return nv == 1 ? GRIDSHARD_ROWS_1 : GRIDSHARD_ROWS_2; }

template <int MR, int NV>
inline void block(const Operand& a, const Operand& b, int64_t depth, float* c, int64_t c_row, float alpha,
                  bool accumulate) {
  const int64_t a_row = a.row, a_col = a.col, b_row = b.row;  // in registers, not re-read each step
  const float* ak = a.data;
  const float* bk = b.data;
  Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = Vec(0.0f);
  for (int64_t k = 0; k < depth; ++k, ak += a_col, bk += b_row) {
    Vec bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = Vec::loadu(bk + kLanes * v);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const Vec am(ak[m * a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = at::vec::fmadd(am, bv[v], acc[m][v]);
    }
  }
  if (!accumulate && alpha == 1.0f) {
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v].store(c + m * c_row + kLanes * v);
    return;
  }
  const Vec scale(alpha);
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* out = c + m * c_row + kLanes * v;
      const Vec add = accumulate ? Vec::loadu(out) : Vec(0.0f);
      at::vec::fmadd(acc[m][v], scale, add).store(out);
    }
}

// The last rows (fewer than a block's MR): one block of exactly that many.
template <int NV, int R>
inline void tail(int rows, const Operand& a, const Operand& b, int64_t depth, float* c, int64_t c_row, float alpha,
                 bool accumulate) {
  if constexpr (R > 0) {
    if (rows == R) return block<R, NV>(a, b, depth, c, c_row, alpha, accumulate);
    tail<NV, R - 1>(rows, a, b, depth, c, c_row, alpha, accumulate);
  }
}

// A block of `rows` rows (MR of product NV's blocks, or fewer: the last rows).
template <int NV>
inline void rows_block(int rows, const Operand& a, const Operand& b, int64_t depth, float* c, int64_t c_row,
                       float alpha, bool accumulate) {
  constexpr int MR = rows_for(NV);
  if (rows == MR) return block<MR, NV>(a, b, depth, c, c_row, alpha, accumulate);
  tail<NV, MR - 1>(rows, a, b, depth, c, c_row, alpha, accumulate);
}

// C (m x n) += alpha A B where row r of A is zero outside columns [reach.lo[r], reach.hi[r]) (a
// band: both nondecreasing in r): each block of rows runs only the depth its rows reach, so a
// tile's corners outside the band cost nothing. The same sums as over the whole depth: the terms
// left out are exact zeros.
template <int NV>
void banded_product(int64_t m, const Operand& a, const Operand& b, const Reach& reach, float* c, int64_t c_row,
                    float alpha) {
  constexpr int MR = rows_for(NV);
  for (int64_t r = 0; r < m; r += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, m - r));
    const int64_t k0 = reach.lo[r], k1 = reach.hi[r + rows - 1];
    if (k0 >= k1) continue;
    rows_block<NV>(rows, {a.data + r * a.row + k0 * a.col, a.row, a.col}, {b.data + k0 * b.row, b.row, 1}, k1 - k0,
                   c + r * c_row, c_row, alpha, true);
  }
}

// banded_product for n (a multiple of L) columns: strips of 2L columns (one of L last).
inline void narrow_banded_product(int64_t m, int64_t n, const Operand& a, const Operand& b, const Reach& reach,
                                  float* c, int64_t c_row, float alpha) {
  int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    banded_product<2>(m, a, {b.data + j, b.row, 1}, reach, c + j, c_row, alpha);
  }
  if (j < n) banded_product<1>(m, a, {b.data + j, b.row, 1}, reach, c + j, c_row, alpha);
}

// C (m x n) = A B, n a multiple of kPanel, B in panels of kPanel columns (`panel` floats
// apart, each depth x kPanel, rows kPanel floats apart). Only the panels that a block's rows reach
// (row r: columns [lo[r], hi[r]), nondecreasing) are computed; the rest of C is left as it was.
// A block of rows sweeps its panels left to right, so it writes C's rows in sequence (a tile of
// scores is larger than L1: written panel by panel across all rows, every store met a new line).
inline void wide_product(int64_t m, int64_t n, const Operand& a, const float* b, int64_t panel, int64_t depth,
                         const Reach& reach, float* c, int64_t c_row) {
  constexpr int NV = kPanel / kLanes, MR = rows_for(NV);
  for (int64_t r = 0; r < m; r += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, m - r));
    const int64_t j0 = reach.lo[r] / kPanel * kPanel;
    const int64_t j1 = std::min(n, (reach.hi[r + rows - 1] + kPanel - 1) / kPanel * kPanel);
    for (int64_t j = j0; j < j1; j += kPanel) {
      rows_block<NV>(rows, {a.data + r * a.row, a.row, a.col}, {b + j / kPanel * panel, kPanel, 1}, depth,
                     c + r * c_row + j, c_row, 1.0f, false);
    }
  }
}

#endif

// The widest head dim the register-tiled products serve (measured against BLAS: AVX2 on Zen 3
// up to 32; AVX-512 on Zen 4 up to 64).
constexpr int64_t kMaxDim = kLanes == 16 ? 64 : 32;

// Whether the register-tiled products serve head dimension `dim` on this build.
inline bool serves(int64_t dim) { return GRIDSHARD_SIMD && dim % kLanes == 0 && dim >= kLanes && dim <= kMaxDim; }

}  // namespace small_gemm
