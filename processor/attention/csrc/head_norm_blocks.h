// LayerNorm over head vectors of 16 values, sixteen vectors at a time (AVX-512 only).
//
// One head vector of 16 floats is one AVX-512 register, and a row at a time its mean and
// variance are horizontal sums: a chain of shuffles that each row waits on (about 50 cycles a
// vector on a Zen 5). Sixteen vectors' sums at once take a transposing tree of 45 shuffles and
// adds (sums16), after which lane j holds vector j's sum: every statistic of the block is one
// register, and the per-vector work is vertical.
//
// Included by head_norm.cpp where __AVX512F__ is defined; the arithmetic is the row code's
// (two passes: the mean, then the centred squares), so the two agree to float32 rounding.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace head_blocks {

constexpr int64_t kBlock = 16;  // vectors a block, and values a vector

// Lane j: the sum of v[j]'s 16 values.
inline __m512 sums16(const __m512 (&v)[kBlock]) {
  __m512 pairs[8], quads[4], octets[2];
  for (int k = 0; k < 8; ++k) {  // per 128-bit lane: v[2k]'s and v[2k+1]'s, two partial sums each
    pairs[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  }
  for (int k = 0; k < 4; ++k) {  // per 128-bit lane: four vectors' partial sums, in order
    const __m512d a = _mm512_castps_pd(pairs[2 * k]), b = _mm512_castps_pd(pairs[2 * k + 1]);
    quads[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int k = 0; k < 2; ++k) {  // 128-bit lanes 0+1 and 2+3 of two groups of four
    octets[k] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * k], quads[2 * k + 1], 0x88),
                              _mm512_shuffle_f32x4(quads[2 * k], quads[2 * k + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(octets[0], octets[1], 0x88),
                       _mm512_shuffle_f32x4(octets[0], octets[1], 0xDD));
}

// (x - mean) * rstd of one vector.
inline __m512 normed(const float* x, float mean, float rstd) {
  return _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x), _mm512_set1_ps(mean)), _mm512_set1_ps(rstd));
}

// out[j] = norm(x[j]) for 16 vectors (x[j], out[j]: 16 floats each); mean[0..15], rstd[0..15].
inline void norm_block(const float* const (&x)[kBlock], float* const (&out)[kBlock], const float* weight,
                       const float* bias, float eps, float* mean, float* rstd) {
  const __m512 inv_d = _mm512_set1_ps(1.f / kBlock);
  __m512 v[kBlock];
  for (int j = 0; j < kBlock; ++j) v[j] = _mm512_loadu_ps(x[j]);
  const __m512 mu = _mm512_mul_ps(sums16(v), inv_d);
  _mm512_storeu_ps(mean, mu);
  for (int j = 0; j < kBlock; ++j) {
    const __m512 c = _mm512_sub_ps(_mm512_loadu_ps(x[j]), _mm512_set1_ps(mean[j]));
    v[j] = _mm512_mul_ps(c, c);
  }
  const __m512 var = _mm512_mul_ps(sums16(v), inv_d);
  _mm512_storeu_ps(rstd, _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_sqrt_ps(_mm512_add_ps(var, _mm512_set1_ps(eps)))));
  const __m512 w = _mm512_loadu_ps(weight), b = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int j = 0; j < kBlock; ++j) {
    _mm512_storeu_ps(out[j], _mm512_fmadd_ps(normed(x[j], mean[j], rstd[j]), w, b));
  }
}

// LayerNorm's backward for 16 vectors: dx[j] from dy[j] and x[j] (mean[j], rstd[j] of the
// forward); the weight's and bias's gradients added into *dweight, *dbias (registers).
inline void norm_block_backward(const float* const (&dy)[kBlock], const float* const (&x)[kBlock], const float* mean,
                                const float* rstd, const float* weight, float* const (&dx)[kBlock], __m512* dweight,
                                __m512* dbias) {
  const __m512 w = _mm512_loadu_ps(weight), inv_d = _mm512_set1_ps(1.f / kBlock);
  __m512 g[kBlock], gx[kBlock];
  for (int j = 0; j < kBlock; ++j) {
    const __m512 d = _mm512_loadu_ps(dy[j]);
    const __m512 xhat = normed(x[j], mean[j], rstd[j]);
    g[j] = _mm512_mul_ps(d, w);
    gx[j] = _mm512_mul_ps(g[j], xhat);
    *dweight = _mm512_fmadd_ps(d, xhat, *dweight);
    *dbias = _mm512_add_ps(*dbias, d);
  }
  alignas(64) float g_mean[kBlock], gx_mean[kBlock];
  _mm512_store_ps(g_mean, _mm512_mul_ps(sums16(g), inv_d));
  _mm512_store_ps(gx_mean, _mm512_mul_ps(sums16(gx), inv_d));
  for (int j = 0; j < kBlock; ++j) {
    const __m512 xhat = normed(x[j], mean[j], rstd[j]);
    const __m512 centred = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(dy[j]), w), _mm512_set1_ps(g_mean[j]));
    const __m512 both = _mm512_fnmadd_ps(xhat, _mm512_set1_ps(gx_mean[j]), centred);  // g - g_mean - xhat * gx_mean
    _mm512_storeu_ps(dx[j], _mm512_mul_ps(_mm512_set1_ps(rstd[j]), both));
  }
}

}  // namespace head_blocks
