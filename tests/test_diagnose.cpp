// Diagnosis rules on synthetic pairs (label cpu, in process): a reference tensor and a candidate with one planted
// bug, built here with realistic magnitudes and a fixed seed (the candidate rounded to bf16 as an engine's would
// be), recorded as probes, compared like dumps and diagnosed. Each rule names its pattern with its evidence; the
// softmax-scale rule stays silent on unwritten rows, a sliding window and scattered token errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/bisect/zoo.h"
#include "harness/compare/compare.h"
#include "harness/compare/diagnose.h"
#include "core/model/batch.h"
#include "core/model/injection.h"
#include "core/model/stage_graph.h"
#include "core/probe/probe.h"

namespace {

using namespace mla;

// Every test seeds it first: its data does not depend on which tests ran before.
std::mt19937_64& rng() {
  static std::mt19937_64 g(1);
  return g;
}

Tensor randn(std::vector<int64_t> shape, double sigma = 1.0) {
  Tensor t(std::move(shape));
  std::normal_distribution<float> nd(0.0f, static_cast<float>(sigma));
  for (auto& x : t.data) x = nd(rng());
  return t;
}

float bf16(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  u &= 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

Tensor rounded(Tensor t) {
  for (auto& x : t.data) x = bf16(x);
  return t;
}

// Causal attention of q, k [T, N, D] and v [T, N, V] for one sequence: out [T, N, V] and lse [T, N]. window > 0:
// only the last `window` keys; causal false: every key.
struct Attn {
  Tensor out, lse;
};
Attn attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, int window = 0, bool causal = true) {
  const int64_t T = q.dim(0), N = q.dim(1), D = q.dim(2), V = v.dim(2);
  Attn a{Tensor({T, N, V}), Tensor({T, N})};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h) {
      std::vector<double> s(T, -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < T; ++j) {
        if (causal && j > t) continue;
        if (window > 0 && t - j >= window) continue;
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += q.data[(t * N + h) * D + i] * k.data[(j * N + h) * D + i];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < T; ++j) z += std::exp(s[j] - mx);
      for (int64_t j = 0; j < T; ++j) {
        const double p = std::exp(s[j] - mx) / z;
        for (int64_t i = 0; i < V; ++i) a.out.data[(t * N + h) * V + i] += static_cast<float>(p * v.data[(j * N + h) * V + i]);
      }
      a.lse.data[t * N + h] = static_cast<float>(mx + std::log(z));
    }
  return a;
}

// RMSNorm of x [T, C] with the mean square over the first `width` channels (0: all), times w (empty: no weight).
Tensor rms_norm(const Tensor& x, const std::vector<float>& w, int64_t width = 0) {
  const int64_t T = x.dim(0), C = x.dim(1), W = width > 0 ? width : C;
  Tensor y({T, C});
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t c = 0; c < W; ++c) ss += x.data[t * C + c] * x.data[t * C + c];
    const double inv = 1.0 / std::sqrt(ss / W + 1e-6);
    for (int64_t c = 0; c < C; ++c) y.data[t * C + c] = static_cast<float>(x.data[t * C + c] * inv * (w.empty() ? 1.0f : w[c]));
  }
  return y;
}

// RoPE of x [T, N, R] at the given positions: pairs (2i, 2i+1) (interleaved) or (i, i + R/2) (rotate-half).
Tensor rope(const Tensor& x, const std::vector<int>& pos, bool neox) {
  const int64_t T = x.dim(0), N = x.dim(1), R = x.dim(2);
  Tensor y = x;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h)
      for (int64_t i = 0; i < R / 2; ++i) {
        const double th = pos[t] * std::pow(1e4, -2.0 * i / R);
        const int64_t a = neox ? i : 2 * i, b = neox ? i + R / 2 : 2 * i + 1;
        const float* px = &x.data[(t * N + h) * R];
        float* py = &y.data[(t * N + h) * R];
        py[a] = static_cast<float>(px[a] * std::cos(th) - px[b] * std::sin(th));
        py[b] = static_cast<float>(px[a] * std::sin(th) + px[b] * std::cos(th));
      }
  return y;
}

// o [T, H] = Σ over `heads` of W[:, h·V:(h+1)·V] attn[t, h, :] (a head listed twice counts twice).
Tensor o_proj(const Tensor& attn, const Tensor& w, const std::vector<int64_t>& heads) {
  const int64_t T = attn.dim(0), N = attn.dim(1), V = attn.dim(2), H = w.dim(0);
  Tensor o({T, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H; ++j) {
      double s = 0;
      for (int64_t h : heads)
        for (int64_t i = 0; i < V; ++i) s += w.data[j * N * V + h * V + i] * attn.data[(t * N + h) * V + i];
      o.data[t * H + j] = static_cast<float>(s);
    }
  return o;
}

std::vector<int64_t> all_heads(int64_t n) {
  std::vector<int64_t> h(n);
  for (int64_t i = 0; i < n; ++i) h[i] = i;
  return h;
}

Batch one_sequence(int T) {
  Batch b;
  for (int t = 0; t < T; ++t) {
    b.positions.push_back(t);
    b.token_seq.push_back(0);
  }
  b.new_lens = {T};
  b.context_lens = {0};
  return b;
}

// A candidate and a reference dump built probe by probe, compared at bf16-sized tolerances.
struct Pair {
  Dump cand, ref;
  Batch batch = one_sequence(16);
  Tolerance tol{4e-3, 8e-3, "test: bf16-sized"};
  int order = 0;

  // `cand` gets bf16 rounding; heads probes are split over `tp` ranks by heads, partial probes take `cand_parts`
  // and `ref_parts` (one per rank) instead.
  void add(const std::string& name, Stage stage, Contract contract, const Tensor& c, const Tensor& r, int heads_axis = -1,
           int rope_from = -1, int tp = 1) {
    ProbeSpec ps{name, stage, contract, r.shape, heads_axis, rope_from, order++};
    cand.probes.push_back(record(ps, {rounded(c)}, tp));
    ref.probes.push_back(record(ps, {r}, tp));
  }
  void add_partial(const std::string& name, Stage stage, const std::vector<Tensor>& c, const std::vector<Tensor>& r) {
    ProbeSpec ps{name, stage, Contract::Contract_partial, r[0].shape, -1, -1, order++};
    std::vector<Tensor> cr;
    for (auto& t : c) cr.push_back(rounded(t));
    cand.probes.push_back(record(ps, cr, static_cast<int>(r.size())));
    ref.probes.push_back(record(ps, r, static_cast<int>(r.size())));
  }
  static DumpProbe record(const ProbeSpec& ps, const std::vector<Tensor>& data, int tp) {
    DumpProbe p;
    p.name = ps.name;
    p.stage = stage_name(ps.stage);
    p.contract = contract_name(ps.contract);
    p.shape = ps.shape;
    p.order = ps.order;
    p.heads_axis = ps.heads_axis;
    p.rope_from = ps.rope_from;
    p.engine_dtype = "fp32";
    for (int k = 0; k < tp; ++k) {
      Tensor local;
      if (ps.contract == Contract::Contract_partial) {
        local = data[k];
      } else if (ps.contract == Contract::Contract_heads) {
        // Rank k's heads of [T, N, X] (or [T, N]).
        const auto ls = local_shape(ps, tp);
        local = Tensor(ls);
        const int64_t T = ps.shape[0], N = ps.shape[1], X = shape_numel(ps.shape) / (T * N), n = N / tp;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < n; ++h)
            for (int64_t x = 0; x < X; ++x)
              local.data[(t * n + h) * X + x] = data[0].data[(t * N + k * n + h) * X + x];
      } else {
        local = data[0];
      }
      p.ranks.push_back(compute_probe_record(local, "fp32", make_probe_request(ps, tp, k, ProbeLevel::ProbeLevel_full)));
    }
    return p;
  }
  Diagnosis diagnose(const std::string& name) const {
    ToleranceModel tm;
    tm.fallback = tol;
    const CompareReport rep = compare_dumps(cand, ref, tm);
    for (const auto& r : rep.results)
      if (r.name == name) {
        EXPECT_NE(r.verdict, Verdict::Verdict_pass) << name << " should diverge: " << r.why;
        return mla::diagnose(r, r.m, r.tol, batch, rep);
      }
    ADD_FAILURE() << "no probe " << name;
    return {};
  }
};

std::string dump(const Diagnosis& d) {
  std::string s = "pattern (" + d.confidence + "): " + d.pattern;
  for (auto& e : d.evidence) s += "\n  - " + e;
  return s;
}

bool has(const Diagnosis& d, const std::string& words) { return d.pattern.find(words) != std::string::npos; }
bool evidence_has(const Diagnosis& d, const std::string& words) {
  for (auto& e : d.evidence)
    if (e.find(words) != std::string::npos) return true;
  return false;
}

void expect(const Diagnosis& d, std::initializer_list<const char*> words, std::initializer_list<const char*> absent = {}) {
  for (const char* w : words) EXPECT_TRUE(has(d, w)) << "missing '" << w << "' in\n" << dump(d);
  for (const char* w : absent) EXPECT_FALSE(has(d, w)) << "unexpected '" << w << "' in\n" << dump(d);
}

// Attention of a 16-token prefill with 8 heads: q·k of 24 lanes, v of 16, the softmax scale 1/sqrt(24) times a
// YaRN mscale² of 1.297 (as DeepSeek configs have).
struct AttnSetup {
  Tensor q = randn({16, 8, 24}), k = randn({16, 8, 24}), v = randn({16, 8, 16});
  double scale = 1.297 / std::sqrt(24.0);
};

// ---------------------------------------------------------------------------------------------------------------
// Token structure at attention: the softmax scale against look-alikes.
// ---------------------------------------------------------------------------------------------------------------

TEST(DiagnoseTokens, SoftmaxScaleNeedsEveryLaterTokenOffSmoothly) {
  rng().seed(1001);
  const AttnSetup s;
  Pair p;
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, attention(s.q, s.k, s.v, s.scale / 1.297).out,
        attention(s.q, s.k, s.v, s.scale).out, 1);
  const Diagnosis d = p.diagnose("attn_out");
  expect(d, {"softmax scale"});
  EXPECT_EQ(d.confidence, "unconfirmed");  // a pattern is never proof of a cause
  EXPECT_EQ(d.fit, "high");
  EXPECT_TRUE(evidence_has(d, "per-token error profile")) << dump(d);
}

TEST(DiagnoseTokens, SoftmaxScaleWhenNoSingleTokenCrossesItsTolerance) {
  // A small scale error: the probe diverges on the whole, no token on its own (a calibrated per-token tolerance is
  // often several times the whole's).
  rng().seed(1100);
  const AttnSetup s;
  Pair p;
  p.tol = {4e-3, 0.5, "test: loose per-token tolerance"};
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, attention(s.q, s.k, s.v, s.scale / 1.1).out,
        attention(s.q, s.k, s.v, s.scale).out, 1);
  const Diagnosis d = p.diagnose("attn_out");
  expect(d, {"the softmax scale"});
  EXPECT_TRUE(evidence_has(d, "0 of 15 later tokens off, 15 of them above 3x position 0")) << dump(d);
}

TEST(DiagnoseTokens, OneHeadsSoftmaxScaleIsThatHead) {
  rng().seed(1101);
  const AttnSetup s;
  const Tensor ref = attention(s.q, s.k, s.v, s.scale).out, wrong = attention(s.q, s.k, s.v, s.scale / 1.297).out;
  Tensor cand = ref;
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t i = 0; i < 16; ++i) cand.data[(t * 8 + 3) * 16 + i] = wrong.data[(t * 8 + 3) * 16 + i];
  Pair p;
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, cand, ref, 1);
  expect(p.diagnose("attn_out"), {"a single head off (head 3"}, {"softmax"});
}

TEST(DiagnoseTokens, UnwrittenRowsAreTruncationNotSoftmaxScale) {
  rng().seed(1002);
  const AttnSetup s;
  const Tensor ref = attention(s.q, s.k, s.v, s.scale).out;
  Tensor cand = ref;
  for (int64_t i = 11 * 8 * 16; i < cand.numel(); ++i) cand.data[i] = 0;  // rows 11-15 never written
  Pair p;
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, cand, ref, 1);
  const Diagnosis d = p.diagnose("attn_out");
  expect(d, {"never written", "from token 11"}, {"softmax"});
  EXPECT_TRUE(evidence_has(d, "tokens 11-15")) << dump(d);
}

TEST(DiagnoseTokens, UnwrittenHeadIsNamed) {
  rng().seed(1003);
  const AttnSetup s;
  const Tensor ref = attention(s.q, s.k, s.v, s.scale).out;
  Tensor cand = ref;
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t i = 0; i < 16; ++i) cand.data[(t * 8 + 5) * 16 + i] = 0;
  Pair p;
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, cand, ref, 1);
  expect(p.diagnose("attn_out"), {"head 5 never written"}, {"softmax"});
}

TEST(DiagnoseTokens, SlidingWindowIsAMaskNotSoftmaxScale) {
  rng().seed(1004);
  const AttnSetup s;
  Pair p;
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, attention(s.q, s.k, s.v, s.scale, 6).out,
        attention(s.q, s.k, s.v, s.scale).out, 1);
  const Diagnosis d = p.diagnose("attn_out");
  expect(d, {"error starts at position 6", "sliding window"}, {"softmax"});
}

TEST(DiagnoseTokens, ScatteredTokenErrorsAreNotSoftmaxScale) {
  rng().seed(1005);
  const AttnSetup s;
  const Tensor ref = attention(s.q, s.k, s.v, s.scale).out;
  Tensor cand = ref;
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int64_t t : {3, 9, 12})
    for (int64_t i = 0; i < 8 * 16; ++i) cand.data[t * 128 + i] += nd(rng()) * std::fabs(ref.data[t * 128 + i]) + nd(rng()) * 0.02f;
  Pair p;
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, cand, ref, 1);
  const Diagnosis d = p.diagnose("attn_out");
  expect(d, {"scattered tokens off (3, 9, 12)"}, {"softmax"});
}

TEST(DiagnoseTokens, EveryLaterTokenOffAtRandomLevelsIsNotSoftmaxScale) {
  rng().seed(1006);
  // Position 0 exact and every later token off, but at levels that jump from token to token.
  const AttnSetup s;
  const Tensor ref = attention(s.q, s.k, s.v, s.scale).out;
  Tensor cand = ref;
  std::uniform_real_distribution<float> level(-1.7f, -0.5f);  // 2% to 30%, log-uniform
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t t = 1; t < 16; ++t) {
    const float rel = std::pow(10.0f, level(rng()));
    for (int64_t i = 0; i < 128; ++i) cand.data[t * 128 + i] *= 1 + rel * nd(rng());
  }
  Pair p;
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, cand, ref, 1);
  expect(p.diagnose("attn_out"), {"position 0 exact", "not as a wrong scale moves the outputs"}, {"softmax scale"});
}

TEST(DiagnoseTokens, CausalMaskMissingLeavesTheLastTokenExact) {
  rng().seed(1007);
  const AttnSetup s;
  Pair p;
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads,
        attention(s.q, s.k, s.v, s.scale, 0, false).out, attention(s.q, s.k, s.v, s.scale).out, 1);
  expect(p.diagnose("attn_out"), {"causal mask"}, {"softmax"});
}

TEST(DiagnoseTokens, PagingOnlySequencesLongerThanAPage) {
  rng().seed(1008);
  RunSpec spec;
  spec.mode = Mode::Mode_decode;
  spec.form = AttentionForm::AttentionForm_absorbed;
  spec.tokens = 1;
  spec.batch = 2;
  spec.context = {40, 200};
  Pair p;
  p.batch = make_batch(spec);
  const Tensor ref = randn({2, 8, 32}, 0.5);
  Tensor cand = ref;
  std::normal_distribution<float> nd(0.0f, 0.2f);
  for (int64_t i = 8 * 32; i < 2 * 8 * 32; ++i) cand.data[i] += nd(rng());  // the 200-token sequence's row
  p.add("attn_latent", Stage::Stage_attention_mqa, Contract::Contract_heads, cand, ref, 1);
  const Diagnosis d = p.diagnose("attn_latent");
  expect(d, {"paging"});
  EXPECT_TRUE(evidence_has(d, "1 of 1 off (median rel_l2")) << dump(d);
}

// Two sequences of 8 new tokens, the second after 30 cached ones (a chunked prefill).
Batch two_sequences() {
  Batch b;
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < 8; ++i) {
      b.positions.push_back(s * 30 + i);
      b.token_seq.push_back(s);
    }
  b.new_lens = {8, 8};
  b.context_lens = {0, 30};
  return b;
}

TEST(DiagnoseTokens, ContextMergeWhenNoSingleTokenCrossesItsTolerance) {
  rng().seed(1102);
  const Tensor ref = randn({16, 8, 16}, 0.5);
  Tensor cand = ref;
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (int64_t i = 8 * 128; i < 16 * 128; ++i) cand.data[i] *= 1 + nd(rng());  // the second sequence 2% off
  Pair p;
  p.batch = two_sequences();
  p.tol = {4e-3, 0.1, "test: loose per-token tolerance"};
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, cand, ref, 1);
  const Diagnosis d = p.diagnose("attn_out");
  expect(d, {"only tokens with cached context"});
  EXPECT_TRUE(evidence_has(d, "with cached context: 0 of 8 off")) << dump(d);
}

TEST(DiagnoseTokens, TheLastRowsOfEachSequenceNeverWritten) {
  rng().seed(1103);
  const Tensor ref = randn({16, 8, 16}, 0.5);
  Tensor cand = ref;
  for (int64_t t : {6, 7, 14, 15})
    for (int64_t i = 0; i < 128; ++i) cand.data[t * 128 + i] = 0;
  Pair p;
  p.batch = two_sequences();
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, cand, ref, 1);
  expect(p.diagnose("attn_out"), {"the last 2 token rows of each sequence never written"}, {"softmax"});
}

// ---------------------------------------------------------------------------------------------------------------
// Channels and heads.
// ---------------------------------------------------------------------------------------------------------------

TEST(DiagnoseChannels, SingleChannelScaledIsNamedWithItsFactor) {
  rng().seed(1009);
  const Tensor ref = randn({16, 32}, 0.7);
  Tensor cand = ref;
  for (int64_t t = 0; t < 16; ++t) cand.data[t * 32 + 17] *= 2;
  Pair p;
  p.add("kv_c", Stage::Stage_kv_a_proj, Contract::Contract_replicated, cand, ref);
  const Diagnosis d = p.diagnose("kv_c");
  expect(d, {"a single channel off (channel 17)", "scaled: the reference times 2"});
}

TEST(DiagnoseChannels, ChannelGroupIsNamed) {
  rng().seed(1010);
  const Tensor ref = randn({16, 32}, 0.7);
  Tensor cand = ref;
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t c = 8; c < 12; ++c) cand.data[t * 32 + c] += nd(rng());
  Pair p;
  p.add("kv_c", Stage::Stage_kv_a_proj, Contract::Contract_replicated, cand, ref);
  expect(p.diagnose("kv_c"), {"a channel group off (channels 8-11)"});
}

TEST(DiagnoseChannels, OneLaneOfEveryHead) {
  rng().seed(1011);
  const Tensor ref = randn({16, 8, 16});
  Tensor cand = ref;
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t h = 0; h < 8; ++h) cand.data[(t * 8 + h) * 16 + 3] *= -1;
  Pair p;
  p.add("q_nope", Stage::Stage_q_b_proj, Contract::Contract_heads, cand, ref, 1);
  expect(p.diagnose("q_nope"), {"lane 3 of every head", "times -1"});
}

// q_nope from x [16, 48] and a weight [8 heads x 16, 48]; `wrong` heads computed from another weight.
Tensor heads_from(const Tensor& x, const Tensor& w, const Tensor& other, const std::vector<int64_t>& wrong) {
  Tensor q({16, 8, 16});
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t r = 0; r < 128; ++r) {
      const bool bad = std::find(wrong.begin(), wrong.end(), r / 16) != wrong.end();
      double s = 0;
      for (int64_t i = 0; i < 48; ++i) s += (bad ? other : w).data[r * 48 + i] * x.data[t * 48 + i];
      q.data[t * 128 + r] = static_cast<float>(s);
    }
  return q;
}

TEST(DiagnoseHeads, SingleHeadsWeightsWrong) {
  rng().seed(1012);
  const Tensor x = randn({16, 48}), w = randn({128, 48}, 0.15), other = randn({128, 48}, 0.15);
  Pair p;
  p.add("q_nope", Stage::Stage_q_b_proj, Contract::Contract_heads, heads_from(x, w, other, {2}), heads_from(x, w, other, {}), 1);
  const Diagnosis d = p.diagnose("q_nope");
  expect(d, {"a single head off (head 2"});
  EXPECT_TRUE(evidence_has(d, "head 2 holds 100% of the error energy")) << dump(d);
}

TEST(DiagnoseHeads, HeadBlock) {
  rng().seed(1013);
  const Tensor x = randn({16, 48}), w = randn({128, 48}, 0.15), other = randn({128, 48}, 0.15);
  Pair p;
  p.add("q_nope", Stage::Stage_q_b_proj, Contract::Contract_heads, heads_from(x, w, other, {4, 5, 6, 7}),
        heads_from(x, w, other, {}), 1);
  expect(p.diagnose("q_nope"), {"a head block off (heads 4-7 of 8"});
}

TEST(DiagnoseHeads, OneWrongHeadAtTpTwoIsNotSharding) {
  rng().seed(1014);
  const Tensor x = randn({16, 48}), w = randn({128, 48}, 0.15), other = randn({128, 48}, 0.15);
  Pair p;
  p.add("q_nope", Stage::Stage_q_b_proj, Contract::Contract_heads, heads_from(x, w, other, {5}), heads_from(x, w, other, {}),
        1, -1, 2);
  expect(p.diagnose("q_nope"), {"a single head off (head 5"}, {"sharding"});
}

TEST(DiagnoseHeads, ARankReadingTheWrongSliceIsSharding) {
  rng().seed(1015);
  const Tensor ref = randn({16, 8, 16});
  Tensor cand = ref;
  for (int64_t t = 0; t < 16; ++t)  // rank 1 (heads 4-7) holds heads 0-3
    for (int64_t i = 0; i < 64; ++i) cand.data[t * 128 + 64 + i] = ref.data[t * 128 + i];
  Pair p;
  p.add("q_nope", Stage::Stage_q_b_proj, Contract::Contract_heads, cand, ref, 1, -1, 2);
  expect(p.diagnose("q_nope"), {"only ranks 1 off: sharding"});
}

// ---------------------------------------------------------------------------------------------------------------
// Sums: a part missing or doubled, a residual dropped.
// ---------------------------------------------------------------------------------------------------------------

TEST(DiagnoseSums, OProjOverHalfTheHeads) {
  rng().seed(1016);
  const Tensor attn = randn({64, 8, 16}, 0.5), w = randn({64, 128}, 0.1);
  Pair p;
  p.batch = one_sequence(64);
  p.add_partial("o_partial", Stage::Stage_o_proj, {o_proj(attn, w, {0, 1, 2, 3})}, {o_proj(attn, w, all_heads(8))});
  const Diagnosis d = p.diagnose("o_partial");
  expect(d, {"reference minus a part", "o_proj summed over a subset of the heads", "1/2"});
  EXPECT_TRUE(evidence_has(d, "keeps")) << dump(d);
}

TEST(DiagnoseSums, OneHeadCountedTwice) {
  rng().seed(1017);
  const Tensor attn = randn({64, 8, 16}, 0.5), w = randn({64, 128}, 0.1);
  std::vector<int64_t> twice = all_heads(8);
  twice.push_back(3);
  Pair p;
  p.batch = one_sequence(64);
  p.add_partial("o_partial", Stage::Stage_o_proj, {o_proj(attn, w, twice)}, {o_proj(attn, w, all_heads(8))});
  expect(p.diagnose("o_partial"), {"counted twice"});
}

// h [T, 64] with channel scales of a residual stream, o smaller; h_out = h + o.
struct Residual {
  Tensor h = randn({16, 64}), o = randn({16, 64}, 0.3);
  Residual() {
    std::uniform_real_distribution<float> u(0.3f, 3.0f);
    std::vector<float> scale(64);
    for (auto& s : scale) s = u(rng());
    for (int64_t i = 0; i < h.numel(); ++i) h.data[i] *= scale[i % 64];
  }
  Tensor sum() const {
    Tensor s = h;
    for (int64_t i = 0; i < s.numel(); ++i) s.data[i] += o.data[i];
    return s;
  }
  Pair pair(const Tensor& h_out) const {
    Pair p;
    p.add("h", Stage::Stage_layer_input, Contract::Contract_replicated, h, h);
    p.add("o", Stage::Stage_all_reduce, Contract::Contract_replicated, o, o);
    p.add("h_out", Stage::Stage_residual, Contract::Contract_replicated, h_out, sum());
    return p;
  }
};

TEST(DiagnoseSums, ResidualDroppedHOutEqualsO) {
  rng().seed(1018);
  const Residual r;
  const Diagnosis d = r.pair(r.o).diagnose("h_out");
  expect(d, {"residual add dropped", "h_out equals o"});
  EXPECT_TRUE(evidence_has(d, "per-channel error energy matches h's")) << dump(d);
}

TEST(DiagnoseSums, ResidualDroppedHOutEqualsH) {
  rng().seed(1019);
  const Residual r;
  expect(r.pair(r.h).diagnose("h_out"), {"residual add dropped", "h_out equals h"});
}

// ---------------------------------------------------------------------------------------------------------------
// Scales: per channel (a norm's weight), per token (a norm's width), whole (units).
// ---------------------------------------------------------------------------------------------------------------

TEST(DiagnoseScales, NormWithoutItsWeight) {
  rng().seed(1020);
  const Tensor kv_c = randn({16, 32}, 2.0);
  std::vector<float> w(32);
  std::normal_distribution<float> nd(1.0f, 0.3f);
  for (auto& x : w) x = std::fabs(nd(rng())) + 0.1f;
  Pair p;
  p.add("kv_c_norm", Stage::Stage_kv_a_norm, Contract::Contract_replicated, rms_norm(kv_c, {}), rms_norm(kv_c, w));
  const Diagnosis d = p.diagnose("kv_c_norm");
  expect(d, {"per-channel scale", "norm without its weight"});
  EXPECT_TRUE(evidence_has(d, "per-channel factors")) << dump(d);
}

TEST(DiagnoseScales, NormOverTheWrongWidthIsAPerTokenScale) {
  rng().seed(1021);
  const Tensor kv_c = randn({16, 32}, 2.0);
  std::vector<float> w(32);
  std::normal_distribution<float> nd(1.0f, 0.3f);
  for (auto& x : w) x = std::fabs(nd(rng())) + 0.1f;
  Pair p;
  p.add("kv_c_norm", Stage::Stage_kv_a_norm, Contract::Contract_replicated, rms_norm(kv_c, w, 16), rms_norm(kv_c, w));
  expect(p.diagnose("kv_c_norm"), {"a per-token scale", "scale per token"}, {"per-channel"});
}

TEST(DiagnoseScales, PureScale) {
  rng().seed(1022);
  const Tensor ref = randn({16, 24});
  Tensor cand = ref;
  for (auto& x : cand.data) x *= 1.3f;
  Pair p;
  p.add("q_a", Stage::Stage_q_a_proj, Contract::Contract_replicated, cand, ref);
  expect(p.diagnose("q_a"), {"pure scale"}, {"units"});
}

TEST(DiagnoseScales, LseInLog2UnitsIsAUnitsMixUp) {
  const AttnSetup s;
  const Tensor ref = attention(s.q, s.k, s.v, s.scale).lse;
  for (double f : {1.0 / std::log(2.0), std::log(2.0)}) {
    SCOPED_TRACE(f);
    Tensor cand = ref;
    for (auto& x : cand.data) x = static_cast<float>(x * f);
    Pair p;
    p.add("lse", Stage::Stage_attention_mha, Contract::Contract_heads, cand, ref, 1);
    const Diagnosis d = p.diagnose("lse");
    expect(d, {"units mix-up", f > 1 ? "1/ln 2" : "ln 2"});
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The rules kept from before, each on its own evidence: RoPE, layout, NaN, nothing known.
// ---------------------------------------------------------------------------------------------------------------

TEST(DiagnoseKept, RopeLayout) {
  rng().seed(1023);
  const Tensor q_pe = randn({16, 8, 8});
  const Batch b = one_sequence(16);
  Pair p;
  p.add("q_pe_rope", Stage::Stage_rope, Contract::Contract_heads, rope(q_pe, b.positions, true), rope(q_pe, b.positions, false),
        1, 0);
  expect(p.diagnose("q_pe_rope"), {"RoPE layout or frequency"}, {"softmax"});
}

TEST(DiagnoseKept, RopePositionsOffset) {
  rng().seed(1024);
  const Tensor q_pe = randn({16, 8, 8});
  const Batch b = one_sequence(16);
  std::vector<int> shifted = b.positions;
  for (auto& x : shifted) ++x;
  Pair p;
  p.add("q_pe_rope", Stage::Stage_rope, Contract::Contract_heads, rope(q_pe, shifted, false), rope(q_pe, b.positions, false),
        1, 0);
  expect(p.diagnose("q_pe_rope"), {"positions offset"});
}

TEST(DiagnoseKept, ChannelPermutationIsALayout) {
  rng().seed(1025);
  const Tensor ref = randn({16, 8, 16});
  Tensor cand = ref;
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t h = 0; h < 8; ++h)
      for (int64_t i = 0; i < 16; ++i) cand.data[(t * 8 + h) * 16 + i] = ref.data[(t * 8 + h) * 16 + (i * 5) % 16];
  Pair p;
  p.add("k_nope", Stage::Stage_kv_b_proj, Contract::Contract_heads, cand, ref, 1);
  expect(p.diagnose("k_nope"), {"every head off", "permutation or layout"});
}

TEST(DiagnoseKept, NanOrigin) {
  rng().seed(1026);
  const Tensor ref = randn({16, 32});
  Tensor cand = ref;
  cand.data[100] = std::numeric_limits<float>::quiet_NaN();
  Pair p;
  p.add("kv_c", Stage::Stage_kv_a_proj, Contract::Contract_replicated, cand, ref);
  expect(p.diagnose("kv_c"), {"NaN/Inf originates here", "token 3"});
}

TEST(DiagnoseKept, NoKnownPatternSaysWhereTheErrorSits) {
  rng().seed(1027);
  const Tensor ref = randn({16, 64});
  Tensor cand = ref;
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (auto& x : cand.data) x += nd(rng());
  Pair p;
  p.add("x", Stage::Stage_input_norm, Contract::Contract_replicated, cand, ref);
  const Diagnosis d = p.diagnose("x");
  expect(d, {"no known pattern"});
  EXPECT_EQ(d.confidence, "unconfirmed");
  EXPECT_EQ(d.fit, "low");
  EXPECT_TRUE(evidence_has(d, "tokens off: 0-15 (all)")) << dump(d);
  EXPECT_TRUE(evidence_has(d, "half of the error energy in")) << dump(d);
}

// ---------------------------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------------------------
// The rules on the evidence of the zoo's engine bugs, where it is fainter than in the synthetic pairs above.
// ---------------------------------------------------------------------------------------------------------------

// h_out = o with o a few percent of h (a residual stream): the candidate is small, but it is o, not zeros.
TEST(DiagnoseSums, ResidualDroppedWithOSmallBesideHIsNotZeros) {
  rng().seed(1030);
  Residual r;
  for (auto& x : r.o.data) x *= 0.05f;
  const Diagnosis d = r.pair(r.o).diagnose("h_out");
  expect(d, {"residual add dropped", "h_out equals o"}, {"all zeros"});
}

// q_a rows alike from token to token (a fixed channel profile, the last 16 of 48 channels scaled by 0.95..1.05 per
// token): the mean square over the first 32 channels scales each token by its own factor, only ±2% apart, yet
// several times the per-token tolerance: a per-token scale, not one factor.
TEST(DiagnoseScales, NormOverTheWrongWidthWithTokensAlikeIsStillPerToken) {
  rng().seed(1031);
  const Tensor base = randn({1, 48}, 2.0);
  Tensor q_a({16, 48});
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t c = 0; c < 48; ++c)
      q_a.data[t * 48 + c] = base.data[c] * (c < 32 ? 1.0f : 0.95f + 0.1f * static_cast<float>(t) / 15);
  std::vector<float> w(48);
  std::normal_distribution<float> nd(1.0f, 0.1f);
  for (auto& x : w) x = nd(rng());
  Pair p;
  p.add("q_c", Stage::Stage_q_a_norm, Contract::Contract_replicated, rms_norm(q_a, w, 32), rms_norm(q_a, w));
  expect(p.diagnose("q_c"), {"scale per token"}, {"pure scale"});
}

// kv_a_layernorm's weight indexed c mod C/2: the upper half of the channels each by its own factor w[c - C/2]/w[c],
// the lower half exact: one contiguous group of half the channels.
TEST(DiagnoseChannels, UpperHalfOfANormsWeightMisindexedIsAChannelGroup) {
  rng().seed(1032);
  const Tensor kv_c = randn({16, 32}, 2.0);
  std::vector<float> w(32), wrapped(32);
  std::normal_distribution<float> nd(1.0f, 0.1f);
  for (auto& x : w) x = nd(rng());
  for (int c = 0; c < 32; ++c) wrapped[c] = w[c % 16];
  Pair p;
  p.add("kv_c_norm", Stage::Stage_kv_a_norm, Contract::Contract_replicated, rms_norm(kv_c, wrapped), rms_norm(kv_c, w));
  const Diagnosis d = p.diagnose("kv_c_norm");
  expect(d, {"a channel group off", "scaled"}, {"norm without its weight"});
  // Only channels of the upper half are named.
  EXPECT_TRUE(evidence_has(d, "channels 1")) << dump(d);
  EXPECT_FALSE(evidence_has(d, "channels 0")) << dump(d);
}

// A sliding window of 8 over 32 tokens, at attention's wider tolerance: the first tokens past the window lose one
// key of nine and may stay under the per-token tolerance; the error still starts at position 8.
TEST(DiagnoseTokens, SlidingWindowWhoseFirstTokensStayUnderTolerance) {
  rng().seed(1033);
  const Tensor q = randn({32, 8, 24}, 0.3), k = randn({32, 8, 24}, 0.3), v = randn({32, 8, 16});
  const double scale = 1.0 / std::sqrt(24.0);
  Pair p;
  p.batch = one_sequence(32);
  p.tol = Tolerance{0.03, 0.2, "test: attention-sized"};
  p.add("attn_out", Stage::Stage_attention_mha, Contract::Contract_heads, attention(q, k, v, scale, 8).out,
        attention(q, k, v, scale).out, 1);
  const Diagnosis d = p.diagnose("attn_out");
  expect(d, {"error starts at position 8", "sliding window"}, {"softmax", "layout"});
}

// The zoo scores the pattern as well as the probe.
// ---------------------------------------------------------------------------------------------------------------

TEST(DiagnoseZoo, EveryPlantedBugHasPatternWords) {
  for (const auto& e : bug_zoo()) {
    if (e.expected.empty()) {
      EXPECT_EQ(zoo_pattern_words(e.name), "") << e.name << " is benign: no pattern to score";
      continue;
    }
    EXPECT_NE(zoo_pattern_words(e.name), "") << e.name;
  }
  EXPECT_EQ(zoo_pattern_words("nan-at:kv_c_norm:5"), "NaN/Inf originates here");
  EXPECT_EQ(zoo_pattern_words("frobnicate"), "");
}

TEST(DiagnoseZoo, TableCountsProbeRightAndPatternRight) {
  auto row = [](const std::string& inject, std::vector<std::string> expected, const std::string& found, bool ok,
                const std::string& pattern) {
    ZooRow r;
    r.c.inject = inject;
    r.c.expected = std::move(expected);
    r.c.pattern_words = r.c.expected.empty() ? "" : zoo_pattern_words(inject);
    r.found = found;
    r.ok = ok;
    r.verdict = r.c.expected.empty() ? (ok ? "clean" : "FALSE ALARM") : ok ? "localized" : "wrong probe";
    r.pattern = pattern;
    r.pattern_ok = ok && !r.c.pattern_words.empty() && pattern.find(r.c.pattern_words) != std::string::npos;
    return r;
  };
  const std::vector<ZooRow> rows = {
      row("softmax-scale", {"attn_out"}, "attn_out", true, "token 0 exact ...: the softmax scale"),
      row("causal-off", {"attn_out"}, "attn_out", true, "position 0 exact, later positions off"),
      row("rope-neox", {"q_pe_rope"}, "q_nope", false, "no known pattern"),
      row("", {}, "-", true, ""),
  };
  std::ostringstream os;
  print_zoo(os, rows);
  const std::string out = os.str();
  EXPECT_NE(out.find("probe right 2 of 3 injected; pattern right 1 of 3"), std::string::npos) << out;
  EXPECT_NE(out.find("pattern not named: causal-off (expected \"causal mask is missing\")"), std::string::npos) << out;
  EXPECT_NE(out.find("pattern not named: rope-neox"), std::string::npos) << out;
  EXPECT_EQ(out.find("pattern not named: softmax-scale"), std::string::npos) << out;
}

}  // namespace
