// Comparator self-tests (harness/compare, label cpu, in process): dumps built with the Runner and a CollectSink,
// then edited by hand. Identical dumps pass; one ulp of noise passes at the FP32 floor; one element at 2x the
// tolerance fails and is located; +inf vs -inf and NaNs at different positions fail; a channel permutation with
// equal norms is caught by sketches and by full tensors; tp 2 equals tp 1 once gathered; bf16 passes at the
// calibrated tolerance while another input seed fails; a replicated probe that differs on one rank names it; a
// token whose DSA top-k swapped near-tied keys is still compared in the probes after topk.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness/compare/compare.h"
#include "harness/run/calibrate.h"
#include "harness/compare/diagnose.h"
#include "core/engine/engine.h"
#include "core/model/config.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "core/model/stage_graph.h"
#include "harness/report/compare_report.h"
#include "probes/collect.h"
#include "tests/world_util.h"

namespace {

using namespace mla;

using World = test::TinyWorld;

RunSpec prefill(int tokens, int tp = 1) {
  RunSpec s;
  s.tokens = tokens;
  s.tp = tp;
  return s;
}

RunSpec decode(int tp = 1) {
  RunSpec s;
  s.mode = Mode::Mode_decode;
  s.form = AttentionForm::AttentionForm_absorbed;
  s.tokens = 1;
  s.batch = 2;
  s.context = {40, 70};
  s.tp = tp;
  return s;
}

// Runs `engine` on the setup's weights and inputs (at `tp` if given) into an in-memory dump.
Dump run(const World& st, ProbeLevel level, const std::string& engine = "reference", int tp = 0,
         const std::string& inject = "") {
  RunSpec spec = st.spec;
  if (tp > 0) spec.tp = tp;
  Runner runner(st.cfg, spec);
  auto e = make_engine(EngineSpec::parse(engine));
  e->set_injections(parse_injections(inject));
  DumpMeta meta;
  meta.engine = e->name();
  meta.engine_dtype = e->dtype();
  meta.tp = spec.tp;
  CollectSink sink(meta, spec.tp);
  ProbePlan plan;
  plan.level = level;
  runner.run(*e, st.weights, st.inputs, plan, sink);
  Dump d = sink.take();
  d.path = engine + " tp" + std::to_string(spec.tp) + (inject.empty() ? "" : " " + inject);
  return d;
}

DumpProbe& probe(Dump& d, const std::string& name, int layer = 0) {
  for (auto& p : d.probes)
    if (p.layer == layer && p.name == name) return p;
  throw std::runtime_error("no probe " + name);
}

const ProbeResult& result(const CompareReport& rep, const std::string& name, int layer = 0) {
  for (const auto& r : rep.results)
    if (r.layer == layer && r.name == name) return r;
  throw std::runtime_error("no result " + name);
}

std::string first(const CompareReport& rep) {
  return rep.first_divergence < 0 ? "(none)" : rep.results[rep.first_divergence].name;
}

// Every verdict pass (no missing, no divergence).
void expect_all_pass(const CompareReport& rep) {
  EXPECT_EQ(rep.first_divergence, -1) << "first divergence " << first(rep) << ": "
                                      << rep.results[std::max(rep.first_divergence, 0)].why;
  for (const auto& r : rep.results) EXPECT_EQ(r.verdict, Verdict::Verdict_pass) << r.name << ": " << r.why;
}

// Recomputes every record of `d` from its full data at `level` (as an engine would have recorded it).
void rerecord(Dump& d, const World& st, ProbeLevel level) {
  RunSpec spec = st.spec;
  spec.tp = d.meta.tp;
  Runner runner(st.cfg, spec);
  for (auto& p : d.probes) {
    const ProbeSpec& ps = *runner.graph().find(p.name);
    for (size_t r = 0; r < p.ranks.size(); ++r) {
      ASSERT_GT(p.ranks[r].data.numel(), 0) << p.name;
      const std::string dtype = p.ranks[r].dtype;
      const Tensor data = p.ranks[r].data;
      p.ranks[r] = compute_probe_record(data, dtype, make_probe_request(ps, spec.tp, static_cast<int>(r), level));
    }
  }
}

const ToleranceModel kFloor{};  // FP32-vs-FP32 floor

TEST(CompareSelfTest, IdenticalDumpsPass) {
  for (const RunSpec& spec : {prefill(8), prefill(8, 2), decode(2)}) {
    const World st(spec);
    for (ProbeLevel level : {ProbeLevel::ProbeLevel_stats, ProbeLevel::ProbeLevel_sketch, ProbeLevel::ProbeLevel_full}) {
      SCOPED_TRACE(std::string(mode_name(spec.mode)) + " tp " + std::to_string(spec.tp) + " " + probe_level_name(level));
      const Dump d = run(st, level);
      const CompareReport rep = compare_dumps(d, d, kFloor);
      expect_all_pass(rep);
      ASSERT_GT(rep.results.size(), 10u);
      for (const auto& r : rep.results) {
        EXPECT_EQ(r.m.rel_l2, 0.0) << r.name;
        EXPECT_EQ(r.m.basis, level == ProbeLevel::ProbeLevel_full     ? "full"
                             : level == ProbeLevel::ProbeLevel_sketch ? "sketch"
                                                                      : "stats (lower bound)");
      }
    }
  }
}

TEST(CompareSelfTest, OneUlpOfNoiseOnEveryElementPassesAtTheFp32Floor) {
  const World st(prefill(8, 2));
  const Dump ref = run(st, ProbeLevel::ProbeLevel_full);
  Dump cand = ref;
  int64_t moved = 0;
  for (auto& p : cand.probes)
    for (auto& rec : p.ranks)
      for (size_t i = 0; i < rec.data.data.size(); ++i) {
        float& x = rec.data.data[i];
        x = std::nextafter(x, i % 2 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity());
        ++moved;
      }
  ASSERT_GT(moved, 1000);
  const CompareReport rep = compare_dumps(cand, ref, kFloor);
  expect_all_pass(rep);
  for (const auto& r : rep.results) {
    EXPECT_GT(r.m.rel_l2, 0.0) << r.name << ": the noise must be seen";
    EXPECT_LT(r.m.rel_l2, 1e-6) << r.name;
    EXPECT_NE(r.tol.origin.find("floor"), std::string::npos) << r.tol.origin;
  }
}

// One element of q_nope (heads, tp 2) moved by `factor` x the tolerance (overall or on its token, whichever is
// stricter). Returns the comparison.
CompareReport move_one_element(const World& st, const Dump& ref, double factor, int64_t t, int64_t h, int64_t c) {
  Dump cand = ref;
  DumpProbe& p = probe(cand, "q_nope");
  const int tp = static_cast<int>(p.ranks.size());
  const int64_t N = p.shape[1], P = p.shape[2], Nl = N / tp;
  const Gathered g = gather(probe(const_cast<Dump&>(ref), "q_nope"));
  double tok = 0;
  for (int64_t i = 0; i < N * P; ++i) tok += std::pow(g.data.data[t * N * P + i], 2);
  const Tolerance tol = kFloor.for_probe("q_nope", 0);
  const double limit = std::min(tol.rel_l2 * g.l2, tol.token_rel * std::sqrt(tok));
  float& x = p.ranks[h / Nl].data.data[(t * Nl + h % Nl) * P + c];
  x = static_cast<float>(x + factor * limit);
  return compare_dumps(cand, ref, kFloor);
}

TEST(CompareSelfTest, OneElementAtTwiceTheToleranceFailsAndIsLocated) {
  const World st(prefill(8, 2));
  const Dump ref = run(st, ProbeLevel::ProbeLevel_full);
  // token 5, head 6 (rank 1 of 2 with 8 heads), channel 11
  const CompareReport bad = move_one_element(st, ref, 2.0, 5, 6, 11);
  ASSERT_EQ(first(bad), "q_nope");
  const ProbeResult& r = bad.results[bad.first_divergence];
  EXPECT_EQ(r.verdict, Verdict::Verdict_diverge) << r.why;
  EXPECT_EQ(r.m.max_at.layer, 0);
  EXPECT_EQ(r.m.max_at.rank, 1);
  EXPECT_EQ(r.m.max_at.token, 5);
  EXPECT_EQ(r.m.max_at.head, 6);
  EXPECT_EQ(r.m.max_at.channel, 11);
  EXPECT_EQ(r.m.max_at.to_string(), "layer 0 rank 1 token 5 head 6 channel 11");
  ASSERT_FALSE(r.m.worst.empty());
  EXPECT_EQ(r.m.worst.front().at.to_string(), r.m.max_at.to_string());
  // The maps point at the same place.
  ASSERT_EQ(r.m.rank_rel.size(), 2u);
  EXPECT_EQ(r.m.rank_rel[0], 0.0);
  EXPECT_GT(r.m.rank_rel[1], 0.0);
  for (size_t t = 0; t < r.m.token_rel.size(); ++t) EXPECT_EQ(r.m.token_rel[t] > 0, t == 5) << "token " << t;
  for (size_t h = 0; h < r.m.head_rel.size(); ++h) EXPECT_EQ(r.m.head_rel[h] > 0, h == 6) << "head " << h;
  // Half the tolerance passes: the threshold sits between.
  expect_all_pass(move_one_element(st, ref, 0.5, 5, 6, 11));
}

TEST(CompareSelfTest, PlusInfinityAgainstMinusInfinityFails) {
  const World st(prefill(8));
  Dump ref = run(st, ProbeLevel::ProbeLevel_full);
  Dump cand = ref;
  const int64_t at = 3 * 48 + 20;  // q_c [8, 48]: token 3, channel 20
  probe(cand, "q_c").ranks[0].data.data[at] = std::numeric_limits<float>::infinity();
  probe(ref, "q_c").ranks[0].data.data[at] = -std::numeric_limits<float>::infinity();
  const CompareReport rep = compare_dumps(cand, ref, kFloor);
  ASSERT_EQ(first(rep), "q_c");
  const ProbeResult& r = result(rep, "q_c");
  EXPECT_EQ(r.verdict, Verdict::Verdict_nonfinite);
  EXPECT_FALSE(r.m.nonfinite_agree);
  EXPECT_NE(r.m.first_nonfinite.find("+inf vs -inf"), std::string::npos) << r.m.first_nonfinite;
  EXPECT_NE(r.m.first_nonfinite.find("token 3 channel 20"), std::string::npos) << r.m.first_nonfinite;
  // The same infinity on both sides agrees.
  probe(ref, "q_c").ranks[0].data.data[at] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(result(compare_dumps(cand, ref, kFloor), "q_c").verdict, Verdict::Verdict_pass);
}

TEST(CompareSelfTest, NanAtDifferentPositionsFails) {
  const World st(prefill(8));  // tp 1: nan-at plants on rank 0 only, and a replicated probe must agree across ranks
  for (ProbeLevel level : {ProbeLevel::ProbeLevel_full, ProbeLevel::ProbeLevel_sketch}) {
    SCOPED_TRACE(probe_level_name(level));
    // One NaN in q_c on each side (the same count), at token 1 vs token 6, planted by the engine.
    const Dump cand = run(st, level, "reference", 0, "nan-at:q_c:60");
    const Dump ref = run(st, level, "reference", 0, "nan-at:q_c:300");
    const CompareReport rep = compare_dumps(cand, ref, kFloor);
    ASSERT_EQ(first(rep), "q_c");
    EXPECT_EQ(result(rep, "q_c").verdict, Verdict::Verdict_nonfinite) << result(rep, "q_c").why;
    // The same NaN on both sides agrees at q_c (downstream, the NaN spreads the same way too).
    const Dump same = run(st, level, "reference", 0, "nan-at:q_c:60");
    EXPECT_EQ(result(compare_dumps(cand, same, kFloor), "q_c").verdict, Verdict::Verdict_pass);
  }
}

// Reverses the channels of every row (replicated probes) or of every head (heads probes): the norms per token and
// per head stay the same, the content does not.
void permute_channels(DumpProbe& p) {
  const int64_t last = p.shape.back();
  for (auto& rec : p.ranks)
    for (int64_t row = 0; row < rec.data.numel() / last; ++row)
      std::reverse(rec.data.data.begin() + row * last, rec.data.data.begin() + (row + 1) * last);
}

TEST(CompareSelfTest, ChannelPermutationWithEqualNormsIsCaughtBySketchAndByFullTensors) {
  for (const char* name : {"q_c", "q_nope"}) {
    SCOPED_TRACE(name);
    const World st(prefill(8, 2));
    const Dump ref_full = run(st, ProbeLevel::ProbeLevel_full);
    Dump cand_full = ref_full;
    permute_channels(probe(cand_full, name));

    // Full tensors: element-wise, plainly different.
    CompareReport rep = compare_dumps(cand_full, ref_full, kFloor);
    ASSERT_EQ(first(rep), name);
    EXPECT_EQ(result(rep, name).m.basis, "full");
    EXPECT_GT(result(rep, name).m.rel_l2, 0.1);

    // Sketch level (the records as the engine would have written them): the norms agree, the sketches do not.
    Dump ref = ref_full, cand = cand_full;
    rerecord(ref, st, ProbeLevel::ProbeLevel_sketch);
    rerecord(cand, st, ProbeLevel::ProbeLevel_sketch);
    const Gathered ga = gather(probe(cand, name)), gb = gather(probe(ref, name));
    EXPECT_FALSE(ga.full);
    ASSERT_TRUE(ga.sketch);
    EXPECT_NEAR(ga.l2, gb.l2, 1e-6 * gb.l2) << "the permutation keeps the norm";
    for (size_t t = 0; t < gb.token_l2.size(); ++t) EXPECT_NEAR(ga.token_l2[t], gb.token_l2[t], 1e-5 * gb.token_l2[t]);
    for (size_t i = 0; i < gb.head_l2.size(); ++i) EXPECT_NEAR(ga.head_l2[i], gb.head_l2[i], 1e-5 * gb.head_l2[i] + 1e-7);
    rep = compare_dumps(cand, ref, kFloor);
    ASSERT_EQ(first(rep), name) << "a permutation must be caught by the sketch";
    const ProbeResult& r = result(rep, name);
    EXPECT_EQ(r.m.basis, "sketch");
    EXPECT_EQ(r.verdict, Verdict::Verdict_diverge);
    EXPECT_NEAR(r.m.norm_ratio, 1.0, 1e-6);
    EXPECT_GT(r.m.rel_l2, 0.1);
  }
}

TEST(CompareSelfTest, TpTwoDumpEqualsTpOneDumpOnceGathered) {
  for (const RunSpec& spec : {prefill(8), decode()}) {
    const World st(spec);
    for (ProbeLevel level : {ProbeLevel::ProbeLevel_full, ProbeLevel::ProbeLevel_sketch}) {
      SCOPED_TRACE(std::string(mode_name(spec.mode)) + " " + probe_level_name(level));
      const Dump tp1 = run(st, level, "reference", 1);
      for (int tp : {2, 4}) {
        const Dump tpn = run(st, level, "reference", tp);
        ASSERT_EQ(probe(const_cast<Dump&>(tpn), "q_nope").ranks.size(), static_cast<size_t>(tp));
        expect_all_pass(compare_dumps(tpn, tp1, kFloor));
        expect_all_pass(compare_dumps(tp1, tpn, kFloor));
      }
    }
  }
}

TEST(CompareSelfTest, Bf16RunPassesAtCalibratedToleranceAndAnotherSeedFails) {
  for (const RunSpec& spec : {prefill(16), decode(2)}) {
    SCOPED_TRACE(mode_name(spec.mode));
    const World st(spec);
    const ToleranceModel tol = calibrate(st.cfg, st.spec, st.weights, st.inputs, Precision::Precision_bf16);
    ASSERT_FALSE(tol.per_probe.empty());
    for (ProbeLevel level : {ProbeLevel::ProbeLevel_full, ProbeLevel::ProbeLevel_sketch}) {
      SCOPED_TRACE(probe_level_name(level));
      const Dump fp32 = run(st, level);
      const Dump bf16 = run(st, level, "reference:precision=bf16");
      const CompareReport rep = compare_dumps(bf16, fp32, tol);
      expect_all_pass(rep);
      int above_floor = 0;
      for (const auto& r : rep.results) {
        EXPECT_NE(r.tol.origin.find("calibrated"), std::string::npos) << r.tol.origin;
        above_floor += r.m.rel_l2 > 1e-5;
      }
      EXPECT_GT(above_floor, 5) << "bf16 must differ from FP32 (else the test proves nothing)";
      // The FP32 floor is far too tight for bf16.
      EXPECT_GE(compare_dumps(bf16, fp32, kFloor).first_divergence, 0);

      RunSpec other = st.spec;
      other.seed = 7;
      World st2(other);
      st2.weights = st.weights;
      st2.inputs = synthetic_inputs(st2.cfg, other, st2.weights);
      const CompareReport bad = compare_dumps(run(st2, level, "reference:precision=bf16"), fp32, tol);
      ASSERT_EQ(first(bad), "x") << "another input seed must diverge at the very first probe";
      EXPECT_EQ(bad.results[bad.first_divergence].verdict, Verdict::Verdict_diverge);
    }
  }
}

// Moves one element of rank r's copy of a replicated probe, as an engine whose rank r computed it differently would
// have recorded it (full level: its checksum changes with its bytes).
void perturb_rank(Dump& d, const World& st, const std::string& name, int r) {
  DumpProbe& p = probe(d, name);
  Tensor t = p.ranks[r].data;
  t.data[7] += 1e-3f;
  RunSpec spec = st.spec;
  spec.tp = static_cast<int>(p.ranks.size());
  Runner runner(st.cfg, spec);
  p.ranks[r] = compute_probe_record(t, p.ranks[r].dtype,
                                    make_probe_request(*runner.graph().find(name), spec.tp, r, ProbeLevel::ProbeLevel_full));
}

TEST(CompareSelfTest, ReplicatedProbeDifferingOnOneRankNamesThatRank) {
  const World st(prefill(8));
  const Dump ref = run(st, ProbeLevel::ProbeLevel_full, "reference", 1);
  const Dump tp4 = run(st, ProbeLevel::ProbeLevel_full, "reference", 4);
  for (ProbeLevel level : {ProbeLevel::ProbeLevel_full, ProbeLevel::ProbeLevel_sketch}) {
    for (int bad_rank : {0, 2, 3}) {
      SCOPED_TRACE(std::string(probe_level_name(level)) + ", rank " + std::to_string(bad_rank));
      Dump cand = tp4, reference = ref;
      perturb_rank(cand, st, "kv_c_norm", bad_rank);
      if (level != ProbeLevel::ProbeLevel_full) {
        rerecord(cand, st, level);
        rerecord(reference, st, level);
      }
      const CompareReport rep = compare_dumps(cand, reference, kFloor);
      ASSERT_EQ(first(rep), "kv_c_norm");
      const ProbeResult& r = result(rep, "kv_c_norm");
      EXPECT_EQ(r.verdict, Verdict::Verdict_diverge);
      const std::string named = "rank " + std::to_string(bad_rank);
      EXPECT_NE(r.why.find(named), std::string::npos) << r.why;
      ASSERT_EQ(r.problems.size(), 1u) << "only the odd rank is named";
      EXPECT_NE(r.problems[0].find(named), std::string::npos) << r.problems[0];
      // The majority speaks for the probe: its metrics match the reference exactly.
      EXPECT_EQ(r.m.rel_l2, 0.0);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Block-shaped error (fp8-scale-transpose, docs/bugs.md): per-channel maps, and the diagnosis rule on hand-made maps.
// ---------------------------------------------------------------------------------------------------

TEST(CompareChannels, ChannelMapsSumOverTokensAndGroupIntoBlocks) {
  const World st(prefill(6));
  Dump ref = run(st, ProbeLevel::ProbeLevel_full);
  const DumpProbe& ref_q_a = probe(ref, "q_a");
  Dump cand = ref;
  DumpProbe& q_a = probe(cand, "q_a");
  Tensor& data = q_a.ranks[0].data;
  const int64_t T = data.dim(0), C = data.numel() / T;
  ASSERT_EQ(C % 8, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < 8; ++c) data.data[t * C + c] *= 1.5f;  // the first 8 channels 50% off, the rest exact
  rerecord(cand, st, ProbeLevel::ProbeLevel_full);
  const CompareReport rep = compare_dumps(cand, ref, kFloor);
  const ProbeResult& r = result(rep, "q_a");
  ASSERT_EQ(r.m.channel_err2.size(), static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    double d = 0, b = 0;
    for (int64_t t = 0; t < T; ++t) {
      const double y = ref_q_a.ranks[0].data.data[t * C + c];
      d += std::pow((c < 8 ? 0.5 : 0.0) * y, 2);
      b += y * y;
    }
    EXPECT_NEAR(r.m.channel_err2[c], d, 1e-6 * b) << "channel " << c;
    EXPECT_NEAR(r.m.channel_ref2[c], b, 1e-6 * b) << "channel " << c;
  }
  const auto blocks = channel_block_rel(r.m.channel_err2, r.m.channel_ref2, 8);
  ASSERT_EQ(blocks.size(), static_cast<size_t>(C / 8));
  EXPECT_NEAR(blocks[0], 0.5, 1e-6);
  for (size_t k = 1; k < blocks.size(); ++k) EXPECT_EQ(blocks[k], 0.0);
}

// A divergent probe with C channels whose per-channel rel_l2 is level(c) × (1 + noise); every token equally off.
struct MadeUp {
  ProbeResult r;
  Batch batch;
  CompareReport all;
};
MadeUp made_up(const std::string& name, int64_t C, int64_t heads, const std::function<double(int64_t)>& level,
               uint64_t seed, double noise = 0.1) {
  MadeUp u;
  const int T = 8;
  u.r.name = name;
  u.r.stage = name == "q_a" ? "q_a_proj" : "q_b_proj";
  u.r.verdict = Verdict::Verdict_diverge;
  u.r.tol = {4e-3, 8e-3, "test"};
  Metrics& m = u.r.m;
  m.basis = "full";
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, noise);
  double d = 0, b = 0;
  for (int64_t c = 0; c < C; ++c) {
    const double ref2 = 1.0 + 0.5 * std::fabs(nd(rng)) / noise, rel = level(c) * std::exp(nd(rng));
    m.channel_ref2.push_back(ref2);
    m.channel_err2.push_back(rel * rel * ref2);
    d += rel * rel * ref2;
    b += ref2;
  }
  m.rel_l2 = std::sqrt(d / b);
  m.cosine = 1 - m.rel_l2 * m.rel_l2 / 2;
  m.norm_ratio = 1;
  m.token_rel.assign(T, m.rel_l2);
  m.max_token_rel = m.rel_l2;
  m.token_cos.assign(T, m.cosine);
  m.token_norm_ratio.assign(T, 1.0);
  if (heads > 0) m.head_rel.assign(heads, m.rel_l2);
  for (int t = 0; t < T; ++t) {
    u.batch.positions.push_back(t);
    u.batch.token_seq.push_back(0);
  }
  u.batch.new_lens = {T};
  u.batch.context_lens = {0};
  u.all.results.push_back(u.r);
  return u;
}

std::string pattern_of(const MadeUp& u) { return diagnose(u.r, u.r.m, u.r.tol, u.batch, u.all).pattern; }

TEST(DiagnoseBlocks, BlockShapedErrorIsNamedWithItsBlockSize) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed + 100);
    std::uniform_real_distribution<double> lvl(0.002, 0.08);  // each block its own wrong-scale error
    std::vector<double> per_block(1536 / 128);
    for (auto& v : per_block) v = lvl(rng);
    per_block[3] = 1e-8;  // a block whose scale happens to be right
    const MadeUp u = made_up("q_a", 1536, 0, [&](int64_t c) { return per_block[c / 128]; }, seed);
    const Diagnosis dg = diagnose(u.r, u.r.m, u.r.tol, u.batch, u.all);
    EXPECT_NE(dg.pattern.find("block-shaped error"), std::string::npos) << dg.pattern;
    EXPECT_NE(dg.pattern.find("blocks of 128 output channels"), std::string::npos) << dg.pattern;
    ASSERT_FALSE(dg.evidence.empty());
    EXPECT_NE(dg.evidence.back().find("per-128-channel block rel_l2"), std::string::npos) << dg.evidence.back();
  }
}

TEST(DiagnoseBlocks, OnlyAtAProjectionsOutput) {
  std::vector<double> per_block = {0.01, 0.05, 0.002, 0.03, 0.08, 0.004, 0.02, 0.06, 0.003, 0.04, 0.01, 0.07};
  MadeUp u = made_up("q_a", 1536, 0, [&](int64_t c) { return per_block[c / 128]; }, 4);
  EXPECT_NE(pattern_of(u).find("block-shaped"), std::string::npos) << pattern_of(u);
  u.r.stage = "q_a_norm";  // a norm, a rope or an attention passes on blocks it received; it did not make them
  EXPECT_EQ(pattern_of(u).find("block-shaped"), std::string::npos) << pattern_of(u);
}

TEST(DiagnoseBlocks, QNopeAndQPeAreReassembledIntoTheProjectionsRows) {
  // DeepSeek-V2-Lite's q_proj: 16 heads x [128 nope | 64 rope]; blocks of 128 rows straddle the two probes.
  const int64_t N = 16, P = 128, R = 64, D = P + R;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> lvl(0.002, 0.08);
  std::vector<double> per_block(N * D / 128);
  for (auto& v : per_block) v = lvl(rng);
  const auto row_level = [&](int64_t row) { return per_block[row / 128]; };
  MadeUp nope = made_up("q_nope", N * P, N, [&](int64_t c) { return row_level(c / P * D + c % P); }, 6);
  const MadeUp pe = made_up("q_pe", N * R, N, [&](int64_t c) { return row_level(c / R * D + P + c % R); }, 7);
  nope.all.results.push_back(pe.r);
  const std::string p = pattern_of(nope);
  EXPECT_NE(p.find("blocks of 128 output channels of the q_b_proj output (q_nope | q_pe per head)"), std::string::npos)
      << p;
}

TEST(DiagnoseBlocks, NotNamedWithoutBlocks) {
  struct Case {
    const char* what;
    int64_t heads;
    std::function<double(int64_t)> level;
  };
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> lvl(0.01, 0.1);
  std::vector<double> per_head(12);
  for (auto& v : per_head) v = lvl(rng);
  const Case cases[] = {
      {"uniform error", 0, [](int64_t) { return 0.03; }},
      {"noise only (per-channel levels at random)", 0, [&](int64_t c) { return 0.01 + 0.05 * ((c * 7919) % 97) / 97.0; }},
      {"a smooth trend over the channels (like RoPE's error over frequencies)", 0,
       [](int64_t c) { return 0.001 * std::exp(c / 300.0); }},
      {"per-head levels (a head's channels, not a weight's blocks)", 12,
       [&](int64_t c) { return per_head[c / 128]; }},
      {"first half of the channels only", 0, [](int64_t c) { return c < 768 ? 0.05 : 1e-4; }},
      {"steps over a head's lanes, the same in every head (like RoPE's frequencies)", 12,
       [&](int64_t c) { return per_head[c % 128 / 16]; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    for (uint64_t seed : {1, 2, 3}) {
      const MadeUp u = made_up(c.heads ? "q_nope" : "q_a", 1536, c.heads, c.level, seed);
      EXPECT_EQ(pattern_of(u).find("block-shaped"), std::string::npos) << pattern_of(u);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// DSA: a token whose top-k swapped near-tied keys reads other keys; the probes after topk in its layer (attn_out,
// lse, o here) still compare it (never excused), as every other token.
// ---------------------------------------------------------------------------------------------------

constexpr int64_t kDsaTokens = 6, kDsaKeys = 16;

// tiny-dsa's graph over 6 tokens and 16 keys (top-k 12): the probes' shapes and order values.
StageGraph dsa_graph() {
  GraphShape gs;
  gs.tokens = kDsaTokens;
  gs.keys = kDsaKeys;
  return build_graph(*find_preset("tiny-dsa"), gs);
}

// A one-layer dump by hand of the graph's probes in `tensors`, each recorded at its level (topk and idx_scores in
// full, as runs record them; attn_out in full, lse as stats, o as sketches).
Dump dsa_dump(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  const std::map<std::string, ProbeLevel> levels{
      {"idx_scores", ProbeLevel::ProbeLevel_full}, {"topk", ProbeLevel::ProbeLevel_full},
      {"attn_out", ProbeLevel::ProbeLevel_full},   {"lse", ProbeLevel::ProbeLevel_stats},
      {"o", ProbeLevel::ProbeLevel_sketch}};
  Dump d;
  d.path = path;
  d.status = "complete";
  for (const auto& ps : dsa_graph().probes) {
    const auto it = tensors.find(ps.name);
    if (it == tensors.end()) continue;
    const ProbeRequest req = make_probe_request(ps, 1, 0, levels.at(ps.name));
    add_record(d, 0, ps, 0, compute_probe_record(it->second, "fp32", req));
  }
  return d;
}

// The reference's tensors: distinct random index scores, except that at `tie_token` the 13th best key ties exactly
// with the 12th (as keys that every head's ReLU zeroes do); topk the 12 best (ties to the lower index), ascending.
std::map<std::string, Tensor> dsa_reference(int64_t tie_token) {
  const StageGraph g = dsa_graph();
  std::mt19937_64 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::map<std::string, Tensor> t;
  for (const char* name : {"idx_scores", "attn_out", "lse", "o"}) {
    t[name] = Tensor(g.find(name)->shape);
    for (float& v : t[name].data) v = nd(rng);
  }
  Tensor& s = t["idx_scores"];
  const int64_t k = g.find("topk")->shape[1];
  const auto order = [&](int64_t tok) {
    std::vector<int> keys(kDsaKeys);
    std::iota(keys.begin(), keys.end(), 0);
    std::stable_sort(keys.begin(), keys.end(),
                     [&](int x, int y) { return s.data[tok * kDsaKeys + x] > s.data[tok * kDsaKeys + y]; });
    return keys;
  };
  const auto o = order(tie_token);
  s.data[tie_token * kDsaKeys + o[k]] = s.data[tie_token * kDsaKeys + o[k - 1]];
  Tensor topk({kDsaTokens, k});
  for (int64_t tok = 0; tok < kDsaTokens; ++tok) {
    auto keys = order(tok);
    keys.resize(k);
    std::sort(keys.begin(), keys.end());
    for (int64_t j = 0; j < k; ++j) topk.data[tok * k + j] = static_cast<float>(keys[j]);
  }
  t["topk"] = topk;
  return t;
}

// The candidate: the reference's tensors, its selection at `swap_token` (if >= 0) taking the tied 13th key for the
// 12th, and its attention output, lse and o at `bad_token` far from the reference's (what reading another key does).
std::map<std::string, Tensor> dsa_candidate(std::map<std::string, Tensor> t, int64_t swap_token, int64_t bad_token) {
  if (swap_token >= 0) {
    Tensor& topk = t["topk"];
    const Tensor& s = t["idx_scores"];
    const int64_t k = topk.dim(1);
    std::vector<int> keys(topk.data.begin() + swap_token * k, topk.data.begin() + (swap_token + 1) * k);
    const float* row = s.ptr() + swap_token * kDsaKeys;
    const auto last = *std::min_element(keys.begin(), keys.end(), [&](int x, int y) {
      return row[x] < row[y] || (row[x] == row[y] && x > y);
    });
    int tied = -1;
    for (int key = 0; key < kDsaKeys && tied < 0; ++key)
      if (key != last && row[key] == row[last] && std::find(keys.begin(), keys.end(), key) == keys.end()) tied = key;
    EXPECT_GE(tied, 0) << "no key ties with the last selected one";
    std::replace(keys.begin(), keys.end(), last, tied);
    std::sort(keys.begin(), keys.end());
    for (int64_t j = 0; j < k; ++j) topk.data[swap_token * k + j] = static_cast<float>(keys[j]);
  }
  for (const char* name : {"attn_out", "lse", "o"}) {
    Tensor& x = t[name];
    const int64_t row = x.numel() / kDsaTokens;
    for (int64_t c = 0; c < row; ++c) x.data[bad_token * row + c] *= -3.f;
  }
  return t;
}

TEST(CompareSelection, TokensWhoseTopkSwappedNearTiedKeysAreStillComparedAfterTopk) {
  const auto ref_t = dsa_reference(3);
  const Dump ref = dsa_dump("ref", ref_t), cand = dsa_dump("cand", dsa_candidate(ref_t, 3, 3));
  const CompareReport rep = compare_dumps(cand, ref, kFloor);
  const ProbeResult& topk = result(rep, "topk");
  EXPECT_TRUE(topk.selection);
  EXPECT_EQ(topk.verdict, Verdict::Verdict_pass) << topk.why;
  EXPECT_EQ(topk.near_tie_swaps, 1) << topk.why;
  EXPECT_EQ(first(rep), "attn_out");
  for (const char* name : {"attn_out", "lse", "o"}) {
    const ProbeResult& r = result(rep, name);
    EXPECT_EQ(r.verdict, Verdict::Verdict_diverge) << name << ": " << r.why;
  }
  EXPECT_EQ(result(rep, "attn_out").m.max_at.token, 3);
  int notes = 0;
  for (const auto& n : rep.notes)
    notes += n.find("layer 0: 1 token (3) whose top-k swapped near-tied keys is compared as it is in the probes "
                    "after topk") != std::string::npos;
  EXPECT_EQ(notes, 1);
  for (const auto& p : compare_to_json(rep)["probes"]) EXPECT_FALSE(p.contains("excused_tokens")) << p.dump();
}

TEST(CompareSelection, WithoutASwapTheSameDifferenceDiverges) {
  const auto ref_t = dsa_reference(3);
  const Dump ref = dsa_dump("ref", ref_t), cand = dsa_dump("cand", dsa_candidate(ref_t, -1, 3));
  const CompareReport rep = compare_dumps(cand, ref, kFloor);
  EXPECT_EQ(first(rep), "attn_out");
  EXPECT_EQ(result(rep, "topk").near_tie_swaps, 0);
  for (const char* name : {"attn_out", "lse", "o"}) {
    const ProbeResult& r = result(rep, name);
    EXPECT_EQ(r.verdict, Verdict::Verdict_diverge) << name << ": " << r.why;
  }
  EXPECT_EQ(result(rep, "attn_out").m.max_at.token, 3);
}

TEST(CompareSelection, ADifferenceAtAnotherTokenThanTheSwappedOneDiverges) {
  const auto ref_t = dsa_reference(3);
  const Dump ref = dsa_dump("ref", ref_t), cand = dsa_dump("cand", dsa_candidate(ref_t, 3, 4));
  const CompareReport rep = compare_dumps(cand, ref, kFloor);
  EXPECT_EQ(first(rep), "attn_out");
  EXPECT_EQ(result(rep, "topk").verdict, Verdict::Verdict_pass);
  for (const char* name : {"attn_out", "lse", "o"}) {
    const ProbeResult& r = result(rep, name);
    EXPECT_EQ(r.verdict, Verdict::Verdict_diverge) << name << ": " << r.why;
  }
  EXPECT_EQ(result(rep, "attn_out").m.max_at.token, 4);
}

}  // namespace
