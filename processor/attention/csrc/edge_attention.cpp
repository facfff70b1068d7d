// Fused edge attention for the CPU, forward and backward: the graph transformer mapper's
// message passing (training/model/graph_transformer.py) in one pass over the edges.
//
// Destination i attends over its edges e = (j -> i), per head h:
//   s_e = scale * q_i . (k_j + edge_e),   p_e = softmax over i's edges of s_e,
//   out_i = sum_e p_e (v_j + edge_e).
// The edge features are shared by the batch. Edges come sorted by destination (CSR: i's edges
// are dst_ptr[i] .. dst_ptr[i + 1]); the backward also reads them grouped by source (by_src,
// src_ptr), so that every thread owns the rows it writes and nothing is reduced across threads.
// The backward recomputes p from the saved log-sum-exp: p = exp(s - lse), dp = dout . v,
// ds = p (dp - D), D = dout . out. A destination with no edges gets out = 0 and lse = -inf.
//
// Tensors, float32 and contiguous: q, dout, out (batch, n_dst, C); k, v (batch, n_src, C);
// edge (E, C); lse (n_dst, batch, heads); the index lists int64. C = heads x head_dim.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "edge_attention.h"

namespace {

struct Rows {
  int64_t batch, channels, heads, head_dim, n_dst, n_src;
  // Row of destination (source) point p of sample b in a (batch, n_dst (n_src), C) tensor.
  int64_t dst(int64_t p, int64_t b) const { return (b * n_dst + p) * channels; }
  int64_t src(int64_t p, int64_t b) const { return (b * n_src + p) * channels; }
};

// Whole rows of C channels at a time (the loops the compiler vectorises); a head's value is
// spread over its head_dim channels where a row is scaled per head.

// out[h] = scale * sum over head h's channels of product
void head_sums(const Rows& r, const float* product, float scale, float* out) {
  for (int64_t h = 0; h < r.heads; ++h) {
    float s = 0.f;  // a vector of partial sums (reassociated), not head_dim dependent adds
#pragma omp simd reduction(+ : s)
    for (int64_t d = h * r.head_dim; d < (h + 1) * r.head_dim; ++d) s += product[d];
    out[h] = scale * s;
  }
}

// out[h] = scale * sum over head h's channels of a (b + c); work: C floats
void head_dots(const Rows& r, const float* a, const float* b, const float* c, float scale, float* out, float* work) {
#pragma omp simd
  for (int64_t d = 0; d < r.channels; ++d) work[d] = a[d] * (b[d] + c[d]);
  head_sums(r, work, scale, out);
}

// wide[d] = per_head[d / head_dim]
void spread(const Rows& r, const float* per_head, float* wide) {
  for (int64_t h = 0; h < r.heads; ++h)
    for (int64_t d = h * r.head_dim; d < (h + 1) * r.head_dim; ++d) wide[d] = per_head[h];
}

// y += w (b + c), w per channel
void add_weighted_sum(float* y, const float* w, const float* b, const float* c, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += w[d] * (b[d] + c[d]);
}

// y += w x, w per channel
void add_weighted(float* y, const float* w, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += w[d] * x[d];
}

Rows rows_of(const torch::Tensor& q, const torch::Tensor& k, int64_t heads) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3, "edge attention: q and k must be (batch, points, C)");
  TORCH_CHECK(q.size(2) % heads == 0, "edge attention: C (", q.size(2), ") not divisible by heads (", heads, ")");
  return {q.size(0), q.size(2), heads, q.size(2) / heads, q.size(1), k.size(1)};
}

void check(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.device().is_cpu(),
              "edge attention: ", name, " must be a contiguous float32 CPU tensor");
}

void check_index(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == torch::kInt64 && t.is_contiguous() && t.dim() == 1,
              "edge attention: ", name, " must be a contiguous int64 vector");
}

// One destination row of the forward: its heads' softmax over its edges, out and lse.
void forward_row(const Rows& r, const float* qi, const float* k, const float* v, const float* edge,
                 const int64_t* src, int64_t first, int64_t degree, int64_t b, float scale, float* oi, float* lse,
                 std::vector<float>& scores, std::vector<float>& work) {
  const int64_t heads = r.heads;
  scores.resize(degree * heads);
  work.resize(2 * r.channels + 2 * heads);
  float *product = work.data(), *weight = product + r.channels, *top = weight + r.channels, *total = top + heads;
  std::fill(top, top + heads, -std::numeric_limits<float>::infinity());
  std::fill(total, total + heads, 0.f);
  for (int64_t e = 0; e < degree; ++e) {
    const int64_t id = first + e;
    float* s = scores.data() + e * heads;
    head_dots(r, qi, k + r.src(src[id], b), edge + id * r.channels, scale, s, product);
    for (int64_t h = 0; h < heads; ++h) top[h] = std::max(top[h], s[h]);
  }
  for (int64_t e = 0; e < degree; ++e)
    for (int64_t h = 0; h < heads; ++h) total[h] += (scores[e * heads + h] = std::exp(scores[e * heads + h] - top[h]));
  for (int64_t e = 0; e < degree; ++e) {
    const int64_t id = first + e;
    float* p = scores.data() + e * heads;
    for (int64_t h = 0; h < heads; ++h) p[h] /= total[h];
    spread(r, p, weight);
    add_weighted_sum(oi, weight, v + r.src(src[id], b), edge + id * r.channels, r.channels);
  }
  for (int64_t h = 0; h < heads; ++h) lse[h] = top[h] + std::log(total[h]);
}

}  // namespace

std::vector<torch::Tensor> edge_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const torch::Tensor& edge, const torch::Tensor& src,
                                        const torch::Tensor& dst_ptr, int64_t heads, double scale) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&edge, "edge"}}) check(*t, name);
  check_index(src, "src");
  check_index(dst_ptr, "dst_ptr");
  TORCH_CHECK(heads >= 1, "edge attention: at least one head, got ", heads);
  const Rows r = rows_of(q, k, heads);
  TORCH_CHECK(dst_ptr.size(0) == r.n_dst + 1, "edge attention: dst_ptr must hold n_dst + 1 offsets");
  auto out = torch::empty_like(q);  // every row written below (zeros without edges)
  auto lse = torch::empty({r.n_dst, r.batch, heads}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float* ep = edge.data_ptr<float>();
  const int64_t *sp = src.data_ptr<int64_t>(), *ptr = dst_ptr.data_ptr<int64_t>();
  float *op = out.data_ptr<float>(), *lp = lse.data_ptr<float>();
  at::parallel_for(0, r.n_dst, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, work;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t degree = ptr[i + 1] - ptr[i];
      for (int64_t b = 0; b < r.batch; ++b) {
        std::fill(op + r.dst(i, b), op + r.dst(i, b) + r.channels, 0.f);
        if (degree == 0) {
          std::fill(lp + (i * r.batch + b) * heads, lp + (i * r.batch + b + 1) * heads,
                    -std::numeric_limits<float>::infinity());
          continue;
        }
        forward_row(r, qp + r.dst(i, b), kp, vp, ep, sp, ptr[i], degree, b, static_cast<float>(scale),
                    op + r.dst(i, b), lp + (i * r.batch + b) * heads, scores, work);
      }
    }
  });
  return {out, lse};
}

std::vector<torch::Tensor> edge_backward(const torch::Tensor& dout, const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v, const torch::Tensor& edge, const torch::Tensor& out,
                                         const torch::Tensor& lse, const torch::Tensor& src,
                                         const torch::Tensor& dst_ptr, const torch::Tensor& dst,
                                         const torch::Tensor& by_src, const torch::Tensor& src_ptr, int64_t heads,
                                         double scale) {
  for (auto [t, name] : {std::pair{&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&edge, "edge"}, {&out, "out"},
                         {&lse, "lse"}})
    check(*t, name);
  for (auto [t, name] : {std::pair{&src, "src"}, {&dst_ptr, "dst_ptr"}, {&dst, "dst"}, {&by_src, "by_src"},
                         {&src_ptr, "src_ptr"}})
    check_index(*t, name);
  TORCH_CHECK(heads >= 1, "edge attention: at least one head, got ", heads);
  const Rows r = rows_of(q, k, heads);
  const int64_t n_edges = edge.size(0), C = r.channels;
  TORCH_CHECK(src_ptr.size(0) == r.n_src + 1, "edge attention: src_ptr must hold n_src + 1 offsets");
  // Every row of these is written whole below: zeroed where its sum starts.
  auto dq = torch::empty_like(q);
  auto dk = torch::empty_like(k);
  auto dv = torch::empty_like(v);
  auto dedge = torch::empty_like(edge);
  // Per edge, batch and head: p, and ds x scale; the second pass sums them onto the sources.
  auto probs = torch::empty({n_edges, r.batch, heads}, q.options());
  auto dscores = torch::empty({n_edges, r.batch, heads}, q.options());
  const float *gp = dout.data_ptr<float>(), *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>();
  const float *vp = v.data_ptr<float>(), *ep = edge.data_ptr<float>(), *outp = out.data_ptr<float>();
  const float* lp = lse.data_ptr<float>();
  const int64_t *sp = src.data_ptr<int64_t>(), *ptr = dst_ptr.data_ptr<int64_t>();
  float *dqp = dq.data_ptr<float>(), *dep = dedge.data_ptr<float>();
  float *pp = probs.data_ptr<float>(), *dsp = dscores.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  // Pass 1, by destination: p and ds of each edge, dq, and the edge features' gradient.
  at::parallel_for(0, r.n_dst, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> work(3 * C + 3 * heads);
    float *product = work.data(), *wide_ds = product + C, *wide_p = wide_ds + C;
    float *delta = wide_p + C, *s = delta + heads, *dp = s + heads;  // per head
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t b = 0; b < r.batch; ++b) {
        const float *gi = gp + r.dst(i, b), *qi = qp + r.dst(i, b), *lse_i = lp + (i * r.batch + b) * heads;
        const float* oi = outp + r.dst(i, b);
#pragma omp simd
        for (int64_t d = 0; d < C; ++d) product[d] = gi[d] * oi[d];
        head_sums(r, product, 1.f, delta);  // D = dout . out
        std::fill(dqp + r.dst(i, b), dqp + r.dst(i, b) + C, 0.f);
        for (int64_t e = ptr[i]; e < ptr[i + 1]; ++e) {
          const float *ke = kp + r.src(sp[e], b), *ve = vp + r.src(sp[e], b), *ee = ep + e * C;
          if (b == 0) std::fill(dep + e * C, dep + (e + 1) * C, 0.f);
          float *pe = pp + (e * r.batch + b) * heads, *dse = dsp + (e * r.batch + b) * heads;
          head_dots(r, qi, ke, ee, fscale, s, product);
          head_dots(r, gi, ve, ee, 1.f, dp, product);
          for (int64_t h = 0; h < heads; ++h) {
            pe[h] = std::exp(s[h] - lse_i[h]);
            dse[h] = pe[h] * (dp[h] - delta[h]) * fscale;
          }
          spread(r, dse, wide_ds);
          spread(r, pe, wide_p);
          add_weighted_sum(dqp + r.dst(i, b), wide_ds, ke, ee, C);
          add_weighted(dep + e * C, wide_ds, qi, C);
          add_weighted(dep + e * C, wide_p, gi, C);
        }
      }
    }
  });
  // Pass 2, by source: dk_j = sum ds q_i, dv_j = sum p dout_i over j's edges.
  const int64_t *dp = dst.data_ptr<int64_t>(), *bs = by_src.data_ptr<int64_t>(), *sptr = src_ptr.data_ptr<int64_t>();
  float *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  at::parallel_for(0, r.n_src, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> work(2 * C);
    float *wide_ds = work.data(), *wide_p = wide_ds + C;
    for (int64_t j = begin; j < end; ++j) {
      for (int64_t b = 0; b < r.batch; ++b) {
        std::fill(dkp + r.src(j, b), dkp + r.src(j, b) + C, 0.f);
        std::fill(dvp + r.src(j, b), dvp + r.src(j, b) + C, 0.f);
      }
      for (int64_t at = sptr[j]; at < sptr[j + 1]; ++at) {
        const int64_t e = bs[at], i = dp[e];
        for (int64_t b = 0; b < r.batch; ++b) {
          spread(r, dsp + (e * r.batch + b) * heads, wide_ds);
          spread(r, pp + (e * r.batch + b) * heads, wide_p);
          add_weighted(dkp + r.src(j, b), wide_ds, qp + r.dst(i, b), C);
          add_weighted(dvp + r.src(j, b), wide_p, gp + r.dst(i, b), C);
        }
      }
    }
  });
  return {dq, dk, dv, dedge};
}

void bind_edge_attention(pybind11::module& m) {
  using pybind11::arg;
  m.def("edge_forward", &edge_forward, "edge attention forward: (out, lse)", arg("q"), arg("k"), arg("v"),
        arg("edge"), arg("src"), arg("dst_ptr"), arg("heads"), arg("scale"));
  m.def("edge_backward", &edge_backward, "edge attention backward: (dq, dk, dv, dedge)", arg("dout"), arg("q"),
        arg("k"), arg("v"), arg("edge"), arg("out"), arg("lse"), arg("src"), arg("dst_ptr"), arg("dst"),
        arg("by_src"), arg("src_ptr"), arg("heads"), arg("scale"));
}
