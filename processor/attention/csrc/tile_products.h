// The matrix products of one head's attention tiles: through the register-tiled kernels of
// small_gemm.h where they serve the head dim, else through BLAS (the sgemm_ libtorch exports:
// MKL in the x86 wheels).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "row_passes.h"
#include "small_gemm.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace tile_products {

using small_gemm::kPanel;

// Row-major C (m x n) = alpha op(A) op(B) + beta C, through column-major BLAS.
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  sgemm_(&tb, &ta, &mi, &ni, &ki, &alpha, b, &lb, a, &la, &beta, c, &lc);
}

// One head's rows: base pointer and the stride between points.
struct Rows {
  float* data;
  int64_t stride;
  float* row(int64_t i) const { return data + i * stride; }
};

// The keys' gradients of one head (the backward's outputs that its tiles add P^T B to).
enum class KeyGrad { dk, dv };
struct KeyGrads {
  Rows dk, dv;
};

// The products a head's tiles need. Where the register-tiled kernels of small_gemm.h serve this
// head dim, keys and values are first copied once per head into the layouts those read without
// striding through the (points, heads, dim) tensors: panels of kPanel (16) keys (dim x 16 each, zero
// past the last key) for the scores, and rows of dim floats; a tile then starts at a multiple of 16
// keys (the columns before its reach are masked like any other). Elsewhere BLAS.
class Products {
 public:
  // What each pass reads: forward S = Q K^T and P V; backward (`grads`, the head's dk and dv,
  // else null) also dP = dO V^T and dS K.
  Products(int64_t dim, int64_t n_k, const Rows& k, const Rows& v, const KeyGrads* grads)
      : dim_(dim), small_(small_gemm::serves(dim)), grads_(grads) {
    if (!small_) return;
    panels(k, n_k, &k_panels_);
    if (grads != nullptr) {
      panels(v, n_k, &v_panels_);
      rows(k, n_k, &k_rows_);
    } else {
      rows(v, n_k, &v_rows_);
    }
  }

  // The chunk's band: row r of the tile reaches the chunk's columns [first[r], last[r]) (both
  // nondecreasing; the arrays live until the next call). The register-tiled products then skip
  // what lies outside it: scores there are left unwritten (the caller masks them), and the
  // row passes write exact zeros there, which the products after them leave out.
  void band(int64_t rows, int64_t cols, const int64_t* first, const int64_t* last) {
    rows_reach_ = {first, last};
    if (grads_ == nullptr || !small_) return;
    keys_lo_.resize(cols);  // key j is reached by the rows [keys_lo_[j], keys_hi_[j])
    keys_hi_.resize(cols);
    int64_t lo = 0, hi = 0;
    for (int64_t j = 0; j < cols; ++j) {
      while (lo < rows && last[lo] <= j) ++lo;
      while (hi < rows && first[hi] <= j) ++hi;
      keys_lo_[j] = lo;
      keys_hi_[j] = std::max(lo, hi);
    }
  }

  // Whether the register-tiled products (small_gemm.h) serve this head dim, or BLAS.
  bool register_tiled() const { return small_; }

  // The first key column of a tile whose queries reach keys from `lo` on.
  int64_t first_column(int64_t lo) const { return small_ ? lo - lo % kPanel : lo; }

  // A tile's row stride for `cols` keys.
  int64_t stride(int64_t cols) const { return small_ ? (cols + kPanel - 1) / kPanel * kPanel : cols; }

  // s (rows x cols, row stride ld) = alpha A X(c0 .. c0 + cols)^T: A (rows x dim) against the
  // keys (X = k) or the values (X = v, `values`).
  void scores(int64_t rows, int64_t cols, float alpha, const float* a, int64_t a_stride, const Rows& x, bool values,
              int64_t c0, float* s, int64_t ld) {
#if GRIDSHARD_SIMD
    if (small_) {
      // A's rows, scaled, side by side: the products' broadcasts then read 64-byte lines in
      // sequence, not rows a (points, heads, dim) stride apart, and store without a multiply.
      a_tile_.resize(rows * dim_);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < dim_; ++d) a_tile_[r * dim_ + d] = alpha * a[r * a_stride + d];
      const float* panels = (values ? v_panels_ : k_panels_).data() + c0 * dim_;  // c0 % kPanel == 0
      return small_gemm::wide_product(rows, ld, {a_tile_.data(), dim_, 1}, panels, kPanel * dim_, dim_, rows_reach_,
                                      s, ld);
    }
#endif
    gemm(false, true, rows, cols, dim_, alpha, a, a_stride, x.row(c0), x.stride, 0.0f, s, ld);
  }

  // Forward: row r's probabilities 2^(s - top) in place, 0 outside its band (all 0 where top is
  // -inf: nothing allowed yet); returns their sum.
  float exponentiate(int64_t r, float* row, int64_t cols, float top) const {
    const auto [a, z] = live_band(r, cols, top == row_passes::kNegInf);
    zero_outside(row, cols, a, z);
    return a < z ? row_passes::exp2_and_sum(row + a, z - a, top) : 0.0f;
  }

  // Backward: P = 2^(S - shift) in p and dS = P (dP - delta) in ds, row by row (row stride ld);
  // 0 for a row whose shift is -inf (it reached no key).
  void probabilities_and_ds(int64_t rows, int64_t cols, float* p, float* ds, int64_t ld, const float* shift,
                            const float* delta) const {
    for (int64_t r = 0; r < rows; ++r) {
      float *pr = p + r * ld, *dr = ds + r * ld;
      const auto [a, z] = live_band(r, cols, shift[r] == row_passes::kNegInf);
      zero_outside(pr, cols, a, z);
      zero_outside(dr, cols, a, z);  // dP is not computed outside the band: dS must not read it
      row_passes::probabilities_and_ds(pr + a, dr + a, z - a, shift[r], delta[r]);
    }
  }

  // c (rows x dim) += alpha P X(c0 .. c0 + cols): P (rows x cols, row stride ld) times the keys
  // (X = k) or the values (`values`).
  void times_keys(int64_t rows, int64_t cols, float alpha, const float* p, int64_t ld, const Rows& x, bool values,
                  int64_t c0, float* c, int64_t c_stride) const {
#if GRIDSHARD_SIMD
    if (small_) {
      const float* b = (values ? v_rows_ : k_rows_).data() + c0 * dim_;
      return small_gemm::narrow_banded_product(rows, dim_, {p, ld, 1}, {b, dim_, 1}, rows_reach_, c, c_stride, alpha);
    }
#endif
    gemm(false, false, rows, dim_, cols, alpha, p, ld, x.row(c0), x.stride, 1.0f, c, c_stride);
  }

  // The keys' gradient `which` (rows c0 .. c0 + cols) += alpha P^T B: P (rows x cols, row
  // stride ld) transposed, times B (rows x dim: the tile's own rows of dO or q, stride b_stride).
  void add_key_grad(KeyGrad which, int64_t rows, int64_t cols, float alpha, const float* p, int64_t ld,
                    const float* b, int64_t b_stride, int64_t c0) {
    const Rows& target = which == KeyGrad::dk ? grads_->dk : grads_->dv;
    float* c = target.row(c0);
    const int64_t c_stride = target.stride;
#if GRIDSHARD_SIMD
    if (small_) {
      scratch_.resize(rows * dim_);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(&scratch_[r * dim_], b + r * b_stride, dim_ * sizeof(float));
      return small_gemm::narrow_banded_product(cols, dim_, {p, 1, ld}, {scratch_.data(), dim_, 1},
                                               {keys_lo_.data(), keys_hi_.data()}, c, c_stride, alpha);
    }
#endif
    gemm(true, false, cols, dim_, rows, alpha, p, ld, b, b_stride, 1.0f, c, c_stride);
  }

  void finish(int64_t) const {}  // the key gradients are written in place

 private:
  // Row r's band in the chunk, [a, z); empty (at cols) for a row that reached no key (`dead`).
  std::pair<int64_t, int64_t> live_band(int64_t r, int64_t cols, bool dead) const {
    const int64_t a = dead ? cols : rows_reach_.lo[r];
    return {a, std::max(a, rows_reach_.hi[r])};
  }

  // The row's columns outside [a, z) set to 0.
  static void zero_outside(float* row, int64_t cols, int64_t a, int64_t z) {
    std::fill(row, row + a, 0.0f);
    std::fill(row + z, row + cols, 0.0f);
  }

  void panels(const Rows& t, int64_t n, std::vector<float>* out) const {
    const int64_t strips = n / kPanel + 2;  // a tile's padded columns may run up to 2 kPanel - 1 past the last key
    out->assign(strips * kPanel * dim_, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      float* panel = out->data() + (j / kPanel) * kPanel * dim_ + j % kPanel;
      for (int64_t d = 0; d < dim_; ++d) panel[d * kPanel] = t.row(j)[d];
    }
  }

  void rows(const Rows& t, int64_t n, std::vector<float>* out) const {
    out->resize(n * dim_);
    for (int64_t j = 0; j < n; ++j) std::memcpy(out->data() + j * dim_, t.row(j), dim_ * sizeof(float));
  }

  int64_t dim_;
  bool small_;
  const KeyGrads* grads_;
  small_gemm::Reach rows_reach_{nullptr, nullptr};  // the chunk's band (band())
  std::vector<int64_t> keys_lo_, keys_hi_;           // and the rows that reach each of its keys
  std::vector<float> k_panels_, v_panels_, k_rows_, v_rows_, scratch_, a_tile_;
};

}  // namespace tile_products
