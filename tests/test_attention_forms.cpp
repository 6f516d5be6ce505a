// End-to-end equivalences of the reference engine through the Runner: the absorbed (MQA) form
// equals the prefill (MHA) form; decode and chunked prefill over a cache built from a prefill equal that
// prefill's rows; tp 2/4/5/8 equals tp 1; stacked layers compose as h_out = h + o(RMSNorm(h)).
//
// Tolerance: relative L2 <= 1e-5 (kTol). Two forms or two TP layouts of the same FP32 computation differ only
// in rounding order: reductions of at most 64 terms (tiny's hidden size) give ~sqrt(K)·u = 5e-7 typical and
// K·u = 4e-6 worst case, and softmax adds |score|·u with scores of a few units. Any real bug (a wrong head
// block, a missing cache row, a mis-absorbed W_UK) is of order 1e-2 or larger.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/inputs.h"
#include "core/model/stage_graph.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "core/probe/probe.h"
#include "reference/reference_engine.h"
#include "reference/stages.h"
#include "tests/stage_test_util.h"

namespace {

using namespace mla;
using namespace mla::test;

constexpr double kTol = 1e-5;
constexpr uint64_t kSeeds[] = {1, 2, 3};

// Tiny without q LoRA (the q_proj path of DeepSeek-V2-Lite).
MlaConfig tiny_no_q_lora() {
  auto c = preset("tiny");
  c.name = "tiny-no-q-lora";
  c.q_lora_rank = 0;
  c.derive();
  return c;
}

// Tiny with 20 heads, like GLM-4.7-Flash: tp 4 and 5 divide it, 8 does not.
MlaConfig tiny_20_heads() {
  auto c = preset("tiny");
  c.name = "tiny-20-heads";
  c.heads = 20;
  c.derive();
  return c;
}

// Keeps every probe record in full, by (layer, probe, rank).
class CaptureSink : public ProbeSink {
 public:
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override {
    EXPECT_EQ(rec.level, ProbeLevel::ProbeLevel_full) << spec.name;
    EXPECT_EQ(rec.data.shape, rec.shape) << spec.name;
    probes_[{layer, spec.name, rank}] = rec.data;
  }
  void finish(const std::string& status) override { status_ = status; }
  const Tensor& get(int layer, const std::string& name, int rank = 0) const {
    auto it = probes_.find({layer, name, rank});
    if (it == probes_.end())
      throw std::runtime_error("no probe layer" + std::to_string(layer) + "/" + name + " rank " + std::to_string(rank));
    return it->second;
  }
  bool has(int layer, const std::string& name, int rank = 0) const { return probes_.count({layer, name, rank}) > 0; }
  const std::string& status() const { return status_; }

 private:
  std::map<std::tuple<int, std::string, int>, Tensor> probes_;
  std::string status_;
};

struct RunResult {
  StageGraph graph;
  CaptureSink sink;
};

RunResult run_reference(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& w,
                        const Inputs& in) {
  Runner runner(cfg, spec);
  ReferenceEngine engine(std::map<std::string, std::string>{});
  ProbePlan plan;
  plan.level = ProbeLevel::ProbeLevel_full;
  RunResult r;
  r.graph = runner.graph();
  runner.run(engine, w, in, plan, r.sink);
  EXPECT_EQ(r.sink.status(), "complete");
  return r;
}

Tensor rows(const Tensor& x, int64_t r0, int64_t n) {
  auto shape = x.shape;
  shape[0] = n;
  Tensor out(shape);
  const int64_t per = x.numel() / x.dim(0);
  std::memcpy(out.ptr(), x.ptr() + r0 * per, sizeof(float) * n * per);
  return out;
}

// rel_l2 = ‖got − want‖ / ‖want‖, with the worst element's coordinates on failure.
void expect_rel(const Tensor& got, const Tensor& want, const std::string& what, double tol = kTol) {
  ASSERT_EQ(got.shape, want.shape) << what;
  double num = 0, den = 0, worst = -1;
  int64_t wi = 0, nonfinite = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data[i], w = want.data[i];
    if (!std::isfinite(g) || !std::isfinite(w)) {
      nonfinite += !(g == w);
      continue;
    }
    num += (g - w) * (g - w);
    den += w * w;
    if (std::fabs(g - w) > worst) worst = std::fabs(g - w), wi = i;
  }
  EXPECT_EQ(nonfinite, 0) << what << ": non-finite values that differ";
  ASSERT_GT(den, 0.0) << what << ": the expectation is all zero; the comparison would prove nothing";
  const double rel = std::sqrt(num / den);
  EXPECT_LE(rel, tol) << what << ": rel_l2 " << rel << ", worst at " << coords(got.shape, wi) << " got "
                      << got.data[wi] << " want " << want.data[wi];
}

double rel_diff(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += std::pow(double(a.data[i]) - b.data[i], 2);
    den += std::pow(double(b.data[i]), 2);
  }
  return std::sqrt(num / den);
}

// ---------- absorbed form == MHA form ----------

void expect_forms_agree(const MlaConfig& cfg, RunSpec spec, uint64_t weight_seed) {
  const auto weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, weight_seed);
  spec.form = AttentionForm::AttentionForm_mha;
  const Inputs in = synthetic_inputs(cfg, spec, weights);
  const auto mha = run_reference(cfg, spec, weights, in);
  spec.form = AttentionForm::AttentionForm_absorbed;
  const auto abs = run_reference(cfg, spec, weights, in);
  ASSERT_FALSE(mha.sink.has(0, "q_latent"));
  ASSERT_TRUE(abs.sink.has(0, "q_latent"));
  for (int l = 0; l < spec.layers; ++l)
    for (const char* p : {"attn_out", "lse", "o_partial", "o"}) {
      SCOPED_TRACE(std::string("layer ") + std::to_string(l) + " probe " + p);
      expect_rel(abs.sink.get(l, p), mha.sink.get(l, p), p);
    }
}

TEST(AttentionForms, AbsorbedEqualsMhaOnPrefill) {
  for (const auto& cfg : {preset("tiny"), tiny_no_q_lora()}) {
    SCOPED_TRACE(cfg.name);
    for (uint64_t seed : kSeeds)
      for (auto [T, B] : {std::pair{1, 1}, std::pair{9, 2}, std::pair{70, 1}}) {
        SCOPED_TRACE(seed_trace(seed) + ", tokens " + std::to_string(T) + ", batch " + std::to_string(B));
        RunSpec spec;
        spec.mode = Mode::Mode_prefill;
        spec.tokens = T;
        spec.batch = B;
        spec.seed = seed;
        expect_forms_agree(cfg, spec, seed + 100);
      }
  }
}

TEST(AttentionForms, AbsorbedEqualsMhaWithCachedContext) {
  const auto cfg = preset("tiny");
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    RunSpec decode;
    decode.mode = Mode::Mode_decode;
    decode.tokens = 1;
    decode.batch = 3;
    decode.context = {200, 64, 0};
    decode.seed = seed;
    {
      SCOPED_TRACE("decode");
      expect_forms_agree(cfg, decode, seed + 100);
    }
    RunSpec chunked;
    chunked.mode = Mode::Mode_chunked;
    chunked.tokens = 7;
    chunked.batch = 2;
    chunked.context = {100, 60};
    chunked.seed = seed;
    {
      SCOPED_TRACE("chunked");
      expect_forms_agree(cfg, chunked, seed + 100);
    }
  }
}

// ---------- decode and chunked prefill == rows of a full prefill ----------

struct Prefill {
  Inputs in;
  RunResult run;
};

Prefill full_prefill(const MlaConfig& cfg, const std::vector<LayerWeights>& w, int tokens, uint64_t seed) {
  RunSpec s;
  s.mode = Mode::Mode_prefill;
  s.form = AttentionForm::AttentionForm_mha;
  s.tokens = tokens;
  s.seed = seed;
  Prefill p;
  p.in = synthetic_inputs(cfg, s, w);
  p.run = run_reference(cfg, s, w, p.in);
  return p;
}

// Sequence s of a step: its cache holds the first `ctx` rows [kv_c_norm | k_pe_rope] of prefill `src`, and its
// new tokens are that prefill's tokens ctx .. ctx+n−1 (same x, same positions).
struct Piece {
  const Prefill* src;
  int ctx;
  int n;
};

Inputs step_from_prefills(const MlaConfig& cfg, const std::vector<Piece>& pieces, uint64_t seed) {
  std::vector<int> news, ctxs;
  for (auto& p : pieces) news.push_back(p.n), ctxs.push_back(p.ctx);
  Inputs in;
  in.batch = shuffled_batch(news, ctxs, seed);
  const auto& b = in.batch;
  const int64_t H = cfg.hidden, L = cfg.kv_lora_rank, R = cfg.qk_rope, W = L + R;
  in.x = Tensor({b.tokens(), H});
  // NaN everywhere a step must not read: a wrong page or slot poisons the output instead of passing quietly.
  Tensor cache({b.num_blocks, kPageSize, W}, std::numeric_limits<float>::quiet_NaN());
  for (int s = 0, t0 = 0; s < b.num_seqs(); t0 += b.new_lens[s], ++s) {
    const auto& src = *pieces[s].src;
    std::memcpy(in.x.ptr() + t0 * H, src.in.x.ptr() + pieces[s].ctx * H, sizeof(float) * pieces[s].n * H);
    const Tensor& kv = src.run.sink.get(0, "kv_c_norm");
    const Tensor& pe = src.run.sink.get(0, "k_pe_rope");
    for (int c = 0; c < pieces[s].ctx; ++c) {
      float* row = cache.ptr() + (static_cast<int64_t>(b.page(s, c)) * kPageSize + c % kPageSize) * W;
      std::memcpy(row, kv.ptr() + c * L, sizeof(float) * L);
      std::memcpy(row + L, pe.ptr() + c * R, sizeof(float) * R);
    }
  }
  in.kv_cache.push_back(std::move(cache));
  return in;
}

void expect_step_matches_prefills(const MlaConfig& cfg, const std::vector<LayerWeights>& w, Mode mode,
                                  AttentionForm form, const std::vector<Piece>& pieces, uint64_t seed) {
  const Inputs in = step_from_prefills(cfg, pieces, seed);
  RunSpec spec;
  spec.mode = mode;
  spec.form = form;
  spec.tokens = pieces[0].n;
  spec.batch = static_cast<int>(pieces.size());
  for (auto& p : pieces) spec.context.push_back(p.ctx);
  spec.seed = seed;
  const auto step = run_reference(cfg, spec, w, in);
  for (int s = 0, t0 = 0; s < static_cast<int>(pieces.size()); t0 += pieces[s].n, ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s) + ": context " + std::to_string(pieces[s].ctx) + ", " +
                 std::to_string(pieces[s].n) + " new");
    const auto& full = pieces[s].src->run.sink;
    for (const char* p : {"q_pe_rope", "k_pe_rope", "kv_cache", "attn_out", "lse", "o"}) {
      SCOPED_TRACE(p);
      expect_rel(rows(step.sink.get(0, p), t0, pieces[s].n), rows(full.get(0, p), pieces[s].ctx, pieces[s].n), p);
    }
  }
}

TEST(AttentionForms, DecodeOverPrefillCacheEqualsPrefillRow) {
  const auto cfg = preset("tiny");
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    const auto w = synthetic_weights(cfg, 1, false, seed + 100);
    // One sequence per t: decode token t with tokens 0..t−1 cached (t = 0: empty cache; 63/64/130: page edges).
    std::vector<Prefill> prefills;
    const std::vector<int> ts = {0, 1, 63, 64, 130};
    for (size_t i = 0; i < ts.size(); ++i) prefills.push_back(full_prefill(cfg, w, ts[i] + 1, seed * 10 + i));
    std::vector<Piece> pieces;
    for (size_t i = 0; i < ts.size(); ++i) pieces.push_back({&prefills[i], ts[i], 1});
    for (auto form : {AttentionForm::AttentionForm_absorbed, AttentionForm::AttentionForm_mha}) {
      SCOPED_TRACE(form_name(form));
      expect_step_matches_prefills(cfg, w, Mode::Mode_decode, form, pieces, seed);
      // Each sequence alone, too: a batch must not be what makes it pass.
      expect_step_matches_prefills(cfg, w, Mode::Mode_decode, form, {pieces[3]}, seed + 1);
    }
  }
}

TEST(AttentionForms, ChunkedPrefillEqualsPrefillRows) {
  const auto cfg = preset("tiny");
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    const auto w = synthetic_weights(cfg, 1, false, seed + 100);
    const Prefill a = full_prefill(cfg, w, 90, seed * 10);
    const Prefill b = full_prefill(cfg, w, 80, seed * 10 + 1);
    // Context 37 (within a page), 64 (a page boundary), 0 (a plain prefill chunk), all with 11 new tokens.
    const std::vector<Piece> pieces = {{&a, 37, 11}, {&b, 64, 11}, {&a, 0, 11}};
    for (auto form : {AttentionForm::AttentionForm_mha, AttentionForm::AttentionForm_absorbed}) {
      SCOPED_TRACE(form_name(form));
      expect_step_matches_prefills(cfg, w, Mode::Mode_chunked, form, pieces, seed);
      expect_step_matches_prefills(cfg, w, Mode::Mode_chunked, form, {{&a, 79, 11}}, seed + 1);
    }
  }
}

// ---------- tensor parallelism ----------

// Concatenates rank shards along `axis` (the heads axis).
Tensor gather_heads(const std::vector<const Tensor*>& shards, int axis) {
  auto shape = shards[0]->shape;
  const int64_t outer = shape_numel({shape.begin(), shape.begin() + axis});
  const int64_t block = shards[0]->numel() / outer;
  shape[axis] *= static_cast<int64_t>(shards.size());
  Tensor out(shape);
  for (int64_t o = 0; o < outer; ++o)
    for (size_t r = 0; r < shards.size(); ++r)
      std::memcpy(out.ptr() + (o * shards.size() + r) * block, shards[r]->ptr() + o * block, sizeof(float) * block);
  return out;
}

void expect_tp_matches_tp1(const MlaConfig& cfg, RunSpec spec, const std::vector<int>& tps) {
  const auto w = synthetic_weights(cfg, 1, false, spec.seed + 100);
  spec.tp = 1;
  const Inputs in = synthetic_inputs(cfg, spec, w);
  const auto base = run_reference(cfg, spec, w, in);
  for (int tp : tps) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    spec.tp = tp;
    const auto run = run_reference(cfg, spec, w, in);
    for (const auto& p : run.graph.probes) {
      SCOPED_TRACE("probe " + p.name + " (" + contract_name(p.contract) + ")");
      const Tensor& want = base.sink.get(0, p.name);
      std::vector<const Tensor*> shards;
      for (int r = 0; r < tp; ++r) shards.push_back(&run.sink.get(0, p.name, r));
      for (int r = 0; r < tp; ++r) ASSERT_EQ(shards[r]->shape, local_shape(p, tp)) << "rank " << r;
      switch (p.contract) {
        case Contract::Contract_replicated:
          for (int r = 0; r < tp; ++r) {
            SCOPED_TRACE("rank " + std::to_string(r));
            expect_rel(*shards[r], want, p.name);
            expect_identical(*shards[r], *shards[0], p.name + " (replicas must agree)");
          }
          break;
        case Contract::Contract_heads: expect_rel(gather_heads(shards, p.heads_axis), want, p.name); break;
        case Contract::Contract_partial: {
          Tensor sum = *shards[0];
          for (int r = 1; r < tp; ++r)
            for (int64_t i = 0; i < sum.numel(); ++i) sum.data[i] += shards[r]->data[i];
          expect_rel(sum, want, p.name + " summed over ranks");
          // A partial is a partial: each rank alone must not already be the whole sum.
          if (tp > 1) EXPECT_GT(rel_diff(*shards[0], want), 1e-3);
          break;
        }
      }
    }
    expect_rel(run.sink.get(0, "o", tp - 1), base.sink.get(0, "o"), "o on the last rank");
  }
}

TEST(AttentionForms, TensorParallelEqualsTp1) {
  struct Case {
    const char* what;
    Mode mode;
    AttentionForm form;
    int tokens, batch;
    std::vector<int> context;
  };
  const std::vector<Case> cases = {
      {"prefill mha", Mode::Mode_prefill, AttentionForm::AttentionForm_mha, 9, 2, {}},
      {"prefill absorbed", Mode::Mode_prefill, AttentionForm::AttentionForm_absorbed, 9, 1, {}},
      {"decode absorbed", Mode::Mode_decode, AttentionForm::AttentionForm_absorbed, 1, 2, {70, 5}},
      {"decode mha", Mode::Mode_decode, AttentionForm::AttentionForm_mha, 1, 1, {70}},
      {"chunked mha", Mode::Mode_chunked, AttentionForm::AttentionForm_mha, 5, 1, {40}},
  };
  for (uint64_t seed : {1, 2}) {
    SCOPED_TRACE(seed_trace(seed));
    for (const auto& c : cases) {
      SCOPED_TRACE(c.what);
      RunSpec spec;
      spec.mode = c.mode;
      spec.form = c.form;
      spec.tokens = c.tokens;
      spec.batch = c.batch;
      spec.context = c.context;
      spec.seed = seed;
      {
        SCOPED_TRACE("tiny, 8 heads");
        expect_tp_matches_tp1(preset("tiny"), spec, {2, 4, 8});
      }
      {
        SCOPED_TRACE("20 heads");
        expect_tp_matches_tp1(tiny_20_heads(), spec, {2, 4, 5});
      }
    }
  }
}

// ---------- stacked layers ----------

TEST(AttentionForms, StackedLayersComposeThroughTheResidual) {
  const auto cfg = preset("tiny");
  const int layers = 3;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    for (auto [mode, context] : {std::pair{Mode::Mode_prefill, 0}, std::pair{Mode::Mode_chunked, 70}}) {
      SCOPED_TRACE(mode_name(mode));
      RunSpec spec;
      spec.mode = mode;
      spec.form = AttentionForm::AttentionForm_mha;
      spec.tokens = 6;
      spec.layers = layers;
      if (context) spec.context = {context};
      spec.seed = seed;
      ASSERT_TRUE(spec.graph_shape().input_norm) << "--layers > 1 must start every layer at h";
      const auto w = synthetic_weights(cfg, layers, true, seed + 100);
      const Inputs in = synthetic_inputs(cfg, spec, w);
      const auto run = run_reference(cfg, spec, w, in);
      const auto& b = in.batch;

      // The same layer by hand from the stage functions: x = RMSNorm(h; input_norm), ..., h_out = h + o.
      // Identical functions on identical inputs, so the only slack is Eigen's kernel choice: 1e-6.
      Tensor h = in.x;
      for (int l = 0; l < layers; ++l) {
        SCOPED_TRACE("layer " + std::to_string(l));
        if (l == 0) expect_identical(run.sink.get(0, "h"), in.x, "layer 0 h is the input");
        else expect_identical(run.sink.get(l, "h"), run.sink.get(l - 1, "h_out"), "h is the previous layer's h_out");
        const auto& W = w[l];
        const Tensor x = ref::rms_norm(h, W.input_norm, cfg.rms_eps);
        const Tensor q_c = ref::rms_norm(ref::linear(x, W.q_a_proj), W.q_a_norm, cfg.rms_eps);
        const auto q = ref::q_b_proj(q_c, W.q_b_proj, cfg);
        const auto kva = ref::kv_a_proj(x, W.kv_a_proj, cfg);
        const Tensor kv_c_norm = ref::rms_norm(kva.kv_c, W.kv_a_norm, cfg.rms_eps);
        const Tensor q_pe_rope = ref::rope(q.q_pe, b.positions, cfg.inv_freq, cfg.rope_mscale, cfg.rope_style);
        const Tensor k_pe_rope = ref::rope(kva.k_pe, b.positions, cfg.inv_freq, cfg.rope_mscale, cfg.rope_style);
        Tensor cache = in.kv_cache[l];
        ref::cache_write(cache, b, kv_c_norm, k_pe_rope);
        const auto kvb = ref::kv_b_proj(kv_c_norm, W.kv_b_proj, cfg);
        const auto a = ref::attention_mha(q.q_nope, q_pe_rope, kvb.k_nope, k_pe_rope, kvb.v, cache, b, W.kv_b_proj, cfg);
        const Tensor o_partial = ref::o_proj(a.out, W.o_proj);
        const Tensor o = ref::all_reduce({&o_partial});
        const Tensor h_out = ref::residual(h, o);
        expect_rel(run.sink.get(l, "x"), x, "x", 1e-6);
        expect_rel(run.sink.get(l, "attn_out"), a.out, "attn_out", 1e-6);
        expect_rel(run.sink.get(l, "o"), o, "o", 1e-6);
        expect_rel(run.sink.get(l, "h_out"), h_out, "h_out", 1e-6);
        // The probe h_out really is h + o of the same run.
        expect_rel(run.sink.get(l, "h_out"), ref::residual(run.sink.get(l, "h"), run.sink.get(l, "o")), "h + o", 1e-6);
        EXPECT_GT(rel_diff(h_out, h), 1e-3) << "o is negligible: the stacking test would prove nothing";
        if (l > 0) EXPECT_GT(rel_diff(run.sink.get(l, "x"), run.sink.get(l - 1, "x")), 1e-3);
        h = h_out;
      }
    }
  }
}

}  // namespace
