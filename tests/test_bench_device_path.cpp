// The benchmark's device path (run_bench with an engine that times itself on a device, as the CUDA engine
// does), run on the CPU with a stand-in: the reference engine, stage "device" times from a counter clock, and
// probes queued until the end of the layer. Checks the figures the GPU runs report: per-stage and layer spans,
// the ceilings, and the probe overhead split into host probe calls and the end-of-layer wait.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <sstream>
#include <thread>

#include "core/engine/engine_timing.h"
#include "harness/report/bench_report.h"
#include "harness/run/runner.h"
#include "reference/reference_engine.h"
#include "tests/stage_test_util.h"

namespace mla {
namespace {

class FakeDeviceEngine : public ReferenceEngine, public EngineTiming {
 public:
  FakeDeviceEngine() : ReferenceEngine({}) {}
  std::string device() const override { return "fake device"; }
  EngineTiming* timing() override { return this; }
  void set_device_timing(bool on) override { timing_ = on; }
  // Every stage takes 1 ms of "device" time, ranks one after another.
  void run_stage(const StageSpec& st, int layer, int rank) override {
    if (st.stage == Stage::Stage_layer_input) ++layers_begun_;  // (the graph's first stage)
    ReferenceEngine::run_stage(st, layer, rank);
    if (timing_) timings_.push_back({st.stage, layer, rank, clock_, clock_ + 1e-3, 0});
    clock_ += 1e-3;
  }
  std::vector<StageTiming> take_stage_timings() override { return std::exchange(timings_, {}); }
  std::vector<DeviceCeiling> measure_ceilings(int repeats) override {
    return {{"fake GEMM", 1e12, 0, std::vector<double>(repeats, 1e-3)}};
  }
  // Probes finish on the "device" only when waited for, and each wait costs 2 ms; building a record "takes" 0.1 ms
  // of host time (counted, not spent). With `pipelines`, a layer's records are also done once the next layer has
  // begun (its device runs a layer's probe tail behind the next layer's launches).
  bool queues_probes() const override { return true; }
  bool pipelines_probes() const override { return pipelines; }
  bool pipelines = false;
  // A probe's "kernel" takes 0.25 ms of device time after its stage (the next stage starts that much later).
  void probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req) override {
    if (probed_layer_ != layers_begun_) ++probed_layers_;
    probed_layer_ = layers_begun_;
    pending_.push_back({layers_begun_, probe(rank, spec, req)});
    if (timing_) clock_ += kProbeDevice;
  }
  static constexpr double kProbeDevice = 2.5e-4;
  void collect_probes(std::vector<ProbeRecord>& out, bool wait) override {
    if (wait) {
      waits_after_layers.push_back(probed_layers_ - probed_at_wait_);
      probed_at_wait_ = probed_layers_;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    while (!pending_.empty() && (wait || (pipelines && pending_.front().first < layers_begun_))) {
      out.push_back(std::move(pending_.front().second));
      pending_.pop_front();
      built_.total += 1e-4;
      built_.last = 1e-4;
    }
  }
  std::vector<int> waits_after_layers;  // per wait for every record: the layers probed since the wait before
  ProbeBuildSeconds probe_build_seconds() const override { return built_; }

 private:
  bool timing_ = false;
  double clock_ = 0;
  std::vector<StageTiming> timings_;
  std::deque<std::pair<int, ProbeRecord>> pending_;  // (layers begun when started, record)
  ProbeBuildSeconds built_;
  int layers_begun_ = 0, probed_layer_ = 0, probed_layers_ = 0, probed_at_wait_ = 0;
};

// Tiny at 8 tokens, with `repeats` timed rounds and `probe_repeats` rounds of the probe overhead.
BenchOptions tiny_bench(int repeats, int probe_repeats) {
  BenchOptions o;
  o.cfg = test::preset("tiny");
  o.spec.tokens = 8;
  o.repeats = repeats;
  o.probe_repeats = probe_repeats;
  return o;
}

TEST(BenchDevicePath, SpansCeilingsAndTheProbeOverheadSplit) {
  BenchOptions o = tiny_bench(3, 2);
  o.spec.layers = 2;
  o.spec.input_norm = true;
  FakeDeviceEngine engine;
  const BenchResult r = run_bench(o, engine);
  const Runner runner(o.cfg, o.spec);
  const auto& stages = runner.graph().stages;
  ASSERT_TRUE(r.device);
  EXPECT_EQ(r.device_name, "fake device");
  ASSERT_EQ(r.ceilings.size(), 1u);
  EXPECT_DOUBLE_EQ(r.ceilings[0].time.median, 1e-3);
  // Each stage spans its one rank's 1 ms; the layer spans all its stages.
  for (const auto& s : r.stages) EXPECT_NEAR(s.time.median, 1e-3, 1e-12) << s.name;
  EXPECT_NEAR(r.layer_time.median, 1e-3 * r.stages.size(), 1e-9);
  // Two levels (stats, sketch); each layer waits 2 ms for its probes at the end, and spends some host time in
  // the probe calls (the reference computes the records there): both inside the layer's wall time.
  ASSERT_EQ(r.probes.size(), 2u);
  for (const auto& p : r.probes) {
    EXPECT_EQ(p.host_calls.samples.size(), 2u) << p.level;
    EXPECT_GE(p.end_wait.median, 2e-3) << p.level;
    EXPECT_GT(p.host_calls.median, 0.0) << p.level;
    EXPECT_LE(p.host_calls.median + p.end_wait.median, p.layer_time.median) << p.level;
    // The device span with probes comes from walks of its own with the stage events on: the fake device's
    // stages take 1 ms each whatever is probed, and each probe 0.25 ms between its stage and the next. The gap after
    // each stage but the last is its outputs' probes; the span grows by their sum (the last stage's fall after it).
    EXPECT_EQ(p.device_span.samples.size(), 2u) << p.level;
    ASSERT_EQ(p.after_stage.size(), stages.size() - 1) << p.level;
    double probed = 0;
    for (size_t i = 0; i + 1 < stages.size(); ++i) {
      const auto& a = p.after_stage[i];
      EXPECT_EQ(a.stage, stage_name(stages[i].stage));
      EXPECT_EQ(a.probes, stages[i].outputs) << a.stage;
      EXPECT_EQ(a.extra.samples.size(), 2u) << a.stage;
      EXPECT_NEAR(a.extra.median, FakeDeviceEngine::kProbeDevice * stages[i].outputs.size(), 1e-9) << a.stage;
      probed += a.extra.median;
    }
    EXPECT_GT(probed, 0.0) << p.level;
    EXPECT_EQ(p.after_span.stage, stage_name(stages.back().stage)) << p.level;
    EXPECT_EQ(p.after_span.probes, stages.back().outputs) << p.level;
    EXPECT_NEAR(p.device_span.median, r.layer_time.median + probed, 1e-9) << p.level;
    // Starting the probes is part of the probe calls; the stages' own calls take host time with and without them.
    EXPECT_EQ(p.host_starts.samples.size(), 2u) << p.level;
    EXPECT_LE(p.host_starts.median, p.host_calls.median) << p.level;
    EXPECT_GT(p.stage_calls.median, 0.0) << p.level;
    // Every record of a layer is built once (0.1 ms each, counted by the engine: a whole number of them, one per
    // probe of the layer); the last one's alone.
    const double records = p.builds.median / 1e-4;
    EXPECT_NEAR(records, std::round(records), 1e-6) << p.level;
    EXPECT_GE(records, 10.0) << p.level;
    EXPECT_DOUBLE_EQ(p.last_build.median, 1e-4) << p.level;
  }
  std::ostringstream os;
  print_bench(r, os);
  EXPECT_NE(os.str().find("probe overhead at sketch"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("waiting for probes at the end of the layer"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("on the device: the layer's span with these probes"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("host time in the stages' calls"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("the layer's last record 0.100 ms"), std::string::npos) << os.str();
  // Each round's range beside the medians (the fake engine's spans are exact: every round the same).
  EXPECT_NE(os.str().find(" rounds, each "), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("its probes' device time"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find(std::string("\n    ") + stage_name(stages[0].stage)), std::string::npos) << os.str();
  EXPECT_NE(os.str().find(std::string("(the last stage's, ") + stage_name(stages.back().stage) + ": "), std::string::npos) << os.str();
  EXPECT_GT(r.bare_stage_calls.median, 0.0);
  const auto j = bench_to_json(r);
  EXPECT_GE(j["probe_overhead"][1]["end_wait"]["median_s"].get<double>(), 2e-3) << j.dump();
  EXPECT_DOUBLE_EQ(j["probe_overhead"][1]["last_build"]["median_s"].get<double>(), 1e-4) << j.dump();
  ASSERT_EQ(j["probe_overhead"][1]["after_stage"].size(), stages.size() - 1) << j.dump();
  EXPECT_EQ(j["probe_overhead"][1]["after_stage"][0]["probes"], stages[0].outputs) << j.dump();
  EXPECT_EQ(j["probe_overhead"][1]["after_span"]["stage"], stage_name(stages.back().stage)) << j.dump();
}

// An engine that holds its probes to the end of the layer (as the CUDA engine at decode): the report says so and
// leaves out the per-stage gaps, which then say nothing; the JSON marks the level held.
class HoldingFakeEngine : public FakeDeviceEngine {
 public:
  bool holds_probes_of(int64_t rows) const override { return rows <= 8; }
};

TEST(BenchDevicePath, HeldProbesAreReportedAsTheLayersTail) {
  BenchOptions o = tiny_bench(2, 1);
  HoldingFakeEngine held;
  const BenchResult r = run_bench(o, held);
  ASSERT_FALSE(r.probes.empty());
  for (const auto& p : r.probes) EXPECT_TRUE(p.held) << p.level;
  std::ostringstream os;
  print_bench(r, os);
  EXPECT_NE(os.str().find("held (cuda:probe_launch=layer or attention)"), std::string::npos) << os.str();
  EXPECT_EQ(os.str().find("its probes' device time"), std::string::npos) << os.str();
  EXPECT_TRUE(bench_to_json(r)["probe_overhead"][0]["held"].get<bool>());
  o.spec.tokens = 9;  // more rows than it holds: launched after their stages, reported as before
  const BenchResult after = run_bench(o, held);
  for (const auto& p : after.probes) EXPECT_FALSE(p.held) << p.level;
  EXPECT_FALSE(bench_to_json(after)["probe_overhead"][0]["held"].get<bool>());
}

// The probe overhead in runs of layers back to back (BenchOptions::run_layers): a pipelining engine's layer records
// are taken while the next layer runs, so a run waits for every record once, at its end; one that does not pipeline
// waits at each layer's end, as one layer alone does. Both take every record they start (the bench checks).
TEST(BenchDevicePath, RunsOfLayersWaitOnceWhenTheEnginePipelines) {
  BenchOptions o = tiny_bench(3, 2);
  o.run_layers = 5;
  for (bool pipelines : {false, true}) {
    SCOPED_TRACE(pipelines ? "pipelining" : "not pipelining");
    FakeDeviceEngine engine;
    engine.pipelines = pipelines;
    const BenchResult r = run_bench(o, engine);
    EXPECT_EQ(r.pipelined, pipelines);
    EXPECT_EQ(r.run_layers, 5);
    EXPECT_EQ(r.run_wall.samples.size(), 2u);
    ASSERT_EQ(r.probes.size(), 2u);
    for (const auto& p : r.probes) EXPECT_EQ(p.run_time.samples.size(), 2u) << p.level;
    // Waits that followed 5 layers: the timed runs (2 levels x 2 rounds) when pipelining, none otherwise.
    const auto after5 = std::count(engine.waits_after_layers.begin(), engine.waits_after_layers.end(), 5);
    EXPECT_EQ(after5, pipelines ? 4 : 0);
    // The rest: one layer alone, and the warm-up runs of 2 layers.
    for (int n : engine.waits_after_layers) EXPECT_TRUE(n == 1 || (pipelines && (n == 2 || n == 5))) << n;
    std::ostringstream os;
    print_bench(r, os);
    EXPECT_NE(os.str().find("in a run of 5 layers back to back"), std::string::npos) << os.str();
    EXPECT_NE(os.str().find(pipelines ? "a layer's records built while the next one runs"
                                      : "each layer's records awaited at its end"),
              std::string::npos)
        << os.str();
    EXPECT_NE(os.str().find("one layer alone, layer wall"), std::string::npos) << os.str();
    const auto j = bench_to_json(r);
    EXPECT_EQ(j["run_layers"].get<int>(), 5);
    EXPECT_GT(j["probe_overhead"][1]["run_ratio"].get<double>(), 0.0) << j.dump();
  }
}

}  // namespace
}  // namespace mla
