// The element-wise passes over a tile's score rows, in base 2: the kernel scales its scores by
// log2(e) inside the product, so each probability is one exp2 (no range reduction by ln 2) and
// the forward's exp and sum, like the backward's exp and dS, are one pass over the row.
//
// exp2 here: t = n + f with n = round(t), f in [-0.5, 0.5]; 2^f by Cephes' exp2f polynomial
// (degree 6, about 1 ulp); 2^n added to the exponent bits. Below -126 (the smallest normal, and
// -inf: a masked key) the result is exactly 0; NaN stays NaN (a diverged run must show it).
// Where small_gemm.h builds its AVX2 kernels these passes are AVX2 too; elsewhere the same
// arithmetic in loops the compiler vectorises.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "small_gemm.h"  // GRIDSHARD_SMALL_GEMM, <immintrin.h>

namespace row_passes {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLowest = -126.0f;  // exp2 below this is 0
constexpr float kExp2[7] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                            5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f, 1.0f};

inline float exp2(float t) {
  const float n = std::isnan(t) ? 0.0f : std::nearbyint(std::max(t, kLowest - 1.0f));  // -inf has no integer
  const float f = t - n;
  float p = kExp2[0];
  for (int i = 1; i < 7; ++i) p = p * f + kExp2[i];
  uint32_t bits;
  std::memcpy(&bits, &p, sizeof(bits));
  bits += static_cast<uint32_t>(static_cast<int32_t>(n)) << 23;
  std::memcpy(&p, &bits, sizeof(p));
  return t < kLowest ? 0.0f : p;
}

#if GRIDSHARD_SMALL_GEMM
inline __m256 exp2(__m256 t) {
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  __m256 p = _mm256_set1_ps(kExp2[0]);
#pragma GCC unroll 6
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2[i]));
  const __m256i exponent = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  p = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), exponent));
  return _mm256_and_ps(p, _mm256_cmp_ps(t, _mm256_set1_ps(kLowest), _CMP_NLT_UQ));  // 0 below; NaN kept
}

inline float lane_sum(__m256 x) {
  float lanes[8];
  _mm256_storeu_ps(lanes, x);
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}
#endif

// max(x[0 .. n)), -inf for none, NaN for a row of -inf and NaN (four independent chains: the
// compiler's vectorised max reduction, which keeps NaN semantics, cost as much as the exp pass).
inline float row_max(const float* x, int64_t n) {
  float top = kNegInf;
  int64_t j = 0;
#if GRIDSHARD_SMALL_GEMM
  __m256 m0 = _mm256_set1_ps(kNegInf), m1 = m0, m2 = m0, m3 = m0;
  for (; j + 32 <= n; j += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + j + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + j + 24));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  for (float lane : lanes) top = std::max(top, lane);
#endif
#pragma omp simd reduction(max : top)
  for (int64_t i = j; i < n; ++i) top = std::max(top, x[i]);
  if (top == kNegInf) {  // the max passes drop NaNs: a row of them must not read as masked
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(x[i])) return x[i];
  }
  return top;
}

// Forward: x[j] = 2^(x[j] - shift) in place; returns their sum.
inline float exp2_and_sum(float* x, int64_t n, float shift) {
  float sum = 0.0f;
  int64_t j = 0;
#if GRIDSHARD_SMALL_GEMM
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  for (; j + 16 <= n; j += 16) {
    const __m256 p0 = exp2(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    const __m256 p1 = exp2(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), s));
    _mm256_storeu_ps(x + j, p0);
    _mm256_storeu_ps(x + j + 8, p1);
    acc0 = _mm256_add_ps(acc0, p0);
    acc1 = _mm256_add_ps(acc1, p1);
  }
  sum = lane_sum(_mm256_add_ps(acc0, acc1));
#endif
#pragma omp simd
  for (int64_t i = j; i < n; ++i) x[i] = exp2(x[i] - shift);
  for (int64_t i = j; i < n; ++i) sum += x[i];
  return sum;
}

// Backward: p[j] = 2^(p[j] - shift) (the probabilities, from the log2 scores), and
// ds[j] = p[j] (ds[j] - delta) (dS from dP), both in place.
inline void probabilities_and_ds(float* p, float* ds, int64_t n, float shift, float delta) {
  int64_t j = 0;
#if GRIDSHARD_SMALL_GEMM
  const __m256 s = _mm256_set1_ps(shift), d = _mm256_set1_ps(delta);
  for (; j + 8 <= n; j += 8) {
    const __m256 pj = exp2(_mm256_sub_ps(_mm256_loadu_ps(p + j), s));
    _mm256_storeu_ps(p + j, pj);
    _mm256_storeu_ps(ds + j, _mm256_mul_ps(pj, _mm256_sub_ps(_mm256_loadu_ps(ds + j), d)));
  }
#endif
#pragma omp simd
  for (int64_t i = j; i < n; ++i) {
    p[i] = exp2(p[i] - shift);
    ds[i] = p[i] * (ds[i] - delta);
  }
}

}  // namespace row_passes
