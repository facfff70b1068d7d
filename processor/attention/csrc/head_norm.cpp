// The attention's q and k taken from its packed projection and each head's vector normed
// (LayerNorm over head_dim: anemoi's qk_norm), forward and backward, in one pass over the points.
//
// torch's layer_norm over rows of a head_dim (16 values, one AVX-512 register) spends most of
// its time per row, and q and k first need copying out of the packed (points, 3, heads,
// head_dim) projection; its backward then stacks dq, dk and dv back into it. Here:
//   forward:  q[r, h] = norm_q(qkv[r, 0, h]),  k[r, h] = norm_k(qkv[r, 1, h]),
//             norm(x) = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps),
//             var the biased variance (torch's); mean and rstd kept for the backward;
//   backward: dqkv[r, 0..1, h] by LayerNorm's backward, dqkv[r, 2, h] = dv[r, h], and the
//             norms' weight and bias gradients summed over the rows (per thread, then added).
//
// Tensors, float32: qkv (rows, 3, heads, head_dim) contiguous; q, k (rows, heads, head_dim)
// contiguous; mean, rstd (2, rows, heads); dq, dk, dv (batch, heads, points, head_dim) with any
// strides whose last is 1, rows = batch x points; weight (head_dim), bias (head_dim) or absent.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "head_norm.h"

#if defined(__AVX512F__)
#include "head_norm_blocks.h"
#define GRIDSHARD_HEAD_BLOCKS 1  // head_dim 16: sixteen vectors at a time (head_norm_blocks.h)
#else
#define GRIDSHARD_HEAD_BLOCKS 0
#endif

namespace {

struct Norm {
  const float* weight;
  const float* bias;  // null: no bias
};

Norm norm_of(const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  return {weight.data_ptr<float>(), bias.has_value() ? bias->data_ptr<float>() : nullptr};
}

// out = norm(x) over d values (D: d known at compile time, or 0); *mean, *rstd of x.
template <int64_t D>
inline void norm_row(const float* x, int64_t d_runtime, float eps, const Norm& n, float* out, float* mean, float* rstd) {
  const int64_t d = D > 0 ? D : d_runtime;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < d; ++i) sum += x[i];
  const float mu = sum / static_cast<float>(d);
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < d; ++i) squares += (x[i] - mu) * (x[i] - mu);
  const float r = 1.f / std::sqrt(squares / static_cast<float>(d) + eps);
  if (n.bias != nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = (x[i] - mu) * r * n.weight[i] + n.bias[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = (x[i] - mu) * r * n.weight[i];
  }
  *mean = mu;
  *rstd = r;
}

// dx from dy through norm (LayerNorm's backward); dweight += dy * xhat, dbias += dy.
template <int64_t D>
inline void norm_row_backward(const float* dy, const float* x, int64_t d_runtime, float mu, float r, const Norm& n, float* dx,
                              float* dweight, float* dbias) {
  const int64_t d = D > 0 ? D : d_runtime;
  float g_sum = 0.f, gx_sum = 0.f;
#pragma omp simd reduction(+ : g_sum, gx_sum)
  for (int64_t i = 0; i < d; ++i) {
    const float g = dy[i] * n.weight[i];
    g_sum += g;
    gx_sum += g * (x[i] - mu) * r;
  }
  const float g_mean = g_sum / static_cast<float>(d), gx_mean = gx_sum / static_cast<float>(d);
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) {
    const float xhat = (x[i] - mu) * r;
    dx[i] = r * (dy[i] * n.weight[i] - g_mean - xhat * gx_mean);
    dweight[i] += dy[i] * xhat;
    dbias[i] += dy[i];
  }
}

// The packed projection (rows, 3, heads, d) and its gradient: where part t (q, k, v) of head h of
// a row starts.
struct Rows {
  int64_t heads, d;
  int64_t at(int64_t row, int64_t t, int64_t h) const { return ((row * 3 + t) * heads + h) * d; }
};

// f(std::integral_constant<int64_t, D>) with D = d for the usual head widths (the row loops
// unrolled to whole vectors), D = 0 (d read at run time) for any other.
template <class F>
void with_width(int64_t d, const F& f) {
  switch (d) {
    case 8: return f(std::integral_constant<int64_t, 8>{});
    case 16: return f(std::integral_constant<int64_t, 16>{});
    case 32: return f(std::integral_constant<int64_t, 32>{});
    case 64: return f(std::integral_constant<int64_t, 64>{});
    default: return f(std::integral_constant<int64_t, 0>{});
  }
}

// Rows per task: a few thousand values, so that a small grid still splits over the threads.
int64_t grain(int64_t heads, int64_t d) { return std::max<int64_t>(1, 4096 / (heads * d)); }

void check_norms(const at::Tensor& q_weight, const c10::optional<at::Tensor>& q_bias, const at::Tensor& k_weight,
                 const c10::optional<at::Tensor>& k_bias, int64_t d) {
  for (const auto& t : {c10::optional<at::Tensor>(q_weight), q_bias, c10::optional<at::Tensor>(k_weight), k_bias}) {
    TORCH_CHECK(!t.has_value() || (t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                                   t->numel() == d),
                "qk heads: a norm's weight and bias must be float32 contiguous (", d, ") on the CPU");
  }
}

// The forward's tensors, and its passes over the head vectors [at, stop) of one task (a head
// vector's index: row * heads + h; k's statistics after q's).
struct ForwardPass {
  const float* in;
  float *q_out, *k_out, *mu, *r;
  Rows part;
  Norm nq, nk;
  int64_t heads, k_stats;
  float eps;

  // Whole blocks of sixteen head vectors from at (head_dim 16 on AVX-512); the first vector left.
  int64_t blocks(int64_t at, int64_t stop) const {
#if GRIDSHARD_HEAD_BLOCKS
    if (part.d != head_blocks::kBlock) return at;
    for (; at + head_blocks::kBlock <= stop; at += head_blocks::kBlock) {
      for (int64_t t = 0; t < 2; ++t) {
        const float* x[head_blocks::kBlock];
        float* out[head_blocks::kBlock];
        for (int64_t j = 0; j < head_blocks::kBlock; ++j) {
          x[j] = in + part.at((at + j) / heads, t, (at + j) % heads);
          out[j] = (t == 0 ? q_out : k_out) + (at + j) * part.d;
        }
        const Norm& n = t == 0 ? nq : nk;
        head_blocks::norm_block(x, out, n.weight, n.bias, eps, mu + t * k_stats + at, r + t * k_stats + at);
      }
    }
#endif
    return at;
  }

  template <int64_t D>
  void rows(int64_t at, int64_t stop) const {
    const int64_t d = part.d;
    for (; at < stop; ++at) {
      const int64_t row = at / heads, h = at % heads, k_at = k_stats + at;
      norm_row<D>(in + part.at(row, 0, h), d, eps, nq, q_out + at * d, mu + at, r + at);
      norm_row<D>(in + part.at(row, 1, h), d, eps, nk, k_out + at * d, mu + k_at, r + k_at);
    }
  }
};

std::vector<at::Tensor> qk_heads_forward(const at::Tensor& qkv, const at::Tensor& q_weight,
                                         const c10::optional<at::Tensor>& q_bias, const at::Tensor& k_weight,
                                         const c10::optional<at::Tensor>& k_bias, double eps) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.scalar_type() == at::kFloat && qkv.is_contiguous() && qkv.dim() == 4 &&
                  qkv.size(1) == 3,
              "qk heads: qkv must be float32 contiguous (rows, 3, heads, head_dim) on the CPU");
  const int64_t rows = qkv.size(0), heads = qkv.size(2), d = qkv.size(3);
  TORCH_CHECK(heads > 0 && d > 0, "qk heads: no heads or an empty head_dim");
  check_norms(q_weight, q_bias, k_weight, k_bias, d);
  auto q = at::empty({rows, heads, d}, qkv.options()), k = at::empty({rows, heads, d}, qkv.options());
  auto mean = at::empty({2, rows, heads}, qkv.options()), rstd = at::empty({2, rows, heads}, qkv.options());
  const ForwardPass pass{qkv.data_ptr<float>(),
                         q.data_ptr<float>(),
                         k.data_ptr<float>(),
                         mean.data_ptr<float>(),
                         rstd.data_ptr<float>(),
                         Rows{heads, d},
                         norm_of(q_weight, q_bias),
                         norm_of(k_weight, k_bias),
                         heads,
                         rows * heads,
                         static_cast<float>(eps)};
  with_width(d, [&](auto width) {
    constexpr int64_t D = decltype(width)::value;
    at::parallel_for(0, rows, grain(heads, d), [&](int64_t begin, int64_t end) {
      pass.rows<D>(pass.blocks(begin * heads, end * heads), end * heads);
    });
  });
  return {q, k, mean, rstd};
}

void check_grad(const at::Tensor& g, int64_t rows, int64_t heads, int64_t d, const char* what) {
  TORCH_CHECK(g.scalar_type() == at::kFloat && g.dim() == 4 && g.size(1) == heads && g.size(3) == d &&
                  g.size(0) * g.size(2) == rows && g.stride(3) == 1,
              "qk heads backward: ", what, " must be float32 (batch, heads, points, head_dim), head_dim contiguous");
}

// A (batch, heads, points, head_dim) gradient, read by the packed projection's rows (b, p).
struct Grads {
  const float* data;
  int64_t points, batch_stride, head_stride, point_stride;
  explicit Grads(const at::Tensor& g)
      : data(g.data_ptr<float>()), points(g.size(2)), batch_stride(g.stride(0)), head_stride(g.stride(1)),
        point_stride(g.stride(2)) {}
  const float* row(int64_t row, int64_t h) const {
    return data + (row / points) * batch_stride + h * head_stride + (row % points) * point_stride;
  }
};

// The backward's tensors, and its passes over the head vectors [at, stop) of one task, adding
// the norms' weight and bias gradients into the task's thread's acc (dq_weight, dq_bias,
// dk_weight, dk_bias: 4 x d).
struct BackwardPass {
  const float *in, *mu, *r;
  float* out;
  Grads dq_rows, dk_rows, dv_rows;
  Rows part;
  Norm nq, nk;
  int64_t heads, k_stats;

  // Whole blocks of sixteen head vectors from at (head_dim 16 on AVX-512); the first vector left.
  int64_t blocks(int64_t at, int64_t stop, float* acc) const {
#if GRIDSHARD_HEAD_BLOCKS
    if (part.d != head_blocks::kBlock) return at;
    const int64_t first = at;
    __m512 sums[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (; at + head_blocks::kBlock <= stop; at += head_blocks::kBlock) {
      for (int64_t t = 0; t < 2; ++t) {
        const float *dy[head_blocks::kBlock], *x[head_blocks::kBlock];
        float* dx[head_blocks::kBlock];
        for (int64_t j = 0; j < head_blocks::kBlock; ++j) {
          const int64_t row = (at + j) / heads, h = (at + j) % heads;
          dy[j] = (t == 0 ? dq_rows : dk_rows).row(row, h);
          x[j] = in + part.at(row, t, h);
          dx[j] = out + part.at(row, t, h);
        }
        const int64_t stats = t * k_stats + at;
        head_blocks::norm_block_backward(dy, x, mu + stats, r + stats, (t == 0 ? nq : nk).weight, dx, &sums[2 * t],
                                         &sums[2 * t + 1]);
      }
    }
    for (int64_t k = 0; k < 4; ++k) {
      _mm512_storeu_ps(acc + k * part.d, _mm512_add_ps(_mm512_loadu_ps(acc + k * part.d), sums[k]));
    }
    for (int64_t v = first; v < at; ++v) {  // v's gradient of the blocks' vectors
      const float* g = dv_rows.row(v / heads, v % heads);
      std::copy(g, g + part.d, out + part.at(v / heads, 2, v % heads));
    }
#endif
    return at;
  }

  template <int64_t D>
  void rows(int64_t at, int64_t stop, float* acc) const {
    const int64_t d = part.d;
    for (; at < stop; ++at) {
      const int64_t row = at / heads, h = at % heads, k_at = k_stats + at;
      const int64_t q_part = part.at(row, 0, h), k_part = part.at(row, 1, h), v_part = part.at(row, 2, h);
      norm_row_backward<D>(dq_rows.row(row, h), in + q_part, d, mu[at], r[at], nq, out + q_part, acc, acc + d);
      norm_row_backward<D>(dk_rows.row(row, h), in + k_part, d, mu[k_at], r[k_at], nk, out + k_part, acc + 2 * d,
                           acc + 3 * d);
      const float* g = dv_rows.row(row, h);
      for (int64_t i = 0; i < d; ++i) out[v_part + i] = g[i];
    }
  }
};

std::vector<at::Tensor> qk_heads_backward(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                                          const at::Tensor& qkv, const at::Tensor& mean, const at::Tensor& rstd,
                                          const at::Tensor& q_weight, const c10::optional<at::Tensor>& q_bias,
                                          const at::Tensor& k_weight, const c10::optional<at::Tensor>& k_bias) {
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.is_contiguous() && qkv.dim() == 4 && qkv.size(1) == 3,
              "qk heads backward: qkv must be float32 contiguous (rows, 3, heads, head_dim)");
  const int64_t rows = qkv.size(0), heads = qkv.size(2), d = qkv.size(3);
  check_grad(dq, rows, heads, d, "dq");
  check_grad(dk, rows, heads, d, "dk");
  check_grad(dv, rows, heads, d, "dv");
  check_norms(q_weight, q_bias, k_weight, k_bias, d);
  TORCH_CHECK(mean.is_contiguous() && rstd.is_contiguous() && mean.numel() == 2 * rows * heads &&
                  rstd.numel() == 2 * rows * heads,
              "qk heads backward: mean and rstd must be the forward's (2, rows, heads)");
  auto dqkv = at::empty_like(qkv);
  const int threads = at::get_num_threads();
  auto partial = at::zeros({threads, 4, d}, qkv.options());  // per thread: dq_weight, dq_bias, dk_weight, dk_bias
  const BackwardPass pass{qkv.data_ptr<float>(),
                          mean.data_ptr<float>(),
                          rstd.data_ptr<float>(),
                          dqkv.data_ptr<float>(),
                          Grads(dq),
                          Grads(dk),
                          Grads(dv),
                          Rows{heads, d},
                          norm_of(q_weight, q_bias),
                          norm_of(k_weight, k_bias),
                          heads,
                          rows * heads};
  with_width(d, [&](auto width) {
    constexpr int64_t D = decltype(width)::value;
    at::parallel_for(0, rows, grain(heads, d), [&](int64_t begin, int64_t end) {
      float* acc = partial.data_ptr<float>() + at::get_thread_num() * 4 * d;
      pass.rows<D>(pass.blocks(begin * heads, end * heads, acc), end * heads, acc);
    });
  });
  auto sums = partial.sum(0);  // (4, d)
  return {dqkv, sums[0], sums[1], sums[2], sums[3]};
}

}  // namespace

void bind_head_norm(pybind11::module& m) {
  using pybind11::arg;
  m.def("qk_heads_forward", &qk_heads_forward, "q and k normed per head: (q, k, mean, rstd)", arg("qkv"),
        arg("q_weight"), arg("q_bias"), arg("k_weight"), arg("k_bias"), arg("eps"));
  m.def("qk_heads_backward", &qk_heads_backward, "(dqkv, dq_weight, dq_bias, dk_weight, dk_bias)", arg("dq"),
        arg("dk"), arg("dv"), arg("qkv"), arg("mean"), arg("rstd"), arg("q_weight"), arg("q_bias"), arg("k_weight"),
        arg("k_bias"));
}
