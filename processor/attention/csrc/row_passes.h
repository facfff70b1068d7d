// The element-wise passes over a tile's score rows, in base 2: the kernel scales its scores by
// log2(e) inside the product, so each probability is one exp2 (no range reduction by ln 2) and
// the forward's exp and sum, like the backward's exp and dS, are one pass over the row.
//
// exp2 here: t = n + f with n = round(t), f in [-0.5, 0.5]; 2^f by Cephes' exp2f polynomial
// (degree 6, about 1 ulp); 2^n added to the exponent bits. Below -126 (the smallest normal, and
// -inf: a masked key) the result is exactly 0; NaN stays NaN (a diverged run must show it).
// Where simd.h has vectors (AVX2, AVX-512) these passes use them; elsewhere the same arithmetic
// in loops the compiler vectorises.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "simd.h"

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

#if GRIDSHARD_SIMD
inline simd::Vec exp2(simd::Vec t) {
  using simd::Vec;
  // t + 1.5 * 2^23 rounds t to the nearest integer n (ties to even, as nearbyint), held in the low
  // bits of the sum's mantissa: one add for what took a round and a conversion.
  const Vec shifter(12582912.0f);
  const Vec y = t + shifter;
  const Vec f = t - (y - shifter);
  Vec p(kExp2[0]);
#pragma GCC unroll 6
  for (int i = 1; i < 7; ++i) p = at::vec::fmadd(p, f, Vec(kExp2[i]));
  const simd::IntVec exponent = simd::shift_left<23>(at::vec::cast<int32_t>(y));  // n in the exponent field
  p = at::vec::cast<float>(at::vec::cast<int32_t>(p) + exponent);
  return Vec::blendv(p, Vec(0.0f), t < Vec(kLowest));  // 0 below; NaN (unordered) kept
}
#endif

// max(x[0 .. n)), -inf for none, NaN for a row of -inf and NaN (four independent chains: the
// compiler's vectorised max reduction, which keeps NaN semantics, cost as much as the exp pass).
inline float row_max(const float* x, int64_t n) {
  float top = kNegInf;
  int64_t j = 0;
#if GRIDSHARD_SIMD
  using simd::kLanes;
  using simd::Vec;
  Vec m0(kNegInf), m1 = m0, m2 = m0, m3 = m0;  // clamp_min is the plain max instruction
  for (; j + 4 * kLanes <= n; j += 4 * kLanes) {
    m0 = at::vec::clamp_min(Vec::loadu(x + j), m0);
    m1 = at::vec::clamp_min(Vec::loadu(x + j + kLanes), m1);
    m2 = at::vec::clamp_min(Vec::loadu(x + j + 2 * kLanes), m2);
    m3 = at::vec::clamp_min(Vec::loadu(x + j + 3 * kLanes), m3);
  }
  float lanes[kLanes];
  at::vec::clamp_min(at::vec::clamp_min(m0, m1), at::vec::clamp_min(m2, m3)).store(lanes);
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
#if GRIDSHARD_SIMD
  using simd::kLanes;
  using simd::Vec;
  const Vec s(shift);
  Vec acc0(0.0f), acc1(0.0f);
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    const Vec p0 = exp2(Vec::loadu(x + j) - s);
    const Vec p1 = exp2(Vec::loadu(x + j + kLanes) - s);
    p0.store(x + j);
    p1.store(x + j + kLanes);
    acc0 = acc0 + p0;
    acc1 = acc1 + p1;
  }
  sum = at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return a + b; }, acc0 + acc1);
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
#if GRIDSHARD_SIMD
  using simd::kLanes;
  using simd::Vec;
  const Vec s(shift), d(delta);
  for (; j + kLanes <= n; j += kLanes) {
    const Vec pj = exp2(Vec::loadu(p + j) - s);
    pj.store(p + j);
    (pj * (Vec::loadu(ds + j) - d)).store(ds + j);
  }
#endif
#pragma omp simd
  for (int64_t i = j; i < n; ++i) {
    p[i] = exp2(p[i] - shift);
    ds[i] = p[i] * (ds[i] - delta);
  }
}

}  // namespace row_passes
