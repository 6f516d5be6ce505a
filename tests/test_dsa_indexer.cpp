// DSA's indexer and sparse attention in the reference (reference/dsa_indexer.cpp) against HF transformers' own
// GlmMoeDsaIndexer and DeepseekV32Indexer and their whole attention modules (tests/py/make_dsa_fixtures.py: random
// weights, a prompt longer than index_topk), against each other's rope layouts (the wrong one must show), and
// against the dense attention and naive loops of tests/naive_stages.h.
#include <cstdlib>
#include <iostream>
#include <set>
#include <stdexcept>
#include <tuple>

#include "probes/h5.h"
#include "tests/cli_util.h"
#include "core/model/stage_graph.h"
#include "tests/naive_stages.h"
#include "tests/stage_test_util.h"

namespace mla::test {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

Tensor read_tensor(const h5::Group& g, const std::string& name) {
  const h5::Dataset d = g.open_dataset(name);
  Tensor t(d.shape());
  d.read(t.ptr(), t.numel());
  return t;
}

Ref as_ref(const Tensor& t) {
  Ref r(t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) r.data[i] = t.data[i];
  return r;
}

std::vector<double> default_inv_freq(int64_t R, double theta) {
  std::vector<double> f(R / 2);
  for (int64_t i = 0; i < R / 2; ++i) f[i] = 1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / R);
  return f;
}

struct Ours {
  Tensor scores;
  std::vector<std::vector<int>> topk;
};
Ours run_indexer(const h5::Group& g, RopeStyle style) {
  const Tensor x = read_tensor(g, "x"), q_c = read_tensor(g, "q_c");
  const int64_t T = x.dim(0), heads = g.attr_int("n_heads");
  std::vector<int> pos(T);
  std::iota(pos.begin(), pos.end(), 0);
  const auto inv_freq = default_inv_freq(g.attr_int("rope"), g.attr_double("theta"));
  const Tensor q = ref::indexer_q(q_c, read_tensor(g, "wq_b"), heads, pos, inv_freq, style);
  const Tensor k = ref::indexer_k(x, read_tensor(g, "wk"), read_tensor(g, "k_norm_weight"),
                                  read_tensor(g, "k_norm_bias"), 1e-6, pos, inv_freq, style);
  const Tensor w = ref::indexer_weights(x, read_tensor(g, "weights_proj"));
  Ours o{ref::indexer_scores(q, k, w), {}};
  o.topk = ref::topk_keys(o.scores, static_cast<int>(g.attr_int("topk")));
  return o;
}

double rel_l2_finite(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::isfinite(a.data[i]) && std::isfinite(b.data[i])) {
      num += (a.data[i] - double{b.data[i]}) * (a.data[i] - double{b.data[i]});
      den += double{b.data[i]} * b.data[i];
    }
  return std::sqrt(num / den);
}

// tests/py/make_dsa_fixtures.py's file, written into `dir`; "" with the reason in `skip` where the Python lacks HF's
// DSA models (the HF checks are then skipped, visibly).
std::string hf_dsa_fixture(const ScratchDir& dir, std::string& skip) {
  const std::string py = MLA_PYTHON_EXE;
  if (py.empty()) {
    skip = "MLA_PYTHON is not set at configure time: HF DSA check skipped";
    return "";
  }
  if (std::system(("'" + py + "' -c 'import h5py, torch, transformers.models.glm_moe_dsa, "
                               "transformers.models.deepseek_v32' >/dev/null 2>&1").c_str()) != 0) {
    skip = py + " lacks torch or a transformers with glm_moe_dsa and deepseek_v32: HF DSA check skipped";
    return "";
  }
  const std::string fixture = dir.path("dsa.h5");
  const std::string cmd = "'" + py + "' '" MLA_SOURCE_DIR "/tests/py/make_dsa_fixtures.py' '" + fixture + "'";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return fixture;
}

TEST(RefStages, DsaIndexerEqualsHfGlmMoeDsaAndDeepseekV32) {
  ScratchDir dir("dsa");
  std::string skip;
  const std::string fixture = hf_dsa_fixture(dir, skip);
  if (fixture.empty()) GTEST_SKIP() << skip;
  const h5::File f = h5::File::open_read(fixture);
  for (const auto& [model, style, wrong] :
       {std::tuple{"glm_moe_dsa", RopeStyle::RopeStyle_interleaved, RopeStyle::RopeStyle_neox},
        std::tuple{"deepseek_v32", RopeStyle::RopeStyle_neox, RopeStyle::RopeStyle_interleaved}}) {
    SCOPED_TRACE(model);
    const h5::Group g = f.open_group(model);
    const Tensor hf_scores = read_tensor(g, "index_scores");
    const Tensor hf_topk = read_tensor(g, "topk");  // int32 in the file, read as floats (exact below 2^24)
    const Ours ours = run_indexer(g, style);
    // Scores: equal to FP32 noise, and −inf (keys the query does not see) at the same places.
    expect_close(ours.scores, as_ref(hf_scores), "index_scores");
    // The other model's rope layout on the indexer's lanes is a bug the scores show.
    EXPECT_GT(rel_l2_finite(run_indexer(g, wrong).scores, hf_scores), 1e-2) << "the wrong rope layout went unseen";
    // Selection: HF pads a query that sees fewer than index_topk keys with keys it does not see (score −inf), which
    // attention then masks; the keys it selects among those it sees must be ours, except for swaps between keys
    // whose scores tie with the last one selected to FP32 noise: within 1e-5 of the row's largest score, the bound the
    // scores themselves meet (kTol; a score sums Hi·Di fp32 products, HF's in another order).
    const int64_t T = hf_scores.dim(0), K = hf_topk.dim(1);
    int swaps = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = hf_scores.ptr() + t * T;
      std::set<int> hf, mine(ours.topk[t].begin(), ours.topk[t].end());
      for (int64_t j = 0; j < K; ++j) {
        const int s = static_cast<int>(hf_topk.data[t * K + j]);
        if (row[s] != kMinusInf) hf.insert(s);
      }
      ASSERT_EQ(mine.size(), hf.size()) << "query " << t;
      float last = std::numeric_limits<float>::infinity(), amax = 0.f;
      for (int s : mine) last = std::min(last, row[s]);
      for (int64_t s = 0; s <= t; ++s) amax = std::max(amax, std::fabs(row[s]));
      for (int s : mine)
        if (!hf.count(s)) {
          EXPECT_LE(std::fabs(row[s] - last), 1e-5f * amax) << "query " << t << " selects key " << s << " HF does not";
          ++swaps;
        }
      EXPECT_EQ(mine.size(), static_cast<size_t>(std::min<int64_t>(K, t + 1))) << "query " << t;
    }
    std::cout << "[ dsa ] " << model << ": scores equal to HF's, " << swaps << " near-tie swaps in the top-" << K
              << " sets of " << T << " queries\n";
  }
}

// HF's whole attention module (eager) masks every key its indexer did not select; attend_selected over the same
// query, key and value states and the same selection (the keys each query sees) must give its output.
TEST(RefStages, AttendSelectedEqualsHfSparseAttention) {
  ScratchDir dir("dsa_attention");
  std::string skip;
  const std::string fixture = hf_dsa_fixture(dir, skip);
  if (fixture.empty()) GTEST_SKIP() << skip;
  const h5::File f = h5::File::open_read(fixture);
  for (const char* model : {"glm_moe_dsa_attention", "deepseek_v32_attention"}) {
    SCOPED_TRACE(model);
    const h5::Group g = f.open_group(model);
    const Tensor q = read_tensor(g, "query"), k = read_tensor(g, "key"), v = read_tensor(g, "value");
    const Tensor topk = read_tensor(g, "topk"), hf_out = read_tensor(g, "out");
    const double scale = g.attr_double("scaling");
    const int64_t T = q.dim(0), K = topk.dim(1);
    ASSERT_GT(T, K) << "the prompt must be longer than index_topk for the selection to be sparse";
    std::vector<std::vector<int>> keys(T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int s = static_cast<int>(topk.data[t * K + j]);
        if (s <= t) keys[t].push_back(s);  // HF pads a query that sees fewer keys with keys its mask hides
      }
    Tensor out = ref::attend_selected(q, k, v, scale, keys).out;
    out.shape = hf_out.shape;
    expect_close(out, as_ref(hf_out), "attention output");  // both FP32, summed in other orders: kTol
    // The selection matters here: the dense causal attention is far from HF's sparse output.
    Tensor dense = ref::attend(q, k, v, scale, true).out;
    dense.shape = hf_out.shape;
    EXPECT_GT(rel_l2_finite(dense, hf_out), 1e-2)
        << "dense and sparse attention agree: the test cannot tell them apart";
  }
}

TEST(RefStages, TopkKeysTakesTheBestVisibleKeysTiesToTheLowerIndex) {
  Tensor s({3, 5}, kMinusInf);
  const float rows[3][5] = {{2.f, kMinusInf, kMinusInf, kMinusInf, kMinusInf},
                            {1.f, 3.f, 3.f, 0.f, kMinusInf},
                            {-1.f, 0.f, 0.f, 0.f, 5.f}};
  std::copy(&rows[0][0], &rows[0][0] + 15, s.ptr());
  const auto top = ref::topk_keys(s, 3);
  EXPECT_EQ(top[0], std::vector<int>{0});               // sees one key: all of them
  EXPECT_EQ(top[1], (std::vector<int>{1, 2, 0}));       // a tie at 3: the lower index first
  EXPECT_EQ(top[2], (std::vector<int>{4, 1, 2}));       // three zeros tie for two places: keys 1 and 2
  EXPECT_TRUE(ref::topk_keys(s, 0)[1].empty());
}

// Every key a query sees selected: the causal attention; a subset: attention over exactly those rows.
TEST(RefStages, AttendSelectedIsAttentionOverTheSelectedRows) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t Nl = 3, Dk = cfg.qk_head(), Dv = cfg.v_head, T = 9;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor q = randn({T, Nl, Dk}, rng, 2.0), k = randn({T, 1, Dk}, rng), v = randn({T, Nl, Dv}, rng);
    std::vector<std::vector<int>> all(T), some(T);
    for (int t = 0; t < T; ++t)
      for (int s = t; s >= 0; --s) {  // any order: the sums go in key order
        all[t].push_back(s);
        if (s % 3 != 1) some[t].push_back(s);
      }
    const auto dense = ref::attend_selected(q, k, v, scale, all);
    const auto [out, lse] = naive_attend(q, k, v, scale, true);
    expect_close(dense.out, out, "out (every key)");
    expect_close(dense.lse, lse, "lse (every key)");
    const auto sparse = ref::attend_selected(q, k, v, scale, some);
    for (int t = 0; t < T; ++t) {
      SCOPED_TRACE("query " + std::to_string(t));
      const int64_t n = static_cast<int64_t>(some[t].size());
      Tensor qt({1, Nl, Dk}), kt({n, 1, Dk}), vt({n, Nl, Dv});
      std::copy_n(q.ptr() + t * Nl * Dk, Nl * Dk, qt.ptr());
      for (int64_t j = 0; j < n; ++j) {
        std::copy_n(k.ptr() + some[t][j] * Dk, Dk, kt.ptr() + j * Dk);
        std::copy_n(v.ptr() + some[t][j] * Nl * Dv, Nl * Dv, vt.ptr() + j * Nl * Dv);
      }
      const auto [o1, l1] = naive_attend(qt, kt, vt, scale, false);
      Tensor got_o({1, Nl, Dv}), got_l({1, Nl});
      std::copy_n(sparse.out.ptr() + t * Nl * Dv, Nl * Dv, got_o.ptr());
      std::copy_n(sparse.lse.ptr() + t * Nl, Nl, got_l.ptr());
      expect_close(got_o, o1, "out");
      expect_close(got_l, l1, "lse");
    }
  }
}

// Both attention forms given every key a token sees (a context of at most index_topk) are dense attention: DSA
// equals MLA there, over ragged contexts, several sequences and a tp shard.
TEST(RefStages, SelectedAttentionOverEveryVisibleKeyIsDense) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, P = cfg.qk_nope, R = cfg.qk_rope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Batch b = shuffled_batch({5, 3}, {70, 2}, seed + 100);
    const int64_t T = b.tokens(), Nl = N / 2;
    ref::Selection every(T);
    for (int t = 0; t < T; ++t)
      for (int s = b.keys_seen(t) - 1; s >= 0; --s) every[t].push_back(s);  // any order
    const Tensor cache = filled_cache(b, L + R, rng);
    const Tensor w_kvb = slice_rows(weight(N * (P + V), L, rng), Nl * (P + V), 2 * Nl * (P + V));
    const Tensor q_nope = randn({T, Nl, P}, rng, 2.0), q_pe = randn({T, Nl, R}, rng, 2.0);
    const Tensor k_nope = randn({T, Nl, P}, rng), k_pe = randn({T, R}, rng), v = randn({T, Nl, V}, rng);
    const auto dense = ref::attention_mha(q_nope, q_pe, k_nope, k_pe, v, cache, b, w_kvb, cfg);
    const auto sparse = ref::attention_mha(q_nope, q_pe, k_nope, k_pe, v, cache, b, w_kvb, cfg, {.keys = &every});
    expect_close(sparse.out, as_ref(dense.out), "mha attn_out");
    expect_close(sparse.lse, as_ref(dense.lse), "mha lse");
    // The absorbed form reads this step's rows from the cache too.
    const Tensor q_lat = randn({T, Nl, L}, rng, 2.0);
    const auto mqa = ref::attention_mqa(q_lat, q_pe, cache, b, cfg);
    const auto mqa_sel = ref::attention_mqa(q_lat, q_pe, cache, b, cfg, &every);
    expect_close(mqa_sel.out, as_ref(mqa.out), "mqa attn_latent");
    expect_close(mqa_sel.lse, as_ref(mqa.lse), "mqa lse");
  }
}

// The batch's index scores are each sequence's indexer_scores against its own keys (the index cache through the
// block table), 0 where a token does not see the key; the selection is topk_keys of those, ascending, and the
// topk probe holds it with −1 past the last key.
TEST(RefStages, IndexScoresAndSelectionOverABatch) {
  const int64_t Hi = 3, D = 8;
  const int k = 5;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Batch b = shuffled_batch({4, 2}, {1, 70}, seed + 7);
    const int64_t T = b.tokens(), K = 72;
    Tensor cache = filled_cache(b, D, rng);
    const Tensor q = randn({T, Hi, D}, rng), w = randn({T, Hi}, rng), k_new = randn({T, D}, rng);
    ref::index_cache_write(cache, b, k_new);
    const Tensor scores = ref::index_scores(q, w, cache, b, K);
    const ref::Selection sel = ref::select_keys(scores, b, k);
    for (int s = 0; s < b.num_seqs(); ++s) {
      const int t0 = b.first_token(s), n = b.new_lens[s], keys = b.context_lens[s] + n;
      const Tensor ks = ref::gather_cache_rows(cache, b, s, keys);
      for (int i = 0; i < n; ++i)  // the written rows are the step's keys
        for (int64_t c = 0; c < D; ++c)
          EXPECT_EQ(ks.data[(b.context_lens[s] + i) * D + c], k_new.data[(t0 + i) * D + c]);
      Tensor qs({n, Hi, D}), ws({n, Hi});
      std::copy_n(q.ptr() + t0 * Hi * D, n * Hi * D, qs.ptr());
      std::copy_n(w.ptr() + t0 * Hi, n * Hi, ws.ptr());
      const Tensor want = ref::indexer_scores(qs, ks, ws);
      const auto want_keys = ref::topk_keys(want, k);
      for (int i = 0; i < n; ++i) {
        const int t = t0 + i;
        SCOPED_TRACE("token " + std::to_string(t));
        for (int64_t c = 0; c < K; ++c) {
          const float e = c < keys ? want.data[i * keys + c] : kMinusInf;
          EXPECT_EQ(scores.data[t * K + c], e == kMinusInf ? 0.0f : e) << "key " << c;
        }
        std::vector<int> sorted = want_keys[i];
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(sel[t], sorted);
        EXPECT_EQ(static_cast<int>(sel[t].size()), std::min(k, b.keys_seen(t)));
      }
    }
    const Tensor probe = ref::selection_tensor(sel, k);
    EXPECT_EQ(ref::selection_of(probe), sel);
    EXPECT_EQ(probe.data[static_cast<size_t>(b.first_token(0) * k + k - 1)], -1.0f);  // token 0 sees 2 keys
  }
}

// The graph of a DSA model: the indexer's five stages between cache_write and attention, their probes, and
// attention reading topk; a dense model's graph has none of them.
TEST(StageGraphDsa, IndexerStagesAndProbes) {
  const auto dsa = preset("tiny-dsa");
  GraphShape g;
  g.tokens = 6;
  g.keys = 106;  // context 100 + 6 new tokens
  for (auto form : {AttentionForm::AttentionForm_mha, AttentionForm::AttentionForm_absorbed}) {
    g.form = form;
    const StageGraph G = build_graph(dsa, g);
    std::vector<std::string> names;
    for (const auto& st : G.stages) names.push_back(stage_name(st.stage));
    const auto at = [&](const char* n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
    EXPECT_LT(at("cache_write"), at("indexer_q"));
    EXPECT_LT(at("indexer_q"), at("indexer_k"));
    EXPECT_LT(at("index_scores"), at("topk"));
    const auto* attn = G.find_stage(form == AttentionForm::AttentionForm_mha ? Stage::Stage_attention_mha
                                                                            : Stage::Stage_attention_mqa);
    ASSERT_NE(attn, nullptr);
    EXPECT_EQ(attn->inputs.back(), "topk");
    EXPECT_EQ(G.find("idx_q")->shape, (std::vector<int64_t>{6, 4, 16}));
    EXPECT_EQ(G.find("idx_k")->shape, (std::vector<int64_t>{6, 16}));
    EXPECT_EQ(G.find("idx_weights")->shape, (std::vector<int64_t>{6, 4}));
    EXPECT_EQ(G.find("idx_scores")->shape, (std::vector<int64_t>{6, 106}));
    EXPECT_EQ(G.find("topk")->shape, (std::vector<int64_t>{6, 12}));
    for (const char* p : {"idx_q", "idx_k", "idx_weights", "idx_scores", "topk"})
      EXPECT_EQ(G.find(p)->contract, Contract::Contract_replicated) << p;
    const StageGraph dense = build_graph(preset("tiny"), g);
    for (const char* p : {"idx_q", "idx_k", "idx_weights", "idx_scores", "topk"})
      EXPECT_EQ(dense.find(p), nullptr) << p;
  }
  std::vector<std::string> weights;
  for (const auto& w : build_weights(dsa, g)) weights.push_back(w.name);
  for (const char* w : {"indexer.wq_b", "indexer.wk", "indexer.k_norm", "indexer.k_norm_bias", "indexer.weights_proj"})
    EXPECT_NE(std::find(weights.begin(), weights.end(), w), weights.end()) << w;
}

}  // namespace
}  // namespace mla::test
