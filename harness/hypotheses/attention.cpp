// Bug classes of the attention stages (attention_mha, attention_mqa), all through one softmax attention over an
// explicit key set per query: the softmax scale (missing or unsquared YaRN mscale, inverted, the wrong head dim, a
// log2 base, fitted), the causal mask off, shifted by one or two, aligned top-left, a sliding window, sequences of a
// varlen batch seeing each other, the probabilities in bf16/fp16, the scores overflowing fp16, the cached context
// or this step's keys missing, pages read through a shifted block table, the LSE written in base 2.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>

#include "harness/hypotheses/common.h"
#include "reference/stages.h"

namespace mla::hyp {

namespace attention_family {

// The joint key table: every sequence's keys, sequence b's from offset[b].
struct Keys {
  Tensor k, v;  // [S, Nk, Dk], [S, Nk, Dv]; Nk = 1 (mqa: shared by every head) or N
  std::vector<int64_t> offset, length;
  std::vector<int64_t> first, count;  // per sequence: its first new token and how many
  std::vector<int> token_seq;         // per new token
  // Per (sequence, head): its new tokens' raw q·k over its own keys [count, length], made on first use (the query
  // and the keys of a Keys never change once built).
  mutable std::shared_ptr<std::vector<RowMatrix>> raw;
};

Keys keys_of(const StageCase& c, const Tensor& cache, const Batch& batch) {
  const MlaConfig& cfg = c.cfg;
  const int64_t L = cfg.kv_lora_rank, R = cfg.qk_rope, P = cfg.qk_nope, V = cfg.v_head;
  const bool mqa = c.stage == Stage::Stage_attention_mqa;
  const int B = batch.num_seqs();
  Keys out;
  int64_t S = 0;
  for (int b = 0; b < B; ++b) {
    out.offset.push_back(S);
    out.length.push_back(batch.context_lens[b] + batch.new_lens[b]);
    out.first.push_back(batch.first_token(b));
    out.count.push_back(batch.new_lens[b]);
    S += out.length.back();
  }
  out.token_seq = batch.token_seq;
  const int64_t N = mqa ? 1 : input(c, "q_nope").dim(1);
  const int64_t Dk = mqa ? L + R : P + R, Dv = mqa ? L : V;
  out.k = Tensor({S, N, Dk});
  out.v = Tensor({S, N, Dv});
  for (int b = 0; b < B; ++b) {
    const int64_t ctx = batch.context_lens[b], S_b = out.length[b], o = out.offset[b];
    if (mqa) {
      const Tensor rows = ref::gather_cache_rows(cache, batch, b, static_cast<int>(S_b));
      for (int64_t s = 0; s < S_b; ++s) {
        std::copy_n(rows.ptr() + s * (L + R), L + R, out.k.ptr() + (o + s) * Dk);
        std::copy_n(rows.ptr() + s * (L + R), L, out.v.ptr() + (o + s) * Dv);
      }
      continue;
    }
    // mha: the cached context up-projected through W_kvb, then this step's new tokens.
    if (ctx > 0) {
      const Tensor rows = ref::gather_cache_rows(cache, batch, b, static_cast<int>(ctx));
      Tensor lat({ctx, L});
      for (int64_t s = 0; s < ctx; ++s) std::copy_n(rows.ptr() + s * (L + R), L, lat.ptr() + s * L);
      const auto kv = ref::kv_b_proj(lat, c.w->kv_b_proj, cfg);
      for (int64_t s = 0; s < ctx; ++s)
        for (int64_t h = 0; h < N; ++h) {
          float* kd = out.k.ptr() + ((o + s) * N + h) * Dk;
          std::copy_n(kv.k_nope.ptr() + (s * N + h) * P, P, kd);
          std::copy_n(rows.ptr() + s * (L + R) + L, R, kd + P);
          std::copy_n(kv.v.ptr() + (s * N + h) * V, V, out.v.ptr() + ((o + s) * N + h) * Dv);
        }
    }
    const Tensor &kn = input(c, "k_nope"), &kp = input(c, "k_pe_rope"), &vv = input(c, "v");
    const int64_t first = batch.first_token(b);
    for (int64_t i = 0; i < batch.new_lens[b]; ++i) {
      const int64_t t = first + i, s = ctx + i;
      for (int64_t h = 0; h < N; ++h) {
        float* kd = out.k.ptr() + ((o + s) * N + h) * Dk;
        std::copy_n(kn.ptr() + (t * N + h) * P, P, kd);
        std::copy_n(kp.ptr() + t * R, R, kd + P);
        std::copy_n(vv.ptr() + (t * N + h) * V, V, out.v.ptr() + ((o + s) * N + h) * Dv);
      }
    }
  }
  return out;
}

// [T, N, Dk]: mha [q_nope | q_pe_rope], mqa [q_latent | q_pe_rope].
Tensor query_of(const StageCase& c) {
  const bool mqa = c.stage == Stage::Stage_attention_mqa;
  const Tensor& a = input(c, mqa ? "q_latent" : "q_nope");
  const Tensor& r = input(c, "q_pe_rope");
  const int64_t T = a.dim(0), N = a.dim(1), A = a.dim(2), R = r.dim(-1);
  Tensor q({T, N, A + R});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h) {
      std::copy_n(a.ptr() + (t * N + h) * A, A, q.ptr() + (t * N + h) * (A + R));
      std::copy_n(r.ptr() + (t * N + h) * R, R, q.ptr() + (t * N + h) * (A + R) + A);
    }
  return q;
}

struct Options {
  double scale = 0;
  Precision probs = Precision::Precision_fp32;
  bool lse_base2 = false, fp16_scores = false;
};

using Strided = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;

const std::vector<RowMatrix>& raw_scores(const Tensor& q, const Keys& keys) {
  if (keys.raw) return *keys.raw;
  const int64_t N = q.dim(1), Dk = q.dim(2), Nk = keys.k.dim(1);
  const int64_t B = static_cast<int64_t>(keys.offset.size());
  auto raw = std::make_shared<std::vector<RowMatrix>>(B * N);
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < N; ++h) {
      const int64_t kh = Nk == 1 ? 0 : h;
      Strided Q(q.ptr() + (keys.first[b] * N + h) * Dk, keys.count[b], Dk, Eigen::OuterStride<>(N * Dk));
      Strided K(keys.k.ptr() + (keys.offset[b] * Nk + kh) * Dk, keys.length[b], Dk, Eigen::OuterStride<>(Nk * Dk));
      (*raw)[b * N + h].noalias() = Q * K.transpose();
    }
  keys.raw = raw;
  return *raw;
}

// Softmax attention of each query over the keys `visible(t)` returns (indices into the joint table): scores from
// the cached q·k of its own sequence (a key of another sequence: its dot product here), the probabilities times the
// values as one product per sequence and head.
std::pair<Tensor, Tensor> attend(const Tensor& q, const Keys& keys, const std::function<std::vector<int64_t>(int64_t)>& visible,
                                 const Options& opt) {
  const int64_t T = q.dim(0), N = q.dim(1), Dk = q.dim(2), Nk = keys.k.dim(1), Dv = keys.v.dim(2);
  const int64_t B = static_cast<int64_t>(keys.offset.size());
  Tensor out({T, N, Dv}), lse({T, N}, -std::numeric_limits<float>::infinity());
  std::vector<std::vector<int64_t>> vis(T);
  for (int64_t t = 0; t < T; ++t) vis[t] = visible(t);
  const auto& raw = raw_scores(q, keys);
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < N; ++h) {
      const int64_t kh = Nk == 1 ? 0 : h, o0 = keys.offset[b], len = keys.length[b];
      const RowMatrix& rs = raw[b * N + h];
      RowMatrix P = RowMatrix::Zero(keys.count[b], len);
      std::vector<std::vector<std::pair<int64_t, double>>> foreign(keys.count[b]);
      for (int64_t i = 0; i < keys.count[b]; ++i) {
        const int64_t t = keys.first[b] + i;
        const auto& ks = vis[t];
        if (ks.empty()) continue;
        std::vector<double> sc(ks.size());
        double mx = -INFINITY;
        for (size_t j = 0; j < ks.size(); ++j) {
          double d;
          if (ks[j] >= o0 && ks[j] < o0 + len) {
            d = rs(i, ks[j] - o0);
          } else {
            const float* qv = q.ptr() + (t * N + h) * Dk;
            const float* kv = keys.k.ptr() + (ks[j] * Nk + kh) * Dk;
            d = 0;
            for (int64_t x = 0; x < Dk; ++x) d += static_cast<double>(qv[x]) * kv[x];
          }
          if (opt.fp16_scores) d = round_fp16(static_cast<float>(d));
          sc[j] = d * opt.scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& v : sc) sum += (v = std::exp(v - mx));
        for (size_t j = 0; j < ks.size(); ++j) {
          double p = sc[j] / sum;
          if (opt.probs == Precision::Precision_bf16) p = round_bf16(static_cast<float>(p));
          if (opt.probs == Precision::Precision_fp16) p = round_fp16(static_cast<float>(p));
          if (ks[j] >= o0 && ks[j] < o0 + len) P(i, ks[j] - o0) += static_cast<float>(p);
          else foreign[i].push_back({ks[j], p});
        }
        const double l = mx + std::log(sum);
        lse.data[t * N + h] = static_cast<float>(opt.lse_base2 ? l / std::log(2.0) : l);
      }
      Strided V(keys.v.ptr() + (o0 * Nk + kh) * Dv, len, Dv, Eigen::OuterStride<>(Nk * Dv));
      const RowMatrix O = P * V;
      for (int64_t i = 0; i < keys.count[b]; ++i) {
        float* o = out.ptr() + ((keys.first[b] + i) * N + h) * Dv;
        for (int64_t x = 0; x < Dv; ++x) o[x] = O(i, x);
        for (const auto& [j, p] : foreign[i]) {
          const float* vv = keys.v.ptr() + (j * Nk + kh) * Dv;
          for (int64_t x = 0; x < Dv; ++x) o[x] += static_cast<float>(p * vv[x]);
        }
      }
    }
  return {std::move(out), std::move(lse)};
}

std::string out_name(const StageCase& c) { return c.stage == Stage::Stage_attention_mqa ? "attn_latent" : "attn_out"; }

struct Setup {
  Tensor q;
  Keys keys;
  std::optional<ref::Selection> sel;
};

Setup setup(const StageCase& c) {
  Setup s{query_of(c), keys_of(c, c.cache_after, c.batch), std::nullopt};
  if (c.cfg.has_dsa() && c.in.count("topk")) s.sel = ref::selection_of(input(c, "topk"));
  return s;
}

// The keys token t sees in the model: its sequence's first key_index(t) + 1 (DSA: its selection).
std::vector<int64_t> model_keys(const StageCase& c, const Setup& s, int64_t t) {
  const int b = c.batch.token_seq[t];
  std::vector<int64_t> ks;
  if (s.sel) {
    for (int k : (*s.sel)[t])
      if (k >= 0 && k < s.keys.length[b]) ks.push_back(s.keys.offset[b] + k);
    return ks;
  }
  for (int64_t j = 0; j <= key_index(c.batch, t); ++j) ks.push_back(s.keys.offset[b] + j);
  return ks;
}

Variant run(const StageCase& c, const Setup& s, const std::function<std::vector<int64_t>(int64_t)>& visible,
            const Options& opt, nlohmann::json params, std::string phrase) {
  auto [o, l] = attend(s.q, s.keys, visible, opt);
  Variant v;
  v.out[out_name(c)] = std::move(o);
  v.out["lse"] = std::move(l);
  v.params = std::move(params);
  v.phrase = std::move(phrase);
  return v;
}

Options base(const StageCase& c) {
  Options o;
  o.scale = c.cfg.softmax_scale;
  return o;
}

BugClass make(std::string name, int complexity, bool dense_only, std::string description,
              std::function<std::vector<Variant>(const StageCase&, const Setup&)> body) {
  BugClass k;
  k.name = std::move(name);
  k.family = "attention";
  k.stages = {Stage::Stage_attention_mha, Stage::Stage_attention_mqa};
  k.description = std::move(description);
  k.complexity = complexity;
  k.run = [body, dense_only](const StageCase& c, const Outputs&) {
    // The cached q·k holds heads x new tokens x their sequence's keys floats: past 2^28 (1 GiB) the attention classes
    // are not run (a prefill of thousands of tokens), and the report says so.
    const int64_t heads = c.stage == Stage::Stage_attention_mqa ? input(c, "q_latent").dim(1) : input(c, "q_nope").dim(1);
    int64_t cells = 0;
    for (int b = 0; b < c.batch.num_seqs(); ++b)
      cells += static_cast<int64_t>(c.batch.new_lens[b]) * (c.batch.context_lens[b] + c.batch.new_lens[b]);
    if (cells * heads > (int64_t{1} << 28))
      throw std::runtime_error("the attention is too large to re-run under every class here (" + std::to_string(heads) +
                               " heads x " + std::to_string(cells) + " query-key pairs)");
    const Setup s = setup(c);
    if (dense_only && s.sel) return std::vector<Variant>{};  // DSA: the selection is the mask
    return body(c, s);
  };
  return k;
}

// A mask variant: token t sees its sequence's keys [lo(t), hi(t)] (inclusive, clipped to the sequence).
Variant mask(const StageCase& c, const Setup& s, const std::function<std::pair<int64_t, int64_t>(int64_t)>& range,
             nlohmann::json params, std::string phrase) {
  return run(
      c, s,
      [&](int64_t t) {
        const int b = c.batch.token_seq[t];
        auto [lo, hi] = range(t);
        lo = std::max<int64_t>(lo, 0);
        hi = std::min<int64_t>(hi, s.keys.length[b] - 1);
        std::vector<int64_t> ks;
        for (int64_t j = lo; j <= hi; ++j) ks.push_back(s.keys.offset[b] + j);
        return ks;
      },
      base(c), std::move(params), std::move(phrase));
}

}  // namespace attention_family

std::vector<BugClass> attention_classes() {
  using namespace attention_family;
  std::vector<BugClass> v;
  v.push_back(make("attn.causal_off", 0, true, "no causal mask: every token sees every key of its sequence",
                   [](const StageCase& c, const Setup& s) {
                     return std::vector<Variant>{mask(c, s, [&](int64_t) { return std::pair<int64_t, int64_t>{0, 1 << 30}; },
                                                      {}, "with no causal mask")};
                   }));
  v.push_back(make("attn.top_left", 0, true, "the causal mask aligned top-left: new token i sees keys 0..i, the cached context not counted",
                   [](const StageCase& c, const Setup& s) {
                     std::vector<Variant> out;
                     bool has_context = false;
                     for (int x : c.batch.context_lens) has_context |= x > 0;
                     if (!has_context) return out;
                     out.push_back(mask(
                         c, s, [&](int64_t t) { return std::pair<int64_t, int64_t>{0, t - c.batch.first_token(c.batch.token_seq[t])}; },
                         {}, "with a causal mask aligned top-left"));
                     return out;
                   }));
  v.push_back(make("attn.causal_shift", 1, true, "the causal mask off by k keys (fitted, |k| <= 2)", [](const StageCase& c, const Setup& s) {
    std::vector<Variant> out;
    for (int k : {-2, -1, 1, 2})
      out.push_back(mask(c, s, [&](int64_t t) { return std::pair<int64_t, int64_t>{0, key_index(c.batch, t) + k}; },
                         {{"shift", k}},
                         "with a causal mask off by " + std::string(k > 0 ? "+" : "") + std::to_string(k) +
                             (k > 0 ? " (each token sees later keys)" : " (each token misses its last keys)")));
    return out;
  }));
  v.push_back(make("attn.window", 1, true, "a sliding window: each token sees only its last w keys (w fitted)", [](const StageCase& c, const Setup& s) {
    std::vector<Variant> out;
    int64_t longest = 0;
    for (auto l : s.keys.length) longest = std::max(longest, l);
    std::vector<int64_t> ws;
    for (int64_t w = 1; w < longest; w *= 2) ws.push_back(w);
    // The error's first token bounds the window from below: try the sizes around each power of two too.
    for (int64_t w = 1; w < longest && w <= 64; ++w)
      if (std::count(ws.begin(), ws.end(), w) == 0) ws.push_back(w);
    const Tensor* y = cand(c, out_name(c));
    double best = INFINITY;
    int64_t best_w = 0;
    for (int64_t w : ws) {
      Variant var = mask(c, s, [&](int64_t t) { return std::pair<int64_t, int64_t>{key_index(c.batch, t) - w + 1, key_index(c.batch, t)}; },
                         {{"window", w}}, "with a sliding window of " + std::to_string(w) + " keys");
      const double r = y ? rel_l2(*y, var.out.at(out_name(c))) : INFINITY;
      if (r < best) best = r, best_w = w, out.assign(1, std::move(var));
    }
    (void)best_w;
    return out;
  }));
  v.push_back(make("attn.varlen_leak", 0, true, "the sequences of a varlen batch seeing each other's keys (one long sequence)",
                   [](const StageCase& c, const Setup& s) {
                     std::vector<Variant> out;
                     if (c.batch.num_seqs() < 2) return out;
                     out.push_back(run(
                         c, s,
                         [&](int64_t t) {
                           // Every key of the earlier sequences, then its own sequence's causal keys.
                           const int b = c.batch.token_seq[t];
                           std::vector<int64_t> ks;
                           for (int64_t j = 0; j < s.keys.offset[b]; ++j) ks.push_back(j);
                           for (int64_t j = 0; j <= key_index(c.batch, t); ++j) ks.push_back(s.keys.offset[b] + j);
                           return ks;
                         },
                         base(c), {}, "with the batch's sequences seeing each other's keys (the mask across sequences missing)"));
                     return out;
                   }));
  v.push_back(make("attn.context_missing", 0, false, "the cached context not attended, or this step's own keys missing",
                   [](const StageCase& c, const Setup& s) {
                     std::vector<Variant> out;
                     bool has_context = false;
                     for (int x : c.batch.context_lens) has_context |= x > 0;
                     for (bool keep_context : {false, true}) {
                       if (!keep_context && !has_context) continue;  // without context it would be the model
                       out.push_back(run(
                           c, s,
                           [&](int64_t t) {
                             const int b = c.batch.token_seq[t];
                             std::vector<int64_t> ks;
                             for (int64_t j : model_keys(c, s, t)) {
                               const bool is_context = j - s.keys.offset[b] < c.batch.context_lens[b];
                               if (is_context == keep_context) ks.push_back(j);
                             }
                             return ks;
                           },
                           base(c), {{"missing", keep_context ? "new" : "context"}},
                           keep_context ? "with this step's keys missing"
                                        : "without the cached context (new tokens only)"));
                     }
                     // The absorbed form reads every key from the cache: read before this step's write, its rows are
                     // whatever the cache held there.
                     if (c.stage == Stage::Stage_attention_mqa && c.cache_before.numel() == c.cache_after.numel()) {
                       Setup stale = s;
                       stale.keys = keys_of(c, c.cache_before, c.batch);
                       out.push_back(run(c, stale, [&](int64_t t) { return model_keys(c, stale, t); }, base(c),
                                         {{"missing", "write"}}, "reading the cache as it was before this step's write"));
                     }
                     return out;
                   }));
  v.push_back(make("attn.page_shift", 1, false, "the paged cache read through a block table off by k pages (|k| <= 1)",
                   [](const StageCase& c, const Setup& s0) {
                     std::vector<Variant> out;
                     bool has_context = false;
                     for (int x : c.batch.context_lens) has_context |= x > 0;
                     if (!has_context) return out;
                     // Entries read one slot on or back (from the first entry, or from the second: a loop over the
                     // pages after the first with its index off by one).
                     const int mb = c.batch.max_blocks;
                     for (int from : {0, 1})
                       for (int k : {-1, 1}) {
                         Batch shifted = c.batch;
                         for (int b = 0; b < shifted.num_seqs(); ++b)
                           for (int j = from; j < mb; ++j) {
                             const int src = j + k;
                             if (src >= 0 && src < mb) shifted.block_table[b * mb + j] = c.batch.block_table[b * mb + src];
                           }
                         if (shifted.block_table == c.batch.block_table) continue;
                         Setup s = s0;
                         s.keys = keys_of(c, c.cache_after, shifted);
                         out.push_back(run(c, s, [&](int64_t t) { return model_keys(c, s, t); }, base(c),
                                           {{"entries", k}, {"from_entry", from}},
                                           "with block table entry j" + std::string(from ? " >= 1" : "") + " read from entry j" +
                                               (k > 0 ? "+1" : "-1")));
                       }
                     return out;
                   }));
  v.push_back(make("attn.merge_base2", 0, true,
                   "the cached context and the new tokens attended apart and merged with base-2 exponentials on natural-log LSEs",
                   [](const StageCase& c, const Setup& s) {
                     std::vector<Variant> out;
                     bool has_context = false;
                     for (int x : c.batch.context_lens) has_context |= x > 0;
                     if (!has_context) return out;
                     auto part = [&](bool context) {
                       return attend(s.q, s.keys,
                                     [&](int64_t t) {
                                       const int b = c.batch.token_seq[t];
                                       std::vector<int64_t> ks;
                                       for (int64_t j : model_keys(c, s, t))
                                         if ((j - s.keys.offset[b] < c.batch.context_lens[b]) == context) ks.push_back(j);
                                       return ks;
                                     },
                                     base(c));
                     };
                     auto [oa, la] = part(true);
                     auto [ob, lb] = part(false);
                     const ref::Attn m = ref::merge_lse({oa, la}, {ob, lb}, true);
                     Variant v;
                     v.out[out_name(c)] = m.out;
                     v.out["lse"] = m.lse;
                     v.phrase = "with its context and new-token parts merged in base 2";
                     out.push_back(std::move(v));
                     return out;
                   }));
  v.push_back(make("attn.lse_base2", 0, false, "the LSE written in base 2 (the output right)", [](const StageCase& c, const Setup& s) {
    Options o = base(c);
    o.lse_base2 = true;
    return std::vector<Variant>{run(c, s, [&](int64_t t) { return model_keys(c, s, t); }, o, {}, "with its LSE in base 2")};
  }));
  v.push_back(make("attn.probs_lowp", 0, false, "the softmax probabilities rounded to bf16 or fp16 before the weighted sum",
                   [](const StageCase& c, const Setup& s) {
                     std::vector<Variant> out;
                     for (Precision p : {Precision::Precision_bf16, Precision::Precision_fp16}) {
                       Options o = base(c);
                       o.probs = p;
                       out.push_back(run(c, s, [&](int64_t t) { return model_keys(c, s, t); }, o, {{"dtype", precision_name(p)}},
                                         std::string("with its probabilities in ") + precision_name(p)));
                     }
                     return out;
                   }));
  v.push_back(make("attn.fp16_overflow", 0, false, "the raw scores q.k in fp16: past 65504 they overflow to inf",
                   [](const StageCase& c, const Setup& s) {
                     Options o = base(c);
                     o.fp16_scores = true;
                     Variant v = run(c, s, [&](int64_t t) { return model_keys(c, s, t); }, o, {{"lse", "nan"}},
                                     "with its raw scores in fp16 (overflowing past 65504)");
                     // A row whose largest score overflowed: its LSE is NaN (inf - inf in the softmax) or, in a
                     // logsumexp that keeps the infinite maximum, +inf.
                     Variant w = v;
                     for (auto& x : w.out["lse"].data)
                       if (std::isnan(x)) x = INFINITY;
                     w.params = {{"lse", "+inf"}};
                     return std::vector<Variant>{std::move(v), std::move(w)};
                   }));
  v.push_back(make("attn.scale", 1, false,
                   "another softmax scale: YaRN mscale missing or not squared, inverted, 1/sqrt of another head dim, a log2 "
                   "base, or fitted",
                   [](const StageCase& c, const Setup& s) {
                     std::vector<Variant> out;
                     const MlaConfig& m = c.cfg;
                     const double s0 = m.softmax_scale, D = m.qk_head();
                     const double ms = m.rope_scaling == RopeScaling::RopeScaling_yarn
                                           ? yarn_get_mscale(m.yarn.factor, m.yarn.mscale_all_dim) : 1.0;
                     std::vector<std::pair<double, std::string>> named;
                     if (std::fabs(ms - 1.0) > 1e-6) {
                       named.push_back({s0 / (ms * ms), "missing_mscale2"});
                       named.push_back({s0 / ms, "mscale_not_squared"});
                       named.push_back({s0 * ms * ms, "mscale_applied_twice"});
                     }
                     named.push_back({std::sqrt(D) * ms * ms, "inverted"});
                     named.push_back({1.0 / s0, "inverted"});
                     for (double d : {double(m.qk_nope), double(m.qk_rope), double(m.kv_lora_rank),
                                      double(m.kv_lora_rank + m.qk_rope), double(m.v_head)})
                       if (d > 0 && std::fabs(d - D) > 0.5) {
                         named.push_back({ms * ms / std::sqrt(d), "head_dim " + num(d)});
                         if (std::fabs(ms - 1.0) > 1e-6) named.push_back({1.0 / std::sqrt(d), "head_dim " + num(d) + " without mscale"});
                       }
                     named.push_back({s0 * std::log2(std::exp(1.0)), "log2"});
                     named.push_back({s0 / std::log2(std::exp(1.0)), "log2"});
                     named.push_back({1.0, "none"});
                     auto vis = [&](int64_t t) { return model_keys(c, s, t); };
                     for (const auto& [sc, what] : named) {
                       if (close_to(sc, s0, 1e-6)) continue;
                       Options o = base(c);
                       o.scale = sc;
                       out.push_back(run(c, s, vis, o, {{"scale", sc}, {"config_scale", s0}, {"variant", what}},
                                         "with softmax scale " + num(sc) + " (" + what + "; the config's " + num(s0) + ")"));
                     }
                     // Fitted: golden section on log(scale) within a factor of 64 either way.
                     const Tensor* y = cand(c, "lse");
                     if (!y) y = cand(c, out_name(c));
                     if (!y) return out;
                     const std::string target = cand(c, "lse") ? "lse" : out_name(c);
                     auto err = [&](double ls) {
                       Options o = base(c);
                       o.scale = s0 * std::exp(ls);
                       return rel_l2(*y, run(c, s, vis, o, {}, "").out.at(target));
                     };
                     const double f = std::exp(golden_min(err, -std::log(64.0), std::log(64.0), 16));
                     if (std::fabs(f - 1.0) > 1e-3) {
                       Options o = base(c);
                       o.scale = s0 * f;
                       out.push_back(run(c, s, vis, o, {{"scale", s0 * f}, {"config_scale", s0}, {"variant", "fitted"}, {"factor", f}},
                                         "with softmax scale " + num(s0 * f) + " (" + num(f, 4) + " x the config's " + num(s0) + ")"));
                     }
                     return out;
                   }));
  return v;
}

}  // namespace mla::hyp
