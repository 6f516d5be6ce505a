// DSA's lightning indexer (GLM-5, DeepSeek-V3.2) and the keys it selects: reference/stages.h, docs/mla.md.
// fp32 products, sums of a score's heads in double; the selection is exact on those scores.
#include <algorithm>
#include <cmath>
#include <limits>

#include <cstring>

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
                 const std::vector<int>& positions, const std::vector<double>& inv_freq, RopeStyle style,
                 bool norm) {
  Tensor k = linear(x, wk);  // [T, D]
  const int64_t T = k.dim(0), D = k.dim(1);
  for (int64_t t = 0; norm && t < T; ++t) {  // LayerNorm: mean and (biased) variance over the head, fp32
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
#pragma omp parallel for schedule(dynamic, 4) if (Tq * Tk * Hi * D > (1 << 22))
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t s = 0; s <= std::min(Tk - 1, t + offset); ++s) {
      double total = 0;
      for (int64_t h = 0; h < Hi; ++h) {
        const float* qh = q.ptr() + (t * Hi + h) * D;
        const float* ks = k.ptr() + s * D;
        float dot = 0.f;
        for (int64_t c = 0; c < D; ++c) dot += qh[c] * ks[c];
        // ReLU as the math has it: a NaN stays NaN (std::max(0, NaN) would drop it).
        const double x = dot * scale;
        total += static_cast<double>(w.data[t * Hi + h]) * (std::isnan(x) ? x : std::max(0.0, x));
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
    // Highest first, a tie to the lower key; a NaN score ranks above every number (torch.topk's order), so a NaN
    // reaches the selection instead of vanishing from it.
    const auto higher = [&](int a, int b) {
      const bool na = std::isnan(row[a]), nb = std::isnan(row[b]);
      if (na || nb) return na && (!nb || a < b);
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    };
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

void index_cache_write(Tensor& index_cache, const Batch& batch, const Tensor& idx_k) {
  const int64_t D = idx_k.dim(1);
  for (int b = 0; b < batch.num_seqs(); ++b)
    for (int i = 0; i < batch.new_lens[b]; ++i) {
      const int pos = batch.context_lens[b] + i;  // the token's slot in its sequence's pages
      std::memcpy(index_cache.ptr() + (static_cast<int64_t>(batch.page(b, pos)) * kPageSize + pos % kPageSize) * D,
                  idx_k.ptr() + (batch.first_token(b) + i) * D, sizeof(float) * D);
    }
}

Tensor index_scores(const Tensor& idx_q, const Tensor& idx_weights, const Tensor& index_cache, const Batch& batch,
                    int64_t K, const ScoreOptions& opt) {
  const int64_t T = idx_q.dim(0), Hi = idx_q.dim(1), D = idx_q.dim(2);
  Tensor out({T, K});
  Tensor w = idx_weights;
  if (!opt.weights) std::fill(w.data.begin(), w.data.end(), 1.0f);
  for (int b = 0; b < batch.num_seqs(); ++b) {
    const int64_t t0 = batch.first_token(b), n = batch.new_lens[b];
    const int keys = batch.context_lens[b] + batch.new_lens[b];
    const Tensor k = gather_cache_rows(index_cache, batch, b, keys);  // [keys, D]
    Tensor q({n, Hi, D}), wb({n, Hi});
    std::copy_n(idx_q.ptr() + t0 * Hi * D, n * Hi * D, q.ptr());
    std::copy_n(w.ptr() + t0 * Hi, n * Hi, wb.ptr());
    Tensor s = indexer_scores(q, k, wb);  // [n, keys], −inf where the token does not see the key
    if (!opt.causal)  // each token scored alone against every key, as if it were the sequence's last
      for (int64_t i = 0; i < n; ++i) {
        Tensor qi({1, Hi, D}), wi({1, Hi});
        std::copy_n(q.ptr() + i * Hi * D, Hi * D, qi.ptr());
        std::copy_n(wb.ptr() + i * Hi, Hi, wi.ptr());
        std::copy_n(indexer_scores(qi, k, wi).ptr(), keys, s.ptr() + i * keys);
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < std::min<int64_t>(keys, K); ++c) {
        const float v = s.data[i * keys + c];
        out.data[(t0 + i) * K + c] = v == -std::numeric_limits<float>::infinity() ? 0.0f : v;
      }
  }
  return out;
}

Selection select_keys(const Tensor& idx_scores, const Batch& batch, int k, bool causal) {
  const int64_t T = idx_scores.dim(0), K = idx_scores.dim(1);
  Selection out(T);
  for (int64_t t = 0; t < T; ++t) {
    const int b = batch.token_seq[t];
    const int keys = causal ? batch.keys_seen(static_cast<int>(t)) : batch.context_lens[b] + batch.new_lens[b];
    const int seen = std::min<int>(keys, static_cast<int>(K));
    Tensor row({1, seen});
    std::copy_n(idx_scores.ptr() + t * K, seen, row.ptr());
    out[t] = topk_keys(row, k)[0];
    std::sort(out[t].begin(), out[t].end());
  }
  return out;
}

Tensor selection_tensor(const Selection& keys, int k) {
  Tensor out({static_cast<int64_t>(keys.size()), static_cast<int64_t>(k)}, -1.0f);
  for (size_t t = 0; t < keys.size(); ++t)
    for (size_t j = 0; j < keys[t].size() && j < static_cast<size_t>(k); ++j)
      out.data[t * k + j] = static_cast<float>(keys[t][j]);
  return out;
}

Selection selection_of(const Tensor& topk) {
  const int64_t T = topk.dim(0), k = topk.dim(1);
  Selection out(T);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (const float v = topk.data[t * k + j]; v >= 0) out[t].push_back(static_cast<int>(v));
  return out;
}

}  // namespace mla::ref
