// The weights a bisect loads once and its child runs read (core/weights/weight_cache.h): an entry gives back what
// load_weights gives, bit for bit; an entry of other arguments, or one that does not read back whole, is never taken;
// the injected weights dequantized again from the packed bytes equal load_weights with the injections; and a bisect
// hands its children the cache and leaves no cache folder behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/model/config.h"
#include "core/weights/loader.h"
#include "core/weights/weight_cache.h"
#include "probes/dump.h"
#include "tests/cli_util.h"
#include "tests/test_weights_util.h"

namespace {

using namespace mla;
using namespace mla::test;
namespace fs = std::filesystem;

void expect_same_weights(const LoadedWeights& got, const LoadedWeights& want, bool packed) {
  ASSERT_EQ(got.layers.size(), want.layers.size());
  EXPECT_EQ(got.first_layer, want.first_layer);
  EXPECT_EQ(got.description, want.description);
  for (size_t l = 0; l < want.layers.size(); ++l) {
    const auto g = got.layers[l].tensors();
    const auto w = want.layers[l].tensors();
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(g[i]->shape, w[i]->shape) << "layer " << l << " tensor " << i;
      EXPECT_TRUE(bit_equal(g[i]->data, w[i]->data, "layer " + std::to_string(l) + " tensor " + std::to_string(i)));
    }
  }
  if (!packed) return;
  ASSERT_EQ(got.packed.size(), want.packed.size());
  for (size_t l = 0; l < want.packed.size(); ++l) {
    ASSERT_EQ(got.packed[l].size(), want.packed[l].size());
    for (const auto& [name, pw] : want.packed[l]) {
      SCOPED_TRACE(name);
      const PackedWeight& q = got.packed[l].at(name);
      EXPECT_EQ(q.format, pw.format);
      EXPECT_EQ(q.rows, pw.rows);
      EXPECT_EQ(q.cols, pw.cols);
      EXPECT_EQ(q.data, pw.data);
      EXPECT_EQ(q.scales, pw.scales);
      EXPECT_EQ(q.block_rows, pw.block_rows);
      EXPECT_EQ(q.block_cols, pw.block_cols);
      EXPECT_EQ(q.global_scale, pw.global_scale);
      EXPECT_EQ(q.origin, pw.origin);
    }
  }
}

std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path());
  return v;
}

TEST(WeightCache, AnEntryGivesBackWhatLoadWeightsGives) {
  ScratchDir tmp("weight_cache_entry");
  const std::string dir = tmp.path("cache");
  const MlaConfig cfg = *find_preset("tiny-dsa");
  const RunSpec spec = spec_of(2);
  WeightSpec ws;
  ws.format = "nvfp4";
  const LoadedWeights want = load_weights(ws, cfg, spec, 7, {}, true);
  const LoadedWeights first = load_weights_shared(dir, ws, cfg, spec, 7, {}, true);  // loads and writes
  ASSERT_EQ(entries(dir).size(), 1u);
  expect_same_weights(first, want, true);
  const LoadedWeights again = load_weights_shared(dir, ws, cfg, spec, 7, {}, true);  // reads
  expect_same_weights(again, want, true);
  const LoadedWeights layers_only = load_weights_shared(dir, ws, cfg, spec, 7);  // the entry without its packed
  EXPECT_TRUE(layers_only.packed.empty());
  expect_same_weights(layers_only, want, false);
  EXPECT_EQ(entries(dir).size(), 1u);
  // Other arguments name other entries: the seed, the format, the injections, the layer count.
  WeightSpec fp8 = ws;
  fp8.format = "fp8";
  expect_same_weights(load_weights_shared(dir, ws, cfg, spec, 8), load_weights(ws, cfg, spec, 8), false);
  expect_same_weights(load_weights_shared(dir, fp8, cfg, spec, 7), load_weights(fp8, cfg, spec, 7), false);
  const auto swap = parse_injections("nvfp4-nibble-swap");
  expect_same_weights(load_weights_shared(dir, ws, cfg, spec, 7, swap), load_weights(ws, cfg, spec, 7, swap), false);
  expect_same_weights(load_weights_shared(dir, ws, cfg, spec_of(1), 7), load_weights(ws, cfg, spec_of(1), 7), false);
  EXPECT_EQ(entries(dir).size(), 5u);
}

TEST(WeightCache, AnEntryThatDoesNotReadBackWholeIsLoadedAgain) {
  ScratchDir tmp("weight_cache_damaged");
  const std::string dir = tmp.path("cache");
  const MlaConfig cfg = *find_preset("tiny");
  const RunSpec spec = spec_of(1);
  WeightSpec ws;
  ws.format = "fp8";
  const LoadedWeights want = load_weights(ws, cfg, spec, 3);
  load_weights_shared(dir, ws, cfg, spec, 3);
  const fs::path entry = entries(dir).at(0);
  const auto size = fs::file_size(entry);
  // Cut short, then one byte changed (in the description): both read as a miss and load again.
  fs::resize_file(entry, size - 9);
  expect_same_weights(load_weights_shared(dir, ws, cfg, spec, 3), want, false);
  ASSERT_EQ(fs::file_size(entry), size);  // written again whole
  {
    std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64);
    f.put('\x7f');
  }
  expect_same_weights(load_weights_shared(dir, ws, cfg, spec, 3), want, false);
  // A folder that cannot be written: the weights still load.
  ScratchDir ro("weight_cache_file");
  spit(ro.path("not_a_folder"), "x");
  expect_same_weights(load_weights_shared(ro.path("not_a_folder"), ws, cfg, spec, 3), want, false);
}

TEST(WeightCache, RedequantizedWeightsEqualALoadWithTheInjections) {
  const MlaConfig cfg = *find_preset("tiny-dsa");
  const RunSpec spec = spec_of(2);
  const std::pair<const char*, const char*> cases[] = {
      {"nvfp4", "nvfp4-nibble-swap"}, {"nvfp4-ct", "nvfp4-global-recip"}, {"fp8:16", "fp8-scale-transpose"},
      {"nvfp4", "nvfp4-nibble-swap,rope-neox"}};
  for (const auto& [format, inject] : cases) {
    SCOPED_TRACE(std::string(format) + " " + inject);
    WeightSpec ws;
    ws.format = format;
    const auto injections = parse_injections(inject);
    const LoadedWeights clean = load_weights(ws, cfg, spec, 11, {}, true);
    for (bool packed : {false, true}) {
      LoadedWeights got;
      ASSERT_TRUE(redequantize(clean, injections, packed, got));
      expect_same_weights(got, load_weights(ws, cfg, spec, 11, injections, packed), packed);
      EXPECT_EQ(got.packed.empty(), !packed);
    }
  }
  // Where it cannot: no packed projections, or injections that touch none of them (load_weights then says why).
  WeightSpec ws;
  ws.format = "nvfp4";
  LoadedWeights out;
  EXPECT_FALSE(redequantize(load_weights(ws, cfg, spec, 11), parse_injections("nvfp4-nibble-swap"), false, out));
  EXPECT_FALSE(redequantize(load_weights(ws, cfg, spec, 11, {}, true), parse_injections("fp8-scale-transpose"), false,
                            out));
  EXPECT_TRUE(out.layers.empty());
}

TEST(WeightCache, RunReadsTheFolderItsEnvironmentNames) {
  ScratchDir tmp("weight_cache_env");
  const std::string args = "run --model tiny-dsa --tokens 8 --weight-format fp8:16 --no-table --out ";
  CliRun how;
  how.env = std::string(kWeightCacheEnv) + "=" + tmp.path("cache");
  const CliResult first = run_cli(args + tmp.path("a.h5"), how);
  ASSERT_EQ(first.exit_code, 0) << describe(args, first);
  EXPECT_EQ(first.err.find("weights read from"), std::string::npos) << first.err;
  const CliResult second = run_cli(args + tmp.path("b.h5"), how);
  ASSERT_EQ(second.exit_code, 0) << describe(args, second);
  EXPECT_NE(second.err.find("weights read from " + tmp.path("cache")), std::string::npos) << second.err;
  // The same records, checksum for checksum, weights and probes.
  const Dump a = read_dump(tmp.path("a.h5")), b = read_dump(tmp.path("b.h5"));
  ASSERT_EQ(a.probes.size(), b.probes.size());
  ASSERT_EQ(a.weights.size(), b.weights.size());
  ASSERT_FALSE(a.weights.empty());
  const auto same = [](const std::vector<DumpProbe>& x, const std::vector<DumpProbe>& y) {
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(x[i].name, y[i].name);
      ASSERT_EQ(x[i].ranks.size(), y[i].ranks.size()) << x[i].name;
      for (size_t r = 0; r < x[i].ranks.size(); ++r)
        EXPECT_EQ(x[i].ranks[r].checksum, y[i].ranks[r].checksum) << x[i].name;
    }
  };
  same(a.weights, b.weights);
  same(a.probes, b.probes);
}

TEST(WeightCache, BisectHandsItsChildrenTheCacheAndRemovesIt) {
  ScratchDir tmp("weight_cache_bisect");
  const std::string wd = tmp.path("wd");
  const CliResult r = run_cli("bisect --model tiny --tokens 8 --weight-format nvfp4 --candidate reference:precision=bf16"
                              " --inject nvfp4-nibble-swap --workdir " + wd + " --quiet");
  ASSERT_EQ(r.exit_code, 1) << describe("bisect", r);
  EXPECT_NE(r.out.find("weight q_a_proj"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(fs::path(wd) / ".weights"));
  // The children's dumps hold the weights the parent loaded: the candidate's are the injected ones.
  const CliResult ref_run = run_cli("run --model tiny --tokens 8 --weight-format nvfp4 --quiet --out " +
                                    tmp.path("plain.h5"));
  ASSERT_EQ(ref_run.exit_code, 0) << describe("run", ref_run);
  const CliResult same = run_cli("compare " + wd + "/reference.h5 " + tmp.path("plain.h5") + " --quiet");
  EXPECT_EQ(same.exit_code, 0) << describe("compare", same);
}

}  // namespace
