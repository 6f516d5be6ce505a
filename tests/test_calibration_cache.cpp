// The on-disk calibration cache: a second calibration of the same run is read back equal to the computed one, and
// the key changes with anything the calibration depends on (weights, inputs, spec, config, precision, k).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/model/config.h"
#include "harness/run/calibration_cache.h"
#include "tests/cli_util.h"
#include "tests/world_util.h"

namespace {

using namespace mla;

// The tiny model, 8 prefill tokens.
struct World : test::TinyWorld {
  World() : TinyWorld(eight_tokens()) {}
  static RunSpec eight_tokens() {
    RunSpec s;
    s.tokens = 8;
    return s;
  }
};

// MLA_CALIBRATION_CACHE pointed at a scratch folder for the test's duration.
struct CacheDir {
  test::ScratchDir dir{"calibration_cache"};
  std::string before;
  bool had = false;
  CacheDir() {
    if (const char* v = std::getenv("MLA_CALIBRATION_CACHE")) had = true, before = v;
    setenv("MLA_CALIBRATION_CACHE", dir.str().c_str(), 1);
  }
  ~CacheDir() {
    if (had) setenv("MLA_CALIBRATION_CACHE", before.c_str(), 1);
    else unsetenv("MLA_CALIBRATION_CACHE");
  }
  int files() const {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.dir())) n += e.path().extension() == ".json";
    return n;
  }
};

TEST(CalibrationCache, SecondCalibrationIsReadBackEqual) {
  const CacheDir cache;
  const World w;
  bool hit = true;
  const ToleranceModel a = calibrate_cached(w.cfg, w.spec, w.weights, w.inputs, Precision::Precision_bf16, 4.0, nullptr, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(cache.files(), 1);
  const ToleranceModel b = calibrate_cached(w.cfg, w.spec, w.weights, w.inputs, Precision::Precision_bf16, 4.0, nullptr, &hit);
  EXPECT_TRUE(hit);
  ASSERT_FALSE(a.per_probe.empty());
  ASSERT_EQ(a.per_probe.size(), b.per_probe.size());
  for (const auto& [name, t] : a.per_probe) {
    ASSERT_TRUE(b.per_probe.count(name)) << name;
    EXPECT_EQ(t.rel_l2, b.per_probe.at(name).rel_l2) << name;  // bit for bit: JSON doubles round-trip
    EXPECT_EQ(t.token_rel, b.per_probe.at(name).token_rel) << name;
    EXPECT_EQ(t.origin, b.per_probe.at(name).origin) << name;
  }
  // Equal to an uncached calibration.
  const ToleranceModel c = calibrate(w.cfg, w.spec, w.weights, w.inputs, Precision::Precision_bf16, 4.0);
  for (const auto& [name, t] : c.per_probe) EXPECT_EQ(t.rel_l2, b.per_probe.at(name).rel_l2) << name;
  // FP32 has nothing to calibrate: never cached.
  calibrate_cached(w.cfg, w.spec, w.weights, w.inputs, Precision::Precision_fp32, 4.0, nullptr, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(cache.files(), 1);
}

TEST(CalibrationCache, KeyChangesWithEverythingCalibrationReads) {
  const World w;
  const auto key = [](const World& x, Precision p = Precision::Precision_bf16, double k = 4.0) {
    return calibration_cache_key(x.cfg, x.spec, x.weights, x.inputs, p, k);
  };
  const std::string base = key(w);
  EXPECT_EQ(base, key(w));  // deterministic
  EXPECT_NE(base, key(w, Precision::Precision_fp16));
  EXPECT_NE(base, key(w, Precision::Precision_bf16, 3.0));
  {
    World x;
    x.weights[0].kv_b_proj.data[17] += 1.0f / 1024;  // one weight value
    EXPECT_NE(base, key(x));
  }
  {
    World x;
    x.inputs.x.data[5] = -x.inputs.x.data[5];  // one input value
    EXPECT_NE(base, key(x));
  }
  {
    World x;
    x.inputs.batch.positions[0] += 1;  // the batch layout
    EXPECT_NE(base, key(x));
  }
  {
    World x;
    x.spec.tp = 2;  // the run spec
    EXPECT_NE(base, key(x));
  }
  {
    World x;
    x.cfg.rope_theta *= 2;  // the config
    EXPECT_NE(base, key(x));
  }
}

TEST(CalibrationCache, NamedWeightsAreMadeOnlyOnAMiss) {
  const CacheDir cache;
  const World w;
  int made = 0;
  const CalibrationWeights named{"synthetic seed 3", [&] {
                                   ++made;
                                   return w.weights;
                                 }};
  bool hit = true;
  const ToleranceModel a = calibrate_cached(w.cfg, w.spec, named, w.inputs, Precision::Precision_bf16, 4.0, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(made, 1);
  const ToleranceModel b = calibrate_cached(w.cfg, w.spec, named, w.inputs, Precision::Precision_bf16, 4.0, &hit);
  EXPECT_TRUE(hit);
  EXPECT_EQ(made, 1);  // a hit neither makes nor hashes the weights
  ASSERT_EQ(a.per_probe.size(), b.per_probe.size());
  for (const auto& [name, t] : a.per_probe) EXPECT_EQ(t.rel_l2, b.per_probe.at(name).rel_l2) << name;
  // Another name is another calibration; so is a change of anything else in the key.
  calibrate_cached(w.cfg, w.spec, CalibrationWeights{"synthetic seed 4", named.make}, w.inputs,
                   Precision::Precision_bf16, 4.0, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(made, 2);
  calibrate_cached(w.cfg, w.spec, named, w.inputs, Precision::Precision_bf16, 3.0, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(cache.files(), 3);
  // Unnamed weights are keyed by their bytes, as the vector form keys them: the same file.
  calibrate_cached(w.cfg, w.spec, CalibrationWeights{"", named.make}, w.inputs, Precision::Precision_bf16, 4.0, &hit);
  EXPECT_FALSE(hit);
  calibrate_cached(w.cfg, w.spec, w.weights, w.inputs, Precision::Precision_bf16, 4.0, nullptr, &hit);
  EXPECT_TRUE(hit);
}

TEST(CalibrationCache, OffComputesWithoutWriting) {
  const CacheDir cache;
  setenv("MLA_CALIBRATION_CACHE", "off", 1);
  EXPECT_EQ(calibration_cache_dir(), "");
  const World w;
  bool hit = true;
  calibrate_cached(w.cfg, w.spec, w.weights, w.inputs, Precision::Precision_bf16, 4.0, nullptr, &hit);
  calibrate_cached(w.cfg, w.spec, w.weights, w.inputs, Precision::Precision_bf16, 4.0, nullptr, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(cache.files(), 0);
}

}  // namespace
