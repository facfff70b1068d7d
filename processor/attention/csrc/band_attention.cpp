// Fused sliding-window ("band") attention for the CPU, forward and backward.
//
// Query i sits at key position p = q_offset + i and attends to keys j with |p - j| <= window
// (and, with segment ids, ids[j] == ids[p], or == q_ids[i] when the queries' ids are given: the
// ring's blocks, whose queries lie outside the keys). Each (batch, head) is one task of at::parallel_for
// (PyTorch's thread budget); inside it, tiles of queries (tile_rows) go against exactly the keys
// their band reaches, in chunks of at most kChunkCols keys with an online softmax, their
// products through tile_products.h (float32: register-tiled for thin heads, else BLAS) or, when
// the call asks (`bf16`), bf16_products.h (bfloat16 operands, float32 accumulation, oneDNN's
// BRGeMM), the softmax in float32 and base 2 (lse is returned in natural units). The backward
// recomputes the probabilities from the saved log-sum-exp (P = exp(S - lse), dS = P (dP - D),
// D = rowsum(dO O)): no N x W tensor is ever kept. Tasks own their heads' dq, dk and dv rows,
// so nothing is reduced across threads.
//
// Tensors are (batch, heads, points, head_dim) with any strides whose last dimension is
// contiguous (the point-major layout the processor uses); float32 is computed in place,
// other dtypes through float32 copies. Outputs: (out, lse) forward, (dq, dk, dv) backward,
// with q's (k's) strides. A query that reaches no key gets out = 0 and lse = -inf.

#include "simd.h"  // first: it sets the vector width ATen's headers are read with

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "bf16_products.h"
#include "edge_attention.h"
#include "head_norm.h"
#include "row_passes.h"
#include "tile_products.h"
#include "transpose.h"

namespace {

using tile_products::KeyGrad;
using tile_products::KeyGrads;
using tile_products::Rows;

// Tile sizes (-D overrides them for tuning runs; measured: 32, 48 and 64 rows alike, 96 and 128
// slower; chunks of 256 to 2048 keys alike). Once the register-tiled products skipped the band's
// corners, their tiles of 48 rows (whole blocks of their 6 and 8 rows) ran 1.04x / 1.07x tiles of
// 64 at head dims 16 / 32 on AMD Zen 3 (fwd+bwd, N = 40320, W = 512, one thread); BLAS's (head
// dim 64 there) ran 0.94x, so tiles through BLAS and the bf16 products keep 64.
#ifndef GRIDSHARD_TILE_ROWS
#define GRIDSHARD_TILE_ROWS 64
#endif
#ifndef GRIDSHARD_TILED_ROWS
#define GRIDSHARD_TILED_ROWS 48
#endif
#ifndef GRIDSHARD_CHUNK_COLS
#define GRIDSHARD_CHUNK_COLS 2048
#endif
constexpr int64_t kTileRows = GRIDSHARD_TILE_ROWS;
constexpr int64_t kTiledRows = GRIDSHARD_TILED_ROWS;
constexpr int64_t kChunkCols = GRIDSHARD_CHUNK_COLS;
static_assert(kChunkCols % bf16_products::kBlock == 0, "chunks start at a block of the bf16 products' (and a panel)");
using row_passes::kNegInf;
constexpr float kLog2e = 1.44269504088896341f;  // scores are computed in base 2 (row_passes.h)
constexpr float kLn2 = 0.693147180559945309f;

Rows head_rows(const at::Tensor& t, int64_t b, int64_t h) {
  return {t.data_ptr<float>() + b * t.stride(0) + h * t.stride(1), t.stride(2)};
}

struct Geometry {
  int64_t n_q, n_k, dim, window, q_offset;
  float scale;
  const int64_t* ids;    // (n_k,) keys' segment ids of this batch element, or nullptr
  const int64_t* q_ids;  // (n_q,) queries' ids, or nullptr: query i has the id of key q_offset + i
};

// Keys [lo, hi) that query position p may see (before segment ids).
inline void reach(const Geometry& g, int64_t p, int64_t* lo, int64_t* hi) {
  *lo = std::max<int64_t>(0, p - g.window);
  *hi = std::min<int64_t>(g.n_k, p + g.window + 1);
}

// scores (rows x cols, row stride ld) of queries q0.. against keys c0.., in base 2:
// log2(e) scale Q K^T, -inf where not allowed. Returns, per row, the allowed column range in
// `first`/`last` (empty: first == last), and hands it to `products` first (Products::band): a
// tile's corners outside the band are then not computed.
template <class Products>
void masked_scores(const Geometry& g, Products& products, const Rows& q, const Rows& k, int64_t q0, int64_t rows,
                   int64_t c0, int64_t cols, int64_t ld, float* s, int64_t* first, int64_t* last) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t lo, hi;
    reach(g, g.q_offset + q0 + r, &lo, &hi);
    const int64_t a = std::clamp<int64_t>(lo - c0, 0, cols), z = std::clamp<int64_t>(hi - c0, 0, cols);
    first[r] = a;
    last[r] = std::max(a, z);
  }
  products.band(rows, cols, first, last);
  products.scores(rows, cols, g.scale * kLog2e, q.row(q0), q.stride, k, false, c0, s, ld);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = g.q_offset + q0 + r, a = first[r], z = last[r];
    float* row = s + r * ld;
    for (int64_t j = 0; j < a; ++j) row[j] = kNegInf;
    for (int64_t j = z; j < cols; ++j) row[j] = kNegInf;
    if (g.ids != nullptr && a < z) {
      const int64_t own = g.q_ids != nullptr ? g.q_ids[q0 + r] : g.ids[p];
      const int64_t* ids = g.ids + c0;
      for (int64_t j = a; j < z; ++j) row[j] = ids[j] == own ? row[j] : kNegInf;
    }
  }
}

// Keys [k_lo, k_hi) that some query of the tile q0 .. q0 + rows reaches (k_lo where `products`
// wants its tiles to start).
template <class Products>
void tile_reach(const Geometry& g, const Products& products, int64_t q0, int64_t rows, int64_t* k_lo, int64_t* k_hi) {
  int64_t lo, unused;
  reach(g, g.q_offset + q0, &lo, &unused);
  reach(g, g.q_offset + q0 + rows - 1, &unused, k_hi);
  *k_lo = std::min(products.first_column(lo), *k_hi);
}

// Query rows a tile: fewer where the register-tiled products serve the head dim (see above).
template <class Products>
int64_t tile_rows(const Products& products) {
  return products.register_tiled() ? kTiledRows : kTileRows;
}

template <class Products>
void forward_head(const Geometry& g, const Rows& q, const Rows& k, const Rows& v, const Rows& out, float* lse) {
  Products products(g.dim, g.n_k, k, v, nullptr);
  const int64_t tile = tile_rows(products);
  std::vector<float> s(tile * products.stride(kChunkCols)), acc(tile * g.dim), m(tile), l(tile);
  std::vector<int64_t> first(tile), last(tile);
  for (int64_t q0 = 0; q0 < g.n_q; q0 += tile) {
    const int64_t rows = std::min(tile, g.n_q - q0);
    int64_t k_lo, k_hi;
    tile_reach(g, products, q0, rows, &k_lo, &k_hi);
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), 0.0f);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t c0 = k_lo; c0 < k_hi; c0 += kChunkCols) {
      const int64_t cols = std::min(kChunkCols, k_hi - c0), ld = products.stride(cols);
      masked_scores(g, products, q, k, q0, rows, c0, cols, ld, s.data(), first.data(), last.data());
      for (int64_t r = 0; r < rows; ++r) {
        float* row = s.data() + r * ld;
        const float top = std::max(row_passes::row_max(row + first[r], last[r] - first[r]), m[r]);  // NaN kept
        const float sum = products.exponentiate(r, row, cols, top);  // 0 outside the allowed keys (-inf)
        if (top == kNegInf) continue;  // nothing allowed yet: this chunk adds nothing for the row
        const float alpha = m[r] == kNegInf ? 0.0f : std::exp2(m[r] - top);
        l[r] = l[r] * alpha + sum;
        m[r] = top;
        float* a = acc.data() + r * g.dim;
        for (int64_t d = 0; d < g.dim; ++d) a[d] *= alpha;
      }
      products.times_keys(rows, cols, 1.0f, s.data(), ld, v, true, c0, acc.data(), g.dim);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* o = out.row(q0 + r);
      const float* a = acc.data() + r * g.dim;
      const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];  // l is NaN after a NaN score: kept
      for (int64_t d = 0; d < g.dim; ++d) o[d] = a[d] * inv;
      lse[q0 + r] = l[r] == 0.0f ? kNegInf : (m[r] + std::log2(l[r])) * kLn2;
    }
  }
}

template <class Products>
void backward_head(const Geometry& g, const Rows& q, const Rows& k, const Rows& v, const Rows& out, const Rows& dout,
                   const float* lse, const Rows& dq, const KeyGrads& key_grads) {
  Products products(g.dim, g.n_k, k, v, &key_grads);
  const int64_t tile = tile_rows(products), size = tile * products.stride(kChunkCols);
  std::vector<float> p(size), dp(size), delta(tile), shift(tile);
  std::vector<int64_t> first(tile), last(tile);
  for (int64_t q0 = 0; q0 < g.n_q; q0 += tile) {
    const int64_t rows = std::min(tile, g.n_q - q0);
    for (int64_t r = 0; r < rows; ++r) {  // D = rowsum(dO * O)
      const float *o = out.row(q0 + r), *d_o = dout.row(q0 + r);
      float sum = 0.0f;
      for (int64_t d = 0; d < g.dim; ++d) sum += o[d] * d_o[d];
      delta[r] = sum;
      shift[r] = lse[q0 + r] * kLog2e;  // P = 2^(S - shift): S is in base 2
    }
    int64_t k_lo, k_hi;
    tile_reach(g, products, q0, rows, &k_lo, &k_hi);
    for (int64_t c0 = k_lo; c0 < k_hi; c0 += kChunkCols) {
      const int64_t cols = std::min(kChunkCols, k_hi - c0), ld = products.stride(cols);
      masked_scores(g, products, q, k, q0, rows, c0, cols, ld, p.data(), first.data(), last.data());
      products.scores(rows, cols, 1.0f, dout.row(q0), dout.stride, v, true, c0, dp.data(), ld);  // dP = dO V^T
      products.probabilities_and_ds(rows, cols, p.data(), dp.data(), ld, shift.data(), delta.data());
      // dV += P^T dO;  dQ += scale dS K;  dK += scale dS^T Q
      products.add_key_grad(KeyGrad::dv, rows, cols, 1.0f, p.data(), ld, dout.row(q0), dout.stride, c0);
      products.times_keys(rows, cols, g.scale, dp.data(), ld, k, false, c0, dq.row(q0), dq.stride);
      products.add_key_grad(KeyGrad::dk, rows, cols, g.scale, dp.data(), ld, q.row(q0), q.stride, c0);
    }
  }
  products.finish(g.n_k);
}

void check_ids(const c10::optional<at::Tensor>& ids, int64_t batch, int64_t n, const char* what) {
  if (!ids.has_value()) return;
  TORCH_CHECK(ids->dim() == 2 && ids->size(1) == n && ids->scalar_type() == at::kLong && ids->is_contiguous(),
              "band attention: ", what, " must be contiguous int64 (rows, ", n, ")");
  TORCH_CHECK(ids->size(0) == 1 || ids->size(0) == batch, "band attention: ", what, " rows must be 1 or batch");
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& ids,
                  const c10::optional<at::Tensor>& q_ids) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "band attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "band attention: q, k, v must be 4-D");
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
              "band attention: q, k, v shapes do not match");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "band attention: float32 tensors (the Python side converts others)");
  for (const auto* t : {&q, &k, &v}) TORCH_CHECK(t->stride(3) == 1, "band attention: head_dim must be contiguous");
  check_ids(ids, q.size(0), k.size(2), "segment ids");
  check_ids(q_ids, q.size(0), q.size(2), "query segment ids");
  TORCH_CHECK(!q_ids.has_value() || ids.has_value(), "band attention: query ids need the keys' ids");
}

const int64_t* id_row(const c10::optional<at::Tensor>& ids, int64_t b) {
  if (!ids.has_value()) return nullptr;
  return ids->data_ptr<int64_t>() + (ids->size(0) == 1 ? 0 : b) * ids->size(1);
}

Geometry geometry(const at::Tensor& q, const at::Tensor& k, int64_t window, int64_t q_offset, double scale,
                  const c10::optional<at::Tensor>& ids, const c10::optional<at::Tensor>& q_ids, int64_t b) {
  return {q.size(2), k.size(2), q.size(3), window, q_offset, static_cast<float>(scale), id_row(ids, b), id_row(q_ids, b)};
}

// Whether this call's products run in bfloat16 (asked for, and served: see bf16_products.h).
bool bf16_products_for(bool asked, int64_t dim) {
  const bool available = bf16_products::available();  // probed on the first call, asked or not
  TORCH_CHECK(!asked || available, "band attention: bfloat16 products need oneDNN's BRGeMM (AVX-512 hosts)");
  return asked && bf16_products::Products::serves(dim);
}

// Why oneDNN refused the bfloat16 products in this process ("" while it has not).
struct Refusal {
  std::atomic<bool> refused{false};  // reason is set: read without the lock on every call
  std::mutex mutex;
  std::string reason;
};
Refusal& bf16_refusal() {
  static Refusal refusal;
  return refusal;
}

// pass(bf16) with bfloat16 products where asked and served; should oneDNN refuse one of their
// shapes (on a host this kernel was not tested on), the same pass again with float32 products,
// and float32 products for the rest of the process (the Python side warns with the reason). A
// pass makes its own outputs.
template <class Pass>
std::vector<at::Tensor> with_products(bool asked, int64_t dim, const Pass& pass) {
  if (!bf16_products_for(asked, dim) || bf16_refusal().refused) return pass(false);
  try {
    return pass(true);
  } catch (const std::exception& error) {
    const auto* torch_error = dynamic_cast<const c10::Error*>(&error);
    std::lock_guard<std::mutex> lock(bf16_refusal().mutex);
    bf16_refusal().reason = torch_error != nullptr ? torch_error->what_without_backtrace() : error.what();
    bf16_refusal().refused = true;
  }
  return pass(false);
}

std::vector<at::Tensor> band_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                     int64_t q_offset, double scale, const c10::optional<at::Tensor>& ids,
                                     const c10::optional<at::Tensor>& q_ids, bool bf16) {
  check_inputs(q, k, v, ids, q_ids);
  return with_products(bf16, q.size(3), [&](bool in_bf16) -> std::vector<at::Tensor> {
    auto out = at::empty_like(q);
    auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
    const int64_t heads = q.size(1);
    at::parallel_for(0, q.size(0) * heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / heads, h = task % heads;
        const Geometry g = geometry(q, k, window, q_offset, scale, ids, q_ids, b);
        float* lse_row = lse.data_ptr<float>() + (b * heads + h) * q.size(2);
        const Rows qh = head_rows(q, b, h), kh = head_rows(k, b, h), vh = head_rows(v, b, h), oh = head_rows(out, b, h);
        if (in_bf16) {
          forward_head<bf16_products::Products>(g, qh, kh, vh, oh, lse_row);
        } else {
          forward_head<tile_products::Products>(g, qh, kh, vh, oh, lse_row);
        }
      }
    });
    return {out, lse};
  });
}

std::vector<at::Tensor> band_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                      int64_t window, int64_t q_offset, double scale,
                                      const c10::optional<at::Tensor>& ids, const c10::optional<at::Tensor>& q_ids,
                                      bool bf16) {
  check_inputs(q, k, v, ids, q_ids);
  TORCH_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes() && dout.stride(3) == 1 && out.stride(3) == 1 &&
                  dout.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "band attention backward: grad and out must be float32 like q, head_dim contiguous");
  auto lse_c = lse.contiguous();
  TORCH_CHECK(lse_c.scalar_type() == at::kFloat && lse_c.numel() == q.size(0) * q.size(1) * q.size(2),
              "band attention backward: lse must be float32 (batch, heads, n_q)");
  return with_products(bf16, q.size(3), [&](bool in_bf16) -> std::vector<at::Tensor> {
    auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    const int64_t heads = q.size(1);
    at::parallel_for(0, q.size(0) * heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / heads, h = task % heads;
        const Geometry g = geometry(q, k, window, q_offset, scale, ids, q_ids, b);
        const float* lse_row = lse_c.data_ptr<float>() + (b * heads + h) * q.size(2);
        const Rows qh = head_rows(q, b, h), kh = head_rows(k, b, h), vh = head_rows(v, b, h), oh = head_rows(out, b, h);
        const Rows dq_h = head_rows(dq, b, h), dout_h = head_rows(dout, b, h);
        const KeyGrads key_grads{head_rows(dk, b, h), head_rows(dv, b, h)};
        if (in_bf16) {
          backward_head<bf16_products::Products>(g, qh, kh, vh, oh, dout_h, lse_row, dq_h, key_grads);
        } else {
          backward_head<tile_products::Products>(g, qh, kh, vh, oh, dout_h, lse_row, dq_h, key_grads);
        }
      }
    });
    return {dq, dk, dv};
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using pybind11::arg;
  m.def("forward", &band_forward, "band attention forward: (out, lse)", arg("q"), arg("k"), arg("v"), arg("window"),
        arg("q_offset"), arg("scale"), arg("ids"), arg("q_ids"), arg("bf16") = false);
  m.def("backward", &band_backward, "band attention backward: (dq, dk, dv)", arg("dout"), arg("q"), arg("k"),
        arg("v"), arg("out"), arg("lse"), arg("window"), arg("q_offset"), arg("scale"), arg("ids"), arg("q_ids"),
        arg("bf16") = false);
  m.def("isa", []() { return std::string(GRIDSHARD_ISA); }, "the vector instructions this build's micro-kernels use");
  m.def("serves", &small_gemm::serves, "whether the register-tiled products serve this head dim");
  m.def("bf16_products", &bf16_products::available, "whether oneDNN runs the bfloat16 products on this host");
  m.def("bf16_serves", &bf16_products::Products::serves, "whether the bfloat16 products serve this head dim");
  m.def(
      "bf16_refusal",
      []() {
        std::lock_guard<std::mutex> lock(bf16_refusal().mutex);
        return bf16_refusal().reason;
      },
      "why oneDNN refused the bfloat16 products in this process (empty while it has not)");
  bind_edge_attention(m);
  bind_head_norm(m);
  bind_transpose(m);
}
