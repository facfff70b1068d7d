// Register-tiled products for thin head dimensions (AVX2 + FMA), where BLAS runs at half its
// rate: measured here (one thread, 64-row tiles against 1088 keys), MKL's sgemm reached 36-45
// GFLOP/s for products with a side of 16 against 68-75 for large squares, and those products
// are most of the kernel's work at head dims 16-32.
//
// One micro-kernel does every product the attention needs:
//   C(m, 0:8NV) = alpha * sum_k A(m, k) B(k, 0:8NV)   (+ C(m, :) when accumulating)
// with A(m, k) = a[m * a_row + k * a_col] (so A may be read transposed), B's rows 8NV contiguous
// floats b + k * b_row, C's rows c + m * c_row. An MR x 8NV block of C stays in registers for
// the whole k loop: per k, NV loads of B and MR broadcasts of A feed MR * NV FMAs.
#pragma once

#include <cstdint>

// Built for AVX2 machines only: where the compiler targets AVX-512, MKL's sgemm runs 16-wide and
// these 8-wide kernels are not measured against it; the kernel keeps BLAS there.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define GRIDSHARD_SMALL_GEMM 1
#else
#define GRIDSHARD_SMALL_GEMM 0
#endif

namespace small_gemm {

struct Operand {
  const float* data;
  int64_t row;  // step between rows of the product's operand
  int64_t col;  // step between columns (1 for B and C)
};

#if GRIDSHARD_SMALL_GEMM

// Rows of C per register block for NV vectors of 8 columns: MR * NV accumulators, NV vectors of
// B and one broadcast within the 16 ymm registers (6 x 16 as in BLAS's AVX2 kernels).
constexpr int rows_for(int nv) { return nv == 1 ? 8 : 6; }

template <int MR, int NV>
inline void block(const Operand& a, const Operand& b, int64_t depth, float* c, int64_t c_row, float alpha,
                  bool accumulate) {
  const int64_t a_row = a.row, a_col = a.col, b_row = b.row;  // in registers, not re-read each step
  const float* ak = a.data;
  const float* bk = b.data;
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < depth; ++k, ak += a_col, bk += b_row) {
    __m256 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(bk + 8 * v);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256 am = _mm256_broadcast_ss(ak + m * a_row);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_fmadd_ps(am, bv[v], acc[m][v]);
    }
  }
  const __m256 scale = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* out = c + m * c_row + 8 * v;
      const __m256 add = accumulate ? _mm256_loadu_ps(out) : _mm256_setzero_ps();
      _mm256_storeu_ps(out, _mm256_fmadd_ps(acc[m][v], scale, add));
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

// C (m x 8NV) = alpha A B (+ C): every row, MR at a time.
template <int NV>
void product(int64_t m, const Operand& a, const Operand& b, int64_t depth, float* c, int64_t c_row, float alpha,
             bool accumulate) {
  constexpr int MR = rows_for(NV);
  int64_t r = 0;
  for (; r + MR <= m; r += MR) {
    block<MR, NV>({a.data + r * a.row, a.row, a.col}, b, depth, c + r * c_row, c_row, alpha, accumulate);
  }
  tail<NV, MR - 1>(static_cast<int>(m - r), {a.data + r * a.row, a.row, a.col}, b, depth, c + r * c_row, c_row, alpha,
                   accumulate);
}

// C (m x n) = alpha A B (+ C) for n a multiple of 8: strips of 16 columns (one of 8 last).
inline void narrow_product(int64_t m, int64_t n, const Operand& a, const Operand& b, int64_t depth, float* c,
                           int64_t c_row, float alpha, bool accumulate) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) product<2>(m, a, {b.data + j, b.row, 1}, depth, c + j, c_row, alpha, accumulate);
  if (j < n) product<1>(m, a, {b.data + j, b.row, 1}, depth, c + j, c_row, alpha, accumulate);
}

// C (m x n) = alpha A B, n a multiple of 16, B in panels of 16 columns (`panel` floats apart, each
// depth x 16, rows 16 floats apart); A (a tile of queries, d wide) stays in L1 across the panels.
inline void wide_product(int64_t m, int64_t n, const Operand& a, const float* b, int64_t panel, int64_t depth, float* c,
                         int64_t c_row, float alpha) {
  for (int64_t j = 0; j < n; j += 16, b += panel) product<2>(m, a, {b, 16, 1}, depth, c + j, c_row, alpha, false);
}

#endif

// Whether the register-tiled products serve head dimension `dim` on this build.
inline bool serves(int64_t dim) { return GRIDSHARD_SMALL_GEMM && dim % 8 == 0 && dim >= 8 && dim <= 32; }

}  // namespace small_gemm
