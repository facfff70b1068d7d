// The bfloat16 operands of bf16_products.h: float32 rows rounded to bfloat16 (to nearest even,
// NaN kept), written in the layouts oneDNN's BRGeMM reads, and the row passes of the softmax
// that write their probabilities and dS straight in them. The arithmetic is float32 throughout
// (row_passes.h's exp2); only what goes into a product is rounded.
//
// Layouts (uint16_t holds a bfloat16's bits; a uint32_t, a pair of them):
//   rows:  A operands, row-major, zero past the chunk's keys up to a multiple of kBlock;
//   pairs: B operands, two rows side by side ([K/2][N][2]), in blocks of kBlock columns
//          ([N / kBlock][K / 2][kBlock] pairs): the VNNI layout with oneDNN's leading dimension.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "row_passes.h"
#include "simd.h"
#include "tile_products.h"

namespace bf16_rows {

constexpr int64_t kBlock = 64;  // columns per block of a pairs operand (oneDNN's widest)

inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// float -> bfloat16 bits, to nearest even; NaN stays NaN (branch-free: loops vectorise).
inline uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// dst[j] = alpha x[j] for j < n, 0 for n <= j < padded.
inline void convert(const float* x, int64_t n, int64_t padded, float alpha, uint16_t* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = to_bf16(alpha * x[j]);
  std::fill(dst + n, dst + padded, uint16_t{0});
}

inline uint32_t pair(float low, float high) { return to_bf16(low) | static_cast<uint32_t>(to_bf16(high)) << 16; }

// The float a bfloat16's bits stand for.
inline float value(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &word, sizeof(x));
  return x;
}

#if GRIDSHARD_SIMD
using simd::IntVec;
using simd::kLanes;
using simd::Vec;

#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
// AVX512-BF16 rounds 32 floats to bfloat16 in one instruction (to nearest even, NaN kept; it
// also flushes subnormals, below 1e-38, to zero). The other builds spell the same in integers.
inline IntVec pairs(Vec low, Vec high) {
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low));  // low's 16, then high's
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return IntVec(_mm512_permutexvar_epi16(interleave, both));
}

inline void store_row(Vec a, Vec b, uint16_t* dst) {
  _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
}
#else
// kLanes pairs: lane i holds bfloat16(low[i]) in its low half, bfloat16(high[i]) in its high.
inline IntVec pairs(Vec low, Vec high) {
  const IntVec lo = at::vec::cast<int32_t>(low), hi = at::vec::cast<int32_t>(high);
  const IntVec one(1), sixteen(16), bias(0x7fff), quiet(0x400040);
  const IntVec lo_rounded = ((lo + bias + ((lo >> sixteen) & one)) >> sixteen) & IntVec(0xffff);
  const IntVec hi_rounded = (hi + bias + ((hi >> sixteen) & one)) & IntVec(static_cast<int32_t>(0xffff0000u));
  const IntVec lo_nan = ((lo >> sixteen) | quiet) & IntVec(0xffff);
  const IntVec hi_nan = (hi | quiet) & IntVec(static_cast<int32_t>(0xffff0000u));
  const Vec lo_word = Vec::blendv(at::vec::cast<float>(lo_rounded), at::vec::cast<float>(lo_nan), low.isnan());
  const Vec hi_word = Vec::blendv(at::vec::cast<float>(hi_rounded), at::vec::cast<float>(hi_nan), high.isnan());
  return at::vec::cast<int32_t>(lo_word) | at::vec::cast<int32_t>(hi_word);
}

// 2 kLanes consecutive values as bfloat16 (ATen's conversion: to nearest even, NaN kept).
inline void store_row(Vec a, Vec b, uint16_t* dst) {
  at::vec::convert_float_bfloat16(a, b).store(reinterpret_cast<c10::BFloat16*>(dst));
}
#endif
#endif

// Forward: out[j] = 2^(x[j] - top) in bfloat16 for j < cols, 0 up to `padded`; returns the sum of
// the float32 values.
inline float exp2_and_sum(const float* x, int64_t cols, int64_t padded, float top, uint16_t* out) {
  float sum = 0.0f;
  int64_t j = 0;
#if GRIDSHARD_SIMD
  const Vec shift(top);
  Vec acc(0.0f);
  for (; j + 2 * kLanes <= cols; j += 2 * kLanes) {
    const Vec p0 = row_passes::exp2(Vec::loadu(x + j) - shift);
    const Vec p1 = row_passes::exp2(Vec::loadu(x + j + kLanes) - shift);
    acc = acc + p0 + p1;
    store_row(p0, p1, out + j);
  }
  sum = at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return a + b; }, acc);
#endif
  for (; j < cols; ++j) {
    const float p = row_passes::exp2(x[j] - top);
    sum += p;
    out[j] = to_bf16(p);
  }
  std::fill(out + cols, out + padded, uint16_t{0});
  return sum;
}

// One query's backward row: its log2 scores s, dP, and P's shift (-inf: it reached no key) and D.
struct BackwardRow {
  const float* s;
  const float* dp;
  float shift, delta;
};

// Where a pair of rows' P and dS go: the pairs operands at this pair's first block (blocks
// `block_stride` pairs apart), and dS as two rows.
struct BackwardOut {
  uint32_t* p_pairs;
  uint32_t* ds_pairs;
  uint16_t* ds_row0;
  uint16_t* ds_row1;
  int64_t block_stride;
};

// Backward, two rows at once: P = 2^(s - shift), dS = P (dP - delta), for the `cols` keys of the
// chunk (0 after them, up to `padded`).
inline void backward_pair(const BackwardRow& r0, const BackwardRow& r1, int64_t cols, int64_t padded,
                          const BackwardOut& out) {
  const bool live0 = r0.shift != row_passes::kNegInf, live1 = r1.shift != row_passes::kNegInf;
  auto slot = [&](int64_t j) { return j / kBlock * out.block_stride + j % kBlock; };
  int64_t j = 0;
#if GRIDSHARD_SIMD
  const Vec zero(0.0f), shift0(r0.shift), shift1(r1.shift), delta0(r0.delta), delta1(r1.delta);
  for (; j + 2 * kLanes <= cols; j += 2 * kLanes) {  // kBlock is a multiple of 2 kLanes: one block
    Vec p[2][2], ds[2][2];
    for (int h = 0; h < 2; ++h) {
      const int64_t at = j + h * kLanes;
      p[0][h] = live0 ? row_passes::exp2(Vec::loadu(r0.s + at) - shift0) : zero;
      p[1][h] = live1 ? row_passes::exp2(Vec::loadu(r1.s + at) - shift1) : zero;
      ds[0][h] = live0 ? p[0][h] * (Vec::loadu(r0.dp + at) - delta0) : zero;  // exactly 0: dP may be NaN
      ds[1][h] = live1 ? p[1][h] * (Vec::loadu(r1.dp + at) - delta1) : zero;
      pairs(p[0][h], p[1][h]).store(out.p_pairs + slot(at));
      pairs(ds[0][h], ds[1][h]).store(out.ds_pairs + slot(at));
    }
    store_row(ds[0][0], ds[0][1], out.ds_row0 + j);
    store_row(ds[1][0], ds[1][1], out.ds_row1 + j);
  }
#endif
  for (; j < padded; ++j) {
    const bool in = j < cols;
    const float p0 = in && live0 ? row_passes::exp2(r0.s[j] - r0.shift) : 0.0f;
    const float p1 = in && live1 ? row_passes::exp2(r1.s[j] - r1.shift) : 0.0f;
    const float ds0 = in && live0 ? p0 * (r0.dp[j] - r0.delta) : 0.0f;
    const float ds1 = in && live1 ? p1 * (r1.dp[j] - r1.delta) : 0.0f;
    out.p_pairs[slot(j)] = pair(p0, p1);
    out.ds_pairs[slot(j)] = pair(ds0, ds1);
    out.ds_row0[j] = to_bf16(ds0);
    out.ds_row1[j] = to_bf16(ds1);
  }
}

// t^T (dim x n) in blocks of kBlock keys, each [dim / 2][kBlock] pairs: a pair is two adjacent
// dims of one key. 0 past the last key.
inline void transposed_blocks(const tile_products::Rows& t, int64_t n, int64_t dim, int64_t n_pad,
                              std::vector<uint32_t>* out) {
  out->assign(n_pad * dim / 2, 0u);
  for (int64_t j = 0; j < n; ++j) {
    uint32_t* column = out->data() + (j / kBlock) * kBlock * dim / 2 + j % kBlock;
    const float* x = t.row(j);
    for (int64_t d = 0; d < dim / 2; ++d) column[d * kBlock] = pair(x[2 * d], x[2 * d + 1]);  // one block: in cache
  }
}

// t (n x dim) in key pairs, in blocks of kBlock head dims, each [n_pad / 2][width] pairs; 0 past
// the last key.
inline void key_pairs(const tile_products::Rows& t, int64_t n, int64_t dim, int64_t n_pad,
                      std::vector<uint32_t>* out) {
  out->assign(n_pad * dim / 2, 0u);
  for (int64_t d0 = 0; d0 < dim; d0 += kBlock) {
    const int64_t width = std::min(kBlock, dim - d0);
    uint32_t* block = out->data() + d0 * n_pad / 2;
    for (int64_t j = 0; j < n; j += 2) {
      const float *x0 = t.row(j) + d0, *x1 = j + 1 < n ? t.row(j + 1) + d0 : nullptr;
      uint32_t* dst = block + (j / 2) * width;
      for (int64_t d = 0; d < width; ++d) dst[d] = pair(x0[d], x1 == nullptr ? 0.0f : x1[d]);
    }
  }
}

// Key j's value at head dim d, as key_pairs stored it.
inline float key_value(const std::vector<uint32_t>& pairs, int64_t n_pad, int64_t dim, int64_t j, int64_t d) {
  const int64_t d0 = d - d % kBlock, width = std::min(kBlock, dim - d0);
  const uint32_t word = pairs[d0 * n_pad / 2 + (j / 2) * width + (d - d0)];
  return value(static_cast<uint16_t>(j % 2 == 0 ? word & 0xffffu : word >> 16));
}

// The transposed accumulator t (dim x n_pad) into rows (n x dim), kBlock keys at a time (both
// sides then stay in cache).
inline void write_transposed(const std::vector<float>& t, int64_t n, int64_t dim, int64_t n_pad,
                             const tile_products::Rows& rows) {
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t j1 = std::min(n, j0 + kBlock);
    for (int64_t d = 0; d < dim; ++d) {
      const float* column = t.data() + d * n_pad;
      for (int64_t j = j0; j < j1; ++j) rows.row(j)[d] = column[j];
    }
  }
}

}  // namespace bf16_rows
