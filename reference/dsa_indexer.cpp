// DSA's lightning indexer (GLM-5, DeepSeek-V3.2) and the keys it selects: reference/stages.h, docs/mla.md.
// fp32 products, sums of a score's heads in double; the selection is exact on those scores.
#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/stages.h"

namespace mla::ref {

namespace {
// RoPE on the first R lanes of every row of x [T, ..., D] (the indexer's rope lanes lead its head): rope() on those
// lanes viewed [T, rows per token, R], so the rows of a token share its position.
void rope_leading_lanes(Tensor& x, const std::vector<int>& positions, const std::vector<double>& inv_freq,
                        RopeStyle style) {
  const int64_t T = x.dim(0), D = x.dim(-1), R = 2 * static_cast<int64_t>(inv_freq.size()), rows = x.numel() / D;
  Tensor lanes({T, rows / T, R});
  for (int64_t r = 0; r < rows; ++r) std::copy_n(x.ptr() + r * D, R, lanes.ptr() + r * R);
  const Tensor rotated = rope(lanes, positions, inv_freq, 1.0, style);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(rotated.ptr() + r * R, R, x.ptr() + r * D);
}
}  // namespace

Tensor indexer_q(const Tensor& q_c, const Tensor& wq_b, int64_t heads, const std::vector<int>& positions,
                 const std::vector<double>& inv_freq, RopeStyle style) {
  const int64_t T = q_c.dim(0), D = wq_b.dim(0) / heads;
  Tensor q = linear(q_c, wq_b).reshaped({T, heads, D});
  rope_leading_lanes(q, positions, inv_freq, style);
  return q;
}

Tensor indexer_k(const Tensor& x, const Tensor& wk, const Tensor& norm_w, const Tensor& norm_b, double eps,
                 const std::vector<int>& positions, const std::vector<double>& inv_freq, RopeStyle style) {
  Tensor k = linear(x, wk);  // [T, D]
  const int64_t T = k.dim(0), D = k.dim(1);
  for (int64_t t = 0; t < T; ++t) {  // LayerNorm: mean and (biased) variance over the head, fp32
    float* row = k.ptr() + t * D;
    float mean = 0.f;
    for (int64_t c = 0; c < D; ++c) mean += row[c];
    mean /= static_cast<float>(D);
    float var = 0.f;
    for (int64_t c = 0; c < D; ++c) var += (row[c] - mean) * (row[c] - mean);
    var /= static_cast<float>(D);
    const float inv = 1.0f / std::sqrt(var + static_cast<float>(eps));
    for (int64_t c = 0; c < D; ++c) row[c] = (row[c] - mean) * inv * norm_w.data[c] + norm_b.data[c];
  }
  rope_leading_lanes(k, positions, inv_freq, style);
  return k;
}

Tensor indexer_weights(const Tensor& x, const Tensor& weights_proj) {
  Tensor w = linear(x, weights_proj);  // [T, Hi]
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(weights_proj.dim(0))));
  for (float& v : w.data) v *= scale;
  return w;
}

Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w) {
  const int64_t Tq = q.dim(0), Hi = q.dim(1), D = q.dim(2), Tk = k.dim(0);
  const int64_t offset = Tk - Tq;  // bottom-right causal alignment: query t sees keys s <= t + offset
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Tensor scores({Tq, Tk}, -std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t s = 0; s <= std::min(Tk - 1, t + offset); ++s) {
      double total = 0;
      for (int64_t h = 0; h < Hi; ++h) {
        const float* qh = q.ptr() + (t * Hi + h) * D;
        const float* ks = k.ptr() + s * D;
        float dot = 0.f;
        for (int64_t c = 0; c < D; ++c) dot += qh[c] * ks[c];
        total += static_cast<double>(w.data[t * Hi + h]) * std::max(0.0, dot * scale);
      }
      scores.data[t * Tk + s] = static_cast<float>(total);
    }
  return scores;
}

std::vector<std::vector<int>> topk_keys(const Tensor& scores, int k) {
  const int64_t Tq = scores.dim(0), Tk = scores.dim(1);
  std::vector<std::vector<int>> out(Tq);
  for (int64_t t = 0; t < Tq; ++t) {
    const float* row = scores.ptr() + t * Tk;
    std::vector<int> keys;
    for (int s = 0; s < Tk; ++s)
      if (row[s] != -std::numeric_limits<float>::infinity()) keys.push_back(s);
    const auto higher = [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
    const size_t n = std::min(keys.size(), static_cast<size_t>(std::max(k, 0)));
    std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n), keys.end(), higher);
    keys.resize(n);
    out[t] = std::move(keys);
  }
  return out;
}

Attn attend_selected(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                     const std::vector<std::vector<int>>& keys) {
  // attend() of each query over its selected rows, gathered in key order.
  const int64_t Tq = q.dim(0), Nl = q.dim(1), Dk = q.dim(2), Dv = v.dim(-1);
  const int64_t krow = k.numel() / k.dim(0), vrow = v.numel() / v.dim(0);  // a key's lanes over its heads
  Attn a{Tensor({Tq, Nl, Dv}), Tensor({Tq, Nl}, -std::numeric_limits<float>::infinity())};
  for (int64_t t = 0; t < Tq; ++t) {
    std::vector<int> sel = keys[t];
    std::sort(sel.begin(), sel.end());
    const int64_t n = static_cast<int64_t>(sel.size());
    Tensor qt({1, Nl, Dk}), ks({n, krow / Dk, Dk}), vs({n, vrow / Dv, Dv});
    std::copy_n(q.ptr() + t * Nl * Dk, Nl * Dk, qt.ptr());
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(k.ptr() + sel[j] * krow, krow, ks.ptr() + j * krow);
      std::copy_n(v.ptr() + sel[j] * vrow, vrow, vs.ptr() + j * vrow);
    }
    const Attn one = attend(qt, ks, vs, scale, false);
    std::copy_n(one.out.ptr(), Nl * Dv, a.out.ptr() + t * Nl * Dv);
    std::copy_n(one.lse.ptr(), Nl, a.lse.ptr() + t * Nl);
  }
  return a;
}

}  // namespace mla::ref
