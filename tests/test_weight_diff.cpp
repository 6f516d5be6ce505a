// Weight records: what engines record (the rank's shard of each weight, as used), how dumps keep them (HDF5 and the
// journal), how compare judges them first, and the patterns the weight rules name on synthetic pairs; end to end,
// bisect names a wrong dequantization or a wrong shard as a weight that differs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "harness/compare/weight_diff.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "probes/collect.h"
#include "reference/reference_engine.h"

namespace mla {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed) {
  Tensor t(std::move(shape));
  fill_normal(t.ptr(), t.numel(), seed, 1, 1.0f);
  return t;
}

// The rank's block of a global weight under a contract (rows, columns, or whole).
Tensor shard_of(const Tensor& g, Contract c, int tp, int rank) {
  if (c == Contract::Contract_replicated || tp == 1) return g;
  const int64_t R = g.shape[0], C = g.shape[1];
  const bool rows = c == Contract::Contract_rows;
  const int64_t r0 = rows ? rank * R / tp : 0, r1 = rows ? (rank + 1) * R / tp : R;
  const int64_t c0 = rows ? 0 : rank * C / tp, c1 = rows ? C : (rank + 1) * C / tp;
  Tensor s({r1 - r0, c1 - c0});
  for (int64_t i = r0; i < r1; ++i)
    for (int64_t j = c0; j < c1; ++j) s.data[(i - r0) * (c1 - c0) + (j - c0)] = g.data[i * C + j];
  return s;
}

struct W {
  std::string name;
  Contract contract;
  Tensor global;
};

// A dump holding only weights, each rank's record computed as a run computes it.
Dump weights_dump(const std::vector<W>& ws, int tp, ProbeLevel level, int swap_rank_blocks = -1) {
  Dump d;
  d.meta.tp = tp;
  int order = 0;
  for (const auto& w : ws) {
    ProbeSpec spec{w.name, Stage::Stage_q_a_proj, w.contract, w.global.shape, -1, -1, order++};
    for (int r = 0; r < tp; ++r) {
      // swap_rank_blocks = k: rank k holds rank k-1's block (a shard cut at the wrong offset).
      const int src = r == swap_rank_blocks && r > 0 ? r - 1 : r;
      const Tensor local = shard_of(w.global, w.contract, tp, src);
      ProbeRequest req = make_probe_request(spec, tp, r, level);
      add_weight_record(d, 0, spec, r, compute_probe_record(local, "fp32", req));
    }
  }
  d.status = "complete";
  return d;
}

CompareReport compare_only_weights(const Dump& a, const Dump& b) {
  CompareReport rep;
  compare_weights(a, b, ToleranceModel{}, {}, rep);
  return rep;
}

TEST(WeightDiff, IdenticalWeightsPass) {
  const Tensor w = random_tensor({32, 48}, 1);
  const Dump a = weights_dump({{"q_a_proj", Contract::Contract_replicated, w}}, 1, ProbeLevel::ProbeLevel_full);
  const auto rep = compare_only_weights(a, a);
  ASSERT_EQ(rep.weights.size(), 1u);
  EXPECT_EQ(rep.weights[0].verdict, Verdict::Verdict_pass);
  EXPECT_EQ(rep.first_weight, -1);
}

TEST(WeightDiff, PureScaleOnFullTensorsAndOnSketches) {
  const Tensor w = random_tensor({32, 48}, 2);
  Tensor w2 = w;
  for (auto& v : w2.data) v *= 2.0f;
  for (auto level : {ProbeLevel::ProbeLevel_full, ProbeLevel::ProbeLevel_sketch}) {
    const Dump b = weights_dump({{"q_a_proj", Contract::Contract_replicated, w}}, 1, level);
    const Dump a = weights_dump({{"q_a_proj", Contract::Contract_replicated, w2}}, 1, level);
    const auto rep = compare_only_weights(a, b);
    ASSERT_EQ(rep.first_weight, 0);
    EXPECT_NE(rep.weights[0].pattern.find("pure scale"), std::string::npos) << rep.weights[0].pattern;
    EXPECT_NE(rep.weights[0].pattern.find("times 2"), std::string::npos) << rep.weights[0].pattern;
  }
}

TEST(WeightDiff, TransposedSquareWeight) {
  const Tensor w = random_tensor({40, 40}, 3);
  Tensor t = w;
  for (int64_t i = 0; i < 40; ++i)
    for (int64_t j = 0; j < 40; ++j) t.data[i * 40 + j] = w.data[j * 40 + i];
  const auto rep = compare_only_weights(weights_dump({{"o_proj", Contract::Contract_replicated, t}}, 1, ProbeLevel::ProbeLevel_full),
                                        weights_dump({{"o_proj", Contract::Contract_replicated, w}}, 1, ProbeLevel::ProbeLevel_full));
  ASSERT_EQ(rep.first_weight, 0);
  EXPECT_NE(rep.weights[0].pattern.find("transposed"), std::string::npos) << rep.weights[0].pattern;
}

TEST(WeightDiff, BlockScalesOnTheWrongBlocksAreBlockShaped) {
  const int64_t R = 64, C = 96, B = 16;
  const Tensor w = random_tensor({R, C}, 4);
  Tensor x = w;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) {
      const int64_t bi = i / B, bj = j / B;
      x.data[i * C + j] *= bi == bj ? 1.0f : 0.5f + 0.25f * static_cast<float>((bi * 3 + bj) % 4);  // diagonal exact
    }
  const auto rep = compare_only_weights(weights_dump({{"q_a_proj", Contract::Contract_replicated, x}}, 1, ProbeLevel::ProbeLevel_full),
                                        weights_dump({{"q_a_proj", Contract::Contract_replicated, w}}, 1, ProbeLevel::ProbeLevel_full));
  ASSERT_EQ(rep.first_weight, 0);
  EXPECT_NE(rep.weights[0].pattern.find("block-shaped"), std::string::npos) << rep.weights[0].pattern;
  EXPECT_NE(rep.weights[0].pattern.find("16x16"), std::string::npos) << rep.weights[0].pattern;
}

TEST(WeightDiff, ValuesInTheWrongPlacesKeepTheNorms) {
  const Tensor w = random_tensor({32, 64}, 5);
  Tensor x = w;  // the two 4-bit elements of each byte exchanged: neighbours swapped
  for (int64_t i = 0; i + 1 < x.numel(); i += 2) std::swap(x.data[i], x.data[i + 1]);
  const auto rep = compare_only_weights(weights_dump({{"kv_b_proj", Contract::Contract_replicated, x}}, 1, ProbeLevel::ProbeLevel_full),
                                        weights_dump({{"kv_b_proj", Contract::Contract_replicated, w}}, 1, ProbeLevel::ProbeLevel_full));
  ASSERT_EQ(rep.first_weight, 0);
  EXPECT_NE(rep.weights[0].pattern.find("layout"), std::string::npos) << rep.weights[0].pattern;
}

TEST(WeightDiff, TensorUnderTheWrongName) {
  const Tensor q = random_tensor({24, 32}, 6), kv = random_tensor({24, 32}, 7);
  const Dump b = weights_dump({{"q_a_proj", Contract::Contract_replicated, q}, {"kv_a_proj_with_mqa", Contract::Contract_replicated, kv}},
                              1, ProbeLevel::ProbeLevel_sketch);
  const Dump a = weights_dump({{"q_a_proj", Contract::Contract_replicated, kv}, {"kv_a_proj_with_mqa", Contract::Contract_replicated, kv}},
                              1, ProbeLevel::ProbeLevel_sketch);
  const auto rep = compare_only_weights(a, b);
  ASSERT_EQ(rep.first_weight, 0);
  EXPECT_EQ(rep.weights[1].verdict, Verdict::Verdict_pass);
  EXPECT_NE(rep.weights[0].pattern.find("wrong name"), std::string::npos) << rep.weights[0].pattern;
  EXPECT_NE(rep.weights[0].pattern.find("kv_a_proj_with_mqa"), std::string::npos) << rep.weights[0].pattern;
}

TEST(WeightDiff, ShardCutAtTheWrongOffsetNamesTheRanks) {
  const Tensor w = random_tensor({64, 32}, 8);
  for (auto level : {ProbeLevel::ProbeLevel_full, ProbeLevel::ProbeLevel_sketch}) {
    const Dump b = weights_dump({{"q_b_proj", Contract::Contract_rows, w}}, 4, level);
    const Dump a = weights_dump({{"q_b_proj", Contract::Contract_rows, w}}, 4, level, /*swap_rank_blocks=*/2);
    const auto rep = compare_only_weights(a, b);
    ASSERT_EQ(rep.first_weight, 0);
    const auto& r = rep.weights[0];
    EXPECT_EQ(r.ranks_off, std::vector<int>{2});
    EXPECT_NE(r.pattern.find("sharding"), std::string::npos) << r.pattern;
    EXPECT_NE(r.pattern.find("rank 2 holds rank 1's block"), std::string::npos) << r.pattern;
    EXPECT_NE(weight_sentence(r).find("on rank 2"), std::string::npos) << weight_sentence(r);
  }
}

TEST(WeightDiff, ColumnsShardsGatherLikeTheGlobalWeight) {
  const Tensor w = random_tensor({16, 64}, 9);
  const Dump d = weights_dump({{"o_proj", Contract::Contract_columns, w}}, 4, ProbeLevel::ProbeLevel_full);
  const Gathered g = gather(d.weights[0]);
  ASSERT_TRUE(g.full);
  EXPECT_EQ(g.data.data, w.data);
  // The sketches of the column blocks add up to the sketch of the whole row.
  const Dump whole = weights_dump({{"o_proj", Contract::Contract_columns, w}}, 1, ProbeLevel::ProbeLevel_sketch);
  const Gathered gs = gather(weights_dump({{"o_proj", Contract::Contract_columns, w}}, 4, ProbeLevel::ProbeLevel_sketch).weights[0]);
  ASSERT_EQ(gs.sketch_rows.size(), whole.weights[0].ranks[0].sketch.size());
  for (size_t i = 0; i < gs.sketch_rows.size(); ++i)
    EXPECT_NEAR(gs.sketch_rows[i], whole.weights[0].ranks[0].sketch[i], 1e-4);
}

TEST(WeightDiff, RowsOffAreNamed) {
  const Tensor w = random_tensor({64, 32}, 10);
  Tensor x = w;
  for (int64_t i = 10 * 32; i < 20 * 32; ++i) x.data[i] = -x.data[i] * 0.3f + 0.1f;
  const auto rep = compare_only_weights(weights_dump({{"q_a_proj", Contract::Contract_replicated, x}}, 1, ProbeLevel::ProbeLevel_full),
                                        weights_dump({{"q_a_proj", Contract::Contract_replicated, w}}, 1, ProbeLevel::ProbeLevel_full));
  ASSERT_EQ(rep.first_weight, 0);
  EXPECT_NE(rep.weights[0].pattern.find("rows 10-19"), std::string::npos) << rep.weights[0].pattern;
}

TEST(WeightDiff, NoWeightsOnOneSideIsANoteNotAFailure) {
  const Dump a = weights_dump({{"q_a_proj", Contract::Contract_replicated, random_tensor({8, 8}, 11)}}, 1,
                              ProbeLevel::ProbeLevel_sketch);
  Dump none;
  const auto rep = compare_only_weights(none, a);
  EXPECT_TRUE(rep.weights.empty());
  EXPECT_EQ(rep.first_weight, -1);
  ASSERT_EQ(rep.notes.size(), 1u);
  EXPECT_NE(rep.notes[0].find("the candidate recorded none"), std::string::npos);
}

// A reference run records each rank's shard of each weight, exactly the checkpoint's values, and a dump keeps them
// through HDF5 and through a journal whose writer died.
TEST(WeightRecords, RunRecordsEveryRanksShardAndDumpsKeepThem) {
  const MlaConfig cfg = *find_preset("tiny");
  RunSpec spec;
  spec.tokens = 8;
  spec.tp = 2;
  const auto weights = synthetic_weights(cfg, 1, false, 5);
  const Inputs in = synthetic_inputs(cfg, spec, weights);
  Runner runner(cfg, spec);
  ReferenceEngine engine({});
  ProbePlan plan;
  plan.level = ProbeLevel::ProbeLevel_full;
  CollectSink sink({}, spec.tp);
  runner.run(engine, weights, in, plan, sink);
  Dump d = sink.take();
  const auto specs = build_weights(cfg, spec.graph_shape());
  ASSERT_EQ(d.weights.size(), specs.size());
  for (const auto& w : d.weights) {
    ASSERT_EQ(w.ranks.size(), 2u) << w.name;
    const Gathered g = gather(w);
    ASSERT_TRUE(g.full) << w.name;
    const Tensor& want = weights[0].*weight_field(w.name);
    EXPECT_EQ(g.data.data, want.data) << w.name;
  }
  const test::ScratchDir dir("weight_records");
  const std::string path = dir.path("w.h5");
  d.meta.tp = 2;
  d.status = "complete";
  write_dump_h5(d, path);
  const Dump back = read_dump(path);
  ASSERT_EQ(back.weights.size(), d.weights.size());
  for (size_t i = 0; i < d.weights.size(); ++i) {
    EXPECT_EQ(back.weights[i].name, d.weights[i].name);
    EXPECT_EQ(back.weights[i].contract, d.weights[i].contract);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_EQ(back.weights[i].ranks[r].checksum, d.weights[i].ranks[r].checksum);
      EXPECT_EQ(back.weights[i].ranks[r].data.data, d.weights[i].ranks[r].data.data);
    }
  }
  // A writer that never finishes (killed): the journal holds the weights, recovery folds them in.
  const std::string jpath = dir.path("j.h5");
  {
    DumpMeta meta;
    meta.tp = 2;
    DumpWriter w(jpath, meta, nullptr);
    for (const auto& p : d.weights)
      for (size_t r = 0; r < p.ranks.size(); ++r) {
        const ProbeSpec* s = nullptr;
        for (const auto& x : specs)
          if (x.name == p.name) s = &x;
        w.record_weight(0, *s, static_cast<int>(r), p.ranks[r]);
      }
  }  // destroyed without finish(): the journal stays
  const Dump rec = read_dump(jpath);
  EXPECT_NE(rec.status.find("stopped"), std::string::npos) << rec.status;
  ASSERT_EQ(rec.weights.size(), d.weights.size());
  EXPECT_EQ(rec.weights.back().ranks[1].checksum, d.weights.back().ranks[1].checksum);
}

// End to end: a wrong dequantization or a wrong shard in the candidate is named as the weight that differs.
struct WeightBugCase {
  const char* args;
  const char* weight;
  const char* words;
};

TEST(WeightRecords, BisectNamesTheWeightThatDiffers) {
  const WeightBugCase cases[] = {
      {"--weight-format nvfp4 --inject nvfp4-nibble-swap", "q_a_proj", "layout"},
      {"--weight-format fp8:16 --inject fp8-scale-transpose", "q_a_proj", "block-shaped"},
      {"--weight-format nvfp4-ct --inject nvfp4-global-recip", "q_a_proj", "pure scale"},
      {"--tp 2 --inject tp-head-offset", "q_b_proj", "sharding"},
  };
  const test::ScratchDir dir("weight_bisect");
  for (const auto& c : cases) {
    const std::string args = std::string("bisect --model tiny --tokens 16 ") + c.args + " --workdir " + dir.str() +
                             " --json " + dir.path("b.json");
    const auto r = test::run_cli(args);
    ASSERT_EQ(r.exit_code, 1) << test::describe(args, r);
    std::ifstream f(dir.path("b.json"));
    const auto j = nlohmann::json::parse(f);
    ASSERT_TRUE(j["weight_cause"].is_object()) << args << "\n" << j.dump(1).substr(0, 2000);
    EXPECT_EQ(j["weight_cause"]["weight"], c.weight) << args;
    const std::string pattern = j["diagnosis"]["pattern"].get<std::string>();
    EXPECT_NE(pattern.find(std::string("weight ") + c.weight + " differs"), std::string::npos) << args << ": " << pattern;
    EXPECT_NE(pattern.find(c.words), std::string::npos) << args << ": " << pattern;
    EXPECT_NE(j["headline"].get<std::string>().find(std::string("weight ") + c.weight), std::string::npos) << j["headline"];
    EXPECT_GT(j["compare"]["divergent_weights"].get<int>(), 0);
  }
  // Clean: every weight compared, none differs.
  const std::string args = "bisect --model tiny --tokens 16 --tp 2 --workdir " + dir.str() + " --json " + dir.path("c.json");
  const auto r = test::run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << test::describe(args, r);
  std::ifstream f(dir.path("c.json"));
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["compare"]["weights"].size(), 7u);
  EXPECT_EQ(j["compare"]["divergent_weights"], 0);
  EXPECT_TRUE(j["weight_cause"].is_null() || !j.contains("weight_cause"));
}

}  // namespace
}  // namespace mla
