// Bug classes of DSA's lightning indexer and its selection (indexer_q, indexer_k, indexer_weights, index_scores,
// topk): the key LayerNorm skipped, the indexer's rope in the other lane layout, its weights scaled (fitted) or
// skipped, future keys scored or selected, top-k off by one or two, ties broken toward the later key.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "harness/hypotheses/common.h"
#include "reference/stages.h"

namespace mla::hyp {

namespace dsa_family {

BugClass make(std::string name, int complexity, std::vector<Stage> stages, std::string description,
              std::function<std::vector<Variant>(const StageCase&, const Outputs&)> run) {
  return make_class(std::move(name), "dsa", std::move(stages), complexity, std::move(description), std::move(run));
}

// The index cache with this step's idx_k rows written.
Tensor index_cache(const StageCase& c) {
  Tensor cache = c.index_cache_before;
  ref::index_cache_write(cache, c.batch, input(c, "idx_k"));
  return cache;
}

int64_t score_width(const StageCase& c) {
  const Tensor* cs = cand(c, "idx_scores");
  return cs ? cs->dim(1) : 0;
}

}  // namespace dsa_family

std::vector<BugClass> dsa_classes() {
  using namespace dsa_family;
  std::vector<BugClass> v;
  v.push_back(make("dsa.index_k_norm_skipped", 0, {Stage::Stage_indexer_k}, "the indexer's key LayerNorm left out",
                   [](const StageCase& c, const Outputs&) {
                     const auto& W = *c.w;
                     return std::vector<Variant>{variant(
                         "idx_k",
                         ref::indexer_k(input(c, "x"), W.idx_wk, W.idx_k_norm, W.idx_k_norm_bias, MlaConfig::kIndexNormEps,
                                        c.batch.positions, c.cfg.inv_freq, c.cfg.index_rope_style, false),
                         {}, "without its key LayerNorm")};
                   }));
  v.push_back(make("dsa.index_rope_layout", 0, {Stage::Stage_indexer_q, Stage::Stage_indexer_k},
                   "the indexer's rope in the other lane pairing (interleaved vs half-split)", [](const StageCase& c, const Outputs&) {
                     const RopeStyle s = other_rope_style(c.cfg.index_rope_style);
                     const auto& W = *c.w;
                     const std::string phrase = std::string("with its rope lanes paired ") +
                                                (s == RopeStyle::RopeStyle_neox ? "half-split" : "interleaved");
                     if (c.stage == Stage::Stage_indexer_q)
                       return std::vector<Variant>{variant(
                           "idx_q", ref::indexer_q(input(c, "q_c"), W.idx_wq_b, c.cfg.index_n_heads, c.batch.positions, c.cfg.inv_freq, s),
                           {}, phrase)};
                     return std::vector<Variant>{variant(
                         "idx_k",
                         ref::indexer_k(input(c, "x"), W.idx_wk, W.idx_k_norm, W.idx_k_norm_bias, MlaConfig::kIndexNormEps,
                                        c.batch.positions, c.cfg.inv_freq, s),
                         {}, phrase)};
                   }));
  v.push_back(make("dsa.index_weights_scale", 1, {Stage::Stage_indexer_weights, Stage::Stage_index_scores},
                   "the indexer's head weights off by one factor (Hi^-1/2 or Di^-1/2 missing or doubled; fitted)",
                   [](const StageCase& c, const Outputs& ref) {
                     const std::string out = c.stage == Stage::Stage_indexer_weights ? "idx_weights" : "idx_scores";
                     const Tensor* y = cand(c, out);
                     if (!y) return std::vector<Variant>{};
                     const double s = ls_scale(*y, ref.at(out));
                     if (!std::isfinite(s) || std::fabs(s - 1) < 1e-3) return std::vector<Variant>{};
                     const double Hi = c.cfg.index_n_heads, Di = c.cfg.index_head_dim;
                     std::string named;
                     for (auto [x, what] : {std::pair<double, const char*>{std::sqrt(Hi), "Hi^-1/2 missing"},
                                            {1 / std::sqrt(Hi), "Hi^-1/2 applied twice"},
                                            {1 / std::sqrt(Di), "Di^-1/2 applied twice"},
                                            {std::sqrt(Di), "Di^-1/2 missing"}})
                       if (close_to(s, x, 0.01)) named = std::string(" (") + what + ")";
                     return std::vector<Variant>{variant(out, scaled(ref.at(out), s), {{"factor", s}},
                                                         "with its head weights scaled by " + num(s, 4) + named)};
                   }));
  v.push_back(make("dsa.index_weights_skipped", 0, {Stage::Stage_index_scores}, "every indexer head weighed 1 (the weights not applied)",
                   [](const StageCase& c, const Outputs&) {
                     return std::vector<Variant>{variant(
                         "idx_scores",
                         ref::index_scores(input(c, "idx_q"), input(c, "idx_weights"), index_cache(c), c.batch, score_width(c),
                                           {.weights = false}),
                         {}, "with every head weighed 1")};
                   }));
  v.push_back(make("dsa.future_keys", 0, {Stage::Stage_index_scores, Stage::Stage_topk},
                   "keys after the token's own scored or selected (the indexer's causal mask missing)",
                   [](const StageCase& c, const Outputs&) {
                     if (c.stage == Stage::Stage_index_scores)
                       return std::vector<Variant>{variant(
                           "idx_scores",
                           ref::index_scores(input(c, "idx_q"), input(c, "idx_weights"), index_cache(c), c.batch, score_width(c),
                                             {.causal = false}),
                           {}, "scoring keys after the token's own")};
                     return std::vector<Variant>{variant(
                         "topk", ref::selection_tensor(ref::select_keys(input(c, "idx_scores"), c.batch, c.cfg.index_topk, false), c.cfg.index_topk),
                         {}, "selecting among keys after the token's own")};
                   }));
  v.push_back(make("dsa.topk_count", 1, {Stage::Stage_topk}, "k - 1 or k - 2 keys selected instead of index_topk",
                   [](const StageCase& c, const Outputs&) {
                     std::vector<Variant> out;
                     for (int d : {1, 2}) {
                       const int k = c.cfg.index_topk - d;
                       if (k < 1) continue;
                       out.push_back(variant("topk", ref::selection_tensor(ref::select_keys(input(c, "idx_scores"), c.batch, k), c.cfg.index_topk),
                                             {{"k", k}, {"index_topk", c.cfg.index_topk}},
                                             "selecting " + std::to_string(k) + " keys (index_topk " + std::to_string(c.cfg.index_topk) + ")"));
                     }
                     return out;
                   }));
  v.push_back(make("dsa.tie_order", 0, {Stage::Stage_topk}, "ties between equal scores broken toward the later key",
                   [](const StageCase& c, const Outputs&) {
                     const Tensor& s = input(c, "idx_scores");
                     const int64_t T = s.dim(0), K = s.dim(1);
                     ref::Selection sel(T);
                     for (int64_t t = 0; t < T; ++t) {
                       const int seen = std::min<int>(c.batch.keys_seen(static_cast<int>(t)), static_cast<int>(K));
                       std::vector<int> idx(seen);
                       std::iota(idx.begin(), idx.end(), 0);
                       const float* row = s.ptr() + t * K;
                       std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a > b); });
                       idx.resize(std::min<int>(seen, c.cfg.index_topk));
                       std::sort(idx.begin(), idx.end());
                       sel[t] = idx;
                     }
                     return std::vector<Variant>{variant("topk", ref::selection_tensor(sel, c.cfg.index_topk), {},
                                                         "with ties broken toward the later key")};
                   }));
  return v;
}

}  // namespace mla::hyp
