// The products of one head's attention tiles in bfloat16 with float32 accumulation, through
// oneDNN's BRGeMM micro-kernel as libtorch exports it (at::native::cpublas::brgemm, the one
// torch's own CPU flash attention calls). oneDNN picks the instructions at run time: AMX tiles
// where the host has them, AVX512-BF16 dot products, else AVX-512 conversions; a host without
// AVX-512 has no such kernel (`available()` says so) and keeps the float32 products.
//
// Only the products' operands are bfloat16: scores, probabilities, dS and every accumulator (the
// output, dq, dk, dv) stay float32, and the softmax is computed in float32 as before.
//
// oneDNN reads B in its "VNNI" layout: rows in pairs, each pair's two values side by side
// ([K/2][N][2]), with a leading dimension (N's block) of 16, 32, 48 or 64 columns, the widths its
// packing writes. So, per head, once: the keys and values transposed in blocks of 64 keys (B of
// the scores, S = Q K^T and dP = dO V^T) and in key pairs (B of P V and dS K, blocks of 64 of the
// head dim). Per chunk, the row passes write the probabilities and dS straight in bfloat16, in
// the layouts their products read (P and dS as A; P and dS in row pairs as B of dV^T += dO^T P
// and dK^T += Q^T dS, which accumulate transposed per head and are written out at the end: a
// transposed A would cost a transpose per chunk), so nothing is converted twice.
#pragma once

#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "bf16_rows.h"
#include "row_passes.h"
#include "tile_products.h"

namespace bf16_products {

using bf16_rows::round_up;
using tile_products::KeyGrad;
using tile_products::KeyGrads;
using tile_products::Rows;

constexpr int64_t kBlock = bf16_rows::kBlock;

// Whether oneDNN runs bfloat16 BRGeMM here (torch raises where it has no kernel for this host),
// probed once per process.
inline bool available() {
  static const bool runs = []() {
    try {
      const c10::BFloat16 a[2] = {1.0f, 1.0f}, b[32] = {};
      float c[16];
      at::native::cpublas::brgemm(1, 16, 2, 2, 16, 16, false, a, b, c, true);
      at::native::cpublas::brgemm_release(true);
      return true;
    } catch (const std::exception&) {  // c10::Error
      return false;
    }
  }();
  return runs;
}

// C (m x n, row stride ldc) (+)= A (m x k, row stride lda) B (VNNI pairs, leading dim ldb).
inline void brgemm(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, bool accumulate,
                   const uint16_t* a, const void* b, float* c) {
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, reinterpret_cast<const c10::BFloat16*>(a),
                              static_cast<const c10::BFloat16*>(b), c, true);
}

// The calls of tile_products::Products, in bfloat16, for head dims that are multiples of 16.
// A chunk starts with scores() (which sets its width); the probabilities and dS come from this
// class's own row passes, so times_keys and add_key_grad read the bfloat16 copies those wrote
// (values: P, keys: dS; dv: P, dk: dS), not the float32 rows they are also handed.
class Products {
 public:
  static bool serves(int64_t dim) { return dim % 16 == 0; }

  Products(int64_t dim, int64_t n_k, const Rows& k, const Rows& v, const KeyGrads* grads)
      : dim_(dim), n_pad_(round_up(n_k, kBlock)), grads_(grads) {
    bf16_rows::transposed_blocks(k, n_k, dim_, n_pad_, &k_blocks_);
    if (grads != nullptr) {
      bf16_rows::transposed_blocks(v, n_k, dim_, n_pad_, &v_blocks_);
      bf16_rows::key_pairs(k, n_k, dim_, n_pad_, &k_pairs_);
      dk_t_.assign(dim_ * n_pad_, 0.0f);
      dv_t_.assign(dim_ * n_pad_, 0.0f);
    } else {
      bf16_rows::key_pairs(v, n_k, dim_, n_pad_, &v_pairs_);
    }
  }
  ~Products() { at::native::cpublas::brgemm_release(true); }  // AMX: hand the tile registers back
  Products(const Products&) = delete;
  Products& operator=(const Products&) = delete;

  void band(int64_t, int64_t, const int64_t*, const int64_t*) {}  // every product runs the whole tile
  bool register_tiled() const { return false; }                    // oneDNN's BRGeMM

  int64_t first_column(int64_t lo) const { return lo - lo % kBlock; }
  int64_t stride(int64_t cols) const { return round_up(cols, kBlock); }

  // s (rows x stride(cols), row stride ld) = alpha A X(c0 ..)^T: A (rows x dim) against the keys
  // or values.
  void scores(int64_t rows, int64_t cols, float alpha, const float* a, int64_t a_stride, const Rows&, bool values,
              int64_t c0, float* s, int64_t ld) {
    cols_ = cols;
    depth_ = stride(cols);
    p_.resize(rows * depth_);
    a_.resize(rows * dim_);
    for (int64_t r = 0; r < rows; ++r) bf16_rows::convert(a + r * a_stride, dim_, dim_, alpha, &a_[r * dim_]);
    const uint32_t* blocks = (values ? v_blocks_ : k_blocks_).data() + c0 * dim_ / 2;  // c0 % kBlock == 0
    for (int64_t j = 0; j < depth_; j += kBlock) {  // columns past `cols` are computed, never read
      brgemm(rows, kBlock, dim_, dim_, kBlock, ld, false, a_.data(), blocks + j * dim_ / 2, s + j);
    }
  }

  // Forward: row r's probabilities 2^(s - top) in bfloat16 (0 past the chunk's keys, and all 0
  // where top is -inf); returns their sum in float32.
  float exponentiate(int64_t r, const float* row, int64_t cols, float top) {
    uint16_t* out = &p_[r * depth_];
    if (top == row_passes::kNegInf) {
      std::fill(out, out + depth_, uint16_t{0});
      return 0.0f;
    }
    return bf16_rows::exp2_and_sum(row, cols, depth_, top, out);
  }

  // Backward: P = 2^(S - shift) and dS = P (dP - delta) in bfloat16, as rows (dS) and row pairs
  // (P, dS), from the float32 S in p and dP in ds.
  void probabilities_and_ds(int64_t rows, int64_t cols, const float* p, const float* ds, int64_t ld,
                            const float* shift, const float* delta) {
    const int64_t pairs = round_up(rows, 2) / 2;
    p_pairs_.resize(pairs * depth_);
    ds_pairs_.resize(pairs * depth_);
    ds_rows_.resize(2 * pairs * depth_);
    for (int64_t r = 0; r < rows; r += 2) {
      const int64_t second = std::min(r + 1, rows - 1);  // an odd last row pairs with zeros
      const bf16_rows::BackwardRow row0{p + r * ld, ds + r * ld, shift[r], delta[r]};
      const float shift1 = second == r ? row_passes::kNegInf : shift[second];
      const bf16_rows::BackwardRow row1{p + second * ld, ds + second * ld, shift1, delta[second]};
      const bf16_rows::BackwardOut out{&p_pairs_[r / 2 * kBlock], &ds_pairs_[r / 2 * kBlock], &ds_rows_[r * depth_],
                                       &ds_rows_[(r + 1) * depth_], pairs * kBlock};
      bf16_rows::backward_pair(row0, row1, cols, depth_, out);
    }
  }

  // c (rows x dim) += alpha P V (values) or alpha dS K (keys), from this chunk's row passes.
  void times_keys(int64_t rows, int64_t, float alpha, const float*, int64_t, const Rows&, bool values, int64_t c0,
                  float* c, int64_t c_stride) {
    const uint16_t* a = (values ? p_ : ds_rows_).data();
    const std::vector<uint32_t>& pairs = values ? v_pairs_ : k_pairs_;
    const bool scaled = alpha != 1.0f;  // BRGeMM has no alpha: into a scratch, then scaled in
    if (scaled) scratch_.assign(rows * dim_, 0.0f);
    float* target = scaled ? scratch_.data() : c;
    const int64_t target_stride = scaled ? dim_ : c_stride;
    // Exactly the chunk's keys (a key past them may hold a NaN that a zero of P must not see):
    // their pairs through BRGeMM, an odd last key on its own.
    const int64_t even = cols_ - cols_ % 2;
    for (int64_t d0 = 0; d0 < dim_ && even > 0; d0 += kBlock) {
      const int64_t width = std::min(kBlock, dim_ - d0);
      brgemm(rows, width, even, depth_, width, target_stride, true, a,
             pairs.data() + d0 * n_pad_ / 2 + c0 / 2 * width, target + d0);
    }
    if (even < cols_) {
      for (int64_t d = 0; d < dim_; ++d) {
        const float x = bf16_rows::key_value(pairs, n_pad_, dim_, c0 + even, d);
        for (int64_t r = 0; r < rows; ++r) target[r * target_stride + d] += bf16_rows::value(a[r * depth_ + even]) * x;
      }
    }
    if (!scaled) return;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < dim_; ++d) c[r * c_stride + d] += alpha * scratch_[r * dim_ + d];
  }

  // The keys' gradient `which` += alpha P^T B (dv: P, dk: dS), B (rows x dim: the tile's rows of
  // dO or q): accumulated transposed, alpha B^T P, and written out by finish().
  void add_key_grad(KeyGrad which, int64_t rows, int64_t, float alpha, const float*, int64_t, const float* b,
                    int64_t b_stride, int64_t c0) {
    const int64_t depth = round_up(rows, 2);
    a_.assign(dim_ * depth, 0);  // alpha B^T: dim x depth
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < dim_; ++d) a_[d * depth + r] = bf16_rows::to_bf16(alpha * b[r * b_stride + d]);
    const uint32_t* pairs = (which == KeyGrad::dk ? ds_pairs_ : p_pairs_).data();
    float* out = (which == KeyGrad::dk ? dk_t_ : dv_t_).data() + c0;
    for (int64_t j = 0; j < cols_; j += kBlock) {  // exactly the chunk's keys: B^T may hold a NaN
      const int64_t n = std::min(kBlock, cols_ - j);
      const uint32_t* block = pairs + j / kBlock * (depth / 2) * kBlock;
      brgemm(dim_, n, depth, depth, kBlock, n_pad_, true, a_.data(), block, out + j);
    }
  }

  // Writes the transposed key gradients into the head's dk and dv rows.
  void finish(int64_t n_k) const {
    bf16_rows::write_transposed(dk_t_, n_k, dim_, n_pad_, grads_->dk);
    bf16_rows::write_transposed(dv_t_, n_k, dim_, n_pad_, grads_->dv);
  }

 private:
  int64_t dim_, n_pad_, cols_ = 0, depth_ = 0;  // the chunk's keys, and padded to kBlock
  const KeyGrads* grads_;
  std::vector<uint16_t> a_, p_, ds_rows_;
  std::vector<uint32_t> k_blocks_, v_blocks_, k_pairs_, v_pairs_, p_pairs_, ds_pairs_;
  std::vector<float> dk_t_, dv_t_, scratch_;
};

}  // namespace bf16_products
