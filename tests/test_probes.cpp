// Probe records on the host (core/probe/probe.h): the checksum is order-free to compute but not to content: a
// flipped bit or two swapped elements change it; the sketch is linear, so column shards add up.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <limits>
#include <deque>
#include <map>
#include <optional>
#include <random>

#include "core/model/errors.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "core/probe/probe.h"
#include "core/probe/probe_hash.h"
#include "reference/reference_engine.h"
#include "tests/stage_test_util.h"

namespace mla {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& v : t.data) v = n(rng);
  return t;
}

ProbeRequest request(int64_t tokens, ProbeLevel level = ProbeLevel::ProbeLevel_sketch) {
  ProbeRequest r;
  r.tokens = tokens;
  r.level = level;
  r.probe_key = probe_key("q_nope");
  return r;
}

TEST(ProbeChecksum, EveryFlippedBitAndEverySwapChangesIt) {
  const Tensor t = random_tensor({4, 24}, 1);
  for (const char* dtype : {"fp32", "bf16"}) {
    const uint64_t base = compute_probe_record(t, dtype, request(4)).checksum;
    EXPECT_EQ(base, compute_probe_record(t, dtype, request(4)).checksum);
    const int bits = std::strcmp(dtype, "fp32") == 0 ? 32 : 16;
    for (int64_t i : {int64_t{0}, int64_t{37}, t.numel() - 1})
      for (int b = 0; b < bits; ++b) {
        Tensor u = t;
        uint32_t w;
        std::memcpy(&w, &u.data[i], 4);
        w ^= 1u << (b + 32 - bits);  // bf16 is the high half of the fp32 pattern
        std::memcpy(&u.data[i], &w, 4);
        EXPECT_NE(compute_probe_record(u, dtype, request(4)).checksum, base) << dtype << " element " << i << " bit " << b;
      }
    for (int64_t i = 0; i + 1 < t.numel(); i += 7) {
      Tensor u = t;
      std::swap(u.data[i], u.data[i + 1]);
      EXPECT_NE(compute_probe_record(u, dtype, request(4)).checksum, base) << dtype << " swap " << i;
    }
  }
}

// The record's checksum (a row walk with a running power, as the kernels do it) against the definition term by
// term, with the power taken afresh for every element: widths that are and are not multiples of 8.
TEST(ProbeChecksum, RowWalkEqualsTheDefinition) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{3, 24}, {5, 13}, {2, 200}, {1, 7}}) {
    const Tensor t = random_tensor({rows, cols}, 3);
    for (const char* dtype : {"fp32", "bf16"}) {
      uint64_t want = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float v = t.data[r * cols + c];
          uint32_t bits;
          if (std::strcmp(dtype, "bf16") == 0) bits = to_bf16_bits(v);
          else std::memcpy(&bits, &v, 4);
          want += checksum_term(static_cast<uint64_t>(r), static_cast<uint64_t>(c), bits);
        }
      EXPECT_EQ(compute_probe_record(t, dtype, request(rows)).checksum, want) << dtype << " " << rows << "x" << cols;
    }
  }
  // The multiplier's pieces: odd, the power of A, the step inside a group of 8.
  EXPECT_EQ(checksum_multiplier(2, 17), checksum_row_hash(2) * kChecksumBase * kChecksumBase + 1 * kChecksumStep);
  EXPECT_EQ(pow_mod64(kChecksumBase, 0), 1u);
  EXPECT_EQ(pow_mod64(kChecksumBase, 5), kChecksumBase * kChecksumBase * kChecksumBase * kChecksumBase * kChecksumBase);
  for (uint64_t r = 0; r < 50; ++r) EXPECT_EQ(checksum_multiplier(r, 3 * r) & 1u, 1u) << r;
}

TEST(ProbeSketch, ColumnShardsAddUpToTheWhole) {
  const Tensor t = random_tensor({5, 48}, 2);
  const ProbeRecord whole = compute_probe_record(t, "fp32", request(5));
  std::vector<double> sum(5 * kSketchDim, 0.0);
  for (int shard = 0; shard < 3; ++shard) {
    Tensor part({5, 16});
    for (int r = 0; r < 5; ++r)
      for (int c = 0; c < 16; ++c) part.data[r * 16 + c] = t.data[r * 48 + shard * 16 + c];
    ProbeRequest q = request(5);
    q.col_offset = shard * 16;
    const ProbeRecord rec = compute_probe_record(part, "fp32", q);
    for (size_t k = 0; k < sum.size(); ++k) sum[k] += rec.sketch[k];
  }
  // Each record's sketch is rounded to float once (values ~1-10 here: ulp ~1e-6); three shards add three roundings.
  for (size_t k = 0; k < sum.size(); ++k) EXPECT_NEAR(sum[k], whole.sketch[k], 1e-5) << k;
}

// The whole record against its definition, element by element in the plainest order (long double sums; the sketch
// lane by lane in column order, which the record keeps, so bit for bit): rows with a NaN and an Inf, heads,
// widths that are not multiples of 8, a size the token count does not divide; one thread and two give the same bits.
TEST(ProbeRecordHost, EqualsTheDefinitionOnAnyNumberOfThreads) {
  struct Case {
    std::vector<int64_t> shape;
    int64_t tokens, heads;
  };
  for (const Case& k : {Case{{37, 4, 13}, 37, 4}, Case{{64, 300}, 64, 0}, Case{{9, 7}, 9, 0}, Case{{23}, 5, 0},
                        Case{{6, 1000}, 6, 8}}) {
    Tensor t = random_tensor(k.shape, 11);
    const int64_t n = t.numel(), T = k.tokens, C = n / T;
    if (T > 3 && C > 2) {
      t.data[1 * C + 2] = std::numeric_limits<float>::quiet_NaN();
      t.data[3 * C + 1] = -std::numeric_limits<float>::infinity();
    }
    for (const char* dtype : {"fp32", "bf16", "fp16"}) {
      ProbeRequest req = request(T);
      req.heads = k.heads;
      req.col_offset = 5;
      const std::string at = std::string(dtype) + " n " + std::to_string(n) + " T " + std::to_string(T);
      const ProbeRecord rec = compute_probe_record(t, dtype, req);
      long double sum = 0, sumsq = 0, amax = 0;
      int64_t nan = 0, inf = 0;
      for (float v : t.data) {
        if (std::isnan(v)) ++nan;
        else if (std::isinf(v)) ++inf;
        else {
          sum += v;
          sumsq += static_cast<long double>(v) * v;
          amax = std::max(amax, static_cast<long double>(std::fabs(v)));
        }
      }
      EXPECT_EQ(rec.nan, nan) << at;
      EXPECT_EQ(rec.inf, inf) << at;
      EXPECT_EQ(rec.absmax, static_cast<double>(amax)) << at;
      // A double chain over at most 32 K values against a long double one: ~1e-13 relative at worst.
      EXPECT_NEAR(rec.l2, std::sqrt(static_cast<double>(sumsq)), 1e-12 * rec.l2) << at;
      const double mean = static_cast<double>(sum) / (n - nan - inf);
      EXPECT_NEAR(rec.mean, mean, 1e-12 * rec.l2) << at;
      const auto bits = [&](float v) -> uint64_t {
        if (std::strcmp(dtype, "bf16") == 0) return to_bf16_bits(v);
        if (std::strcmp(dtype, "fp16") == 0) return to_fp16_bits(v);
        uint32_t b;
        std::memcpy(&b, &v, 4);
        return b;
      };
      EXPECT_EQ(rec.checksum, checksum_walk(t.ptr(), n, C, [&](float v, int64_t) { return bits(v); })) << at;
      ASSERT_EQ(rec.token_l2.size(), static_cast<size_t>(T)) << at;
      for (int64_t r = 0; r < T; ++r) {
        long double s = 0;
        for (int64_t c = 0; c < C; ++c) s += static_cast<long double>(t.data[r * C + c]) * t.data[r * C + c];
        const float want = static_cast<float>(std::sqrt(s));
        // The maps are floats: one float rounding (6e-8) of a double chain, well inside 1e-6.
        if (std::isfinite(want)) EXPECT_NEAR(rec.token_l2[r], want, 1e-6 * want) << at << " row " << r;
        else EXPECT_EQ(std::isnan(rec.token_l2[r]), std::isnan(want)) << at << " row " << r;
        for (int64_t h = 0; h < k.heads; ++h) {
          long double hs = 0;
          const int64_t X = C / k.heads;
          for (int64_t c = h * X; c < (h + 1) * X; ++c) hs += static_cast<long double>(t.data[r * C + c]) * t.data[r * C + c];
          const float hw = static_cast<float>(std::sqrt(hs));
          if (std::isfinite(hw)) EXPECT_NEAR(rec.head_l2[r * k.heads + h], hw, 1e-6 * hw) << at;
          else EXPECT_FALSE(std::isfinite(rec.head_l2[r * k.heads + h])) << at;
        }
        for (int lane = 0; lane < kSketchDim; ++lane) {
          double acc = 0;
          for (int64_t c = 0; c < C; ++c)
            acc += static_cast<double>(t.data[r * C + c]) * static_cast<double>(sketch_coeff(req.probe_key, 5 + c, lane));
          const float want_sk = static_cast<float>(acc);
          EXPECT_TRUE(std::memcmp(&want_sk, &rec.sketch[r * kSketchDim + lane], 4) == 0) << at << " row " << r;
        }
      }
      const int threads = omp_get_max_threads();
      omp_set_num_threads(1);
      const ProbeRecord one = compute_probe_record(t, dtype, req);
      omp_set_num_threads(std::max(2, threads));
      const ProbeRecord two = compute_probe_record(t, dtype, req);
      omp_set_num_threads(threads);
      for (const ProbeRecord* o : {&one, &two}) {
        EXPECT_EQ(std::memcmp(&o->l2, &rec.l2, sizeof(double)), 0) << at;
        EXPECT_EQ(std::memcmp(&o->mean, &rec.mean, sizeof(double)), 0) << at;
        EXPECT_EQ(std::memcmp(&o->std, &rec.std, sizeof(double)), 0) << at;
        EXPECT_EQ(o->checksum, rec.checksum) << at;
        EXPECT_EQ(std::memcmp(o->token_l2.data(), rec.token_l2.data(), 4 * T), 0) << at;
        EXPECT_EQ(std::memcmp(o->sketch.data(), rec.sketch.data(), 4 * rec.sketch.size()), 0) << at;
      }
    }
  }
}

// An engine that queues its probes as a device engine does, and whose probes of one stage never finish
// unless the Runner waits without polling (the failure path): a stand-in for a GPU hung in that stage.
class QueuedEngine : public ReferenceEngine {
 public:
  explicit QueuedEngine(Stage stuck) : ReferenceEngine({}), stuck_(stuck) {}
  bool queues_probes() const override { return true; }
  void probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req) override {
    pending_.push_back({spec.stage, probe(rank, spec, req)});
  }
  void collect_probes(std::vector<ProbeRecord>& out, bool wait) override {
    while (!pending_.empty() && (wait || pending_.front().first != stuck_)) {
      out.push_back(std::move(pending_.front().second));
      pending_.erase(pending_.begin());
    }
  }

 private:
  Stage stuck_;
  std::vector<std::pair<Stage, ProbeRecord>> pending_;
};

// Gives up (as the watchdog does, by ending the process) once told the Runner waits for `stuck`.
class WaitWatcher : public ProbeSink {
 public:
  explicit WaitWatcher(Stage stuck) : stuck_(stuck) {}
  void stage_begin(int, Stage stage, int) override { last_begun = stage; }
  void waiting(int, Stage stage, int) override {
    waited.push_back(stage);
    if (stage == stuck_) throw std::runtime_error("watchdog");
  }
  void waiting_over() override { ++waits_over; }
  int waits_over = 0;
  void record(int, const ProbeSpec& spec, int, const ProbeRecord&) override { recorded.push_back(spec.name); }
  Stage last_begun = Stage::Stage_layer_input;
  std::vector<Stage> waited;
  std::vector<std::string> recorded;

 private:
  Stage stuck_;
};

TEST(RunnerQueuedProbes, AWaitNamesTheStageItWaitsForAndFailureKeepsEveryFinishedProbe) {
  const MlaConfig cfg = test::preset("tiny");
  RunSpec spec;
  spec.tokens = 4;
  const auto w = synthetic_weights(cfg, 1, false, 0);
  const Inputs in = synthetic_inputs(cfg, spec, w);
  Runner runner(cfg, spec);
  QueuedEngine engine(Stage::Stage_rope);
  WaitWatcher sink(Stage::Stage_rope);
  ProbePlan plan;
  EXPECT_THROW(runner.run(engine, w, in, plan, sink), std::runtime_error);
  // The host had begun the layer's last stage, but the wait names rope, whose probes did not finish.
  EXPECT_EQ(sink.last_begun, runner.graph().stages.back().stage);
  ASSERT_FALSE(sink.waited.empty());
  EXPECT_EQ(sink.waited.back(), Stage::Stage_rope);
  // Failure path: everything started reaches the sink, every probe of the graph once.
  size_t probes = 0;
  for (const auto& st : runner.graph().stages) probes += st.outputs.size();
  EXPECT_EQ(sink.recorded.size(), probes);
}

// Tiny, 4 tokens over several layers (with the input norm: a layer's input is the output of the one before).
struct TinyLayers {
  explicit TinyLayers(int layers) {
    spec.tokens = 4;
    spec.layers = layers;
    spec.input_norm = true;  // (always with layers > 1)
    w = synthetic_weights(cfg, layers, true, 0);
    in = synthetic_inputs(cfg, spec, w);
  }
  MlaConfig cfg = test::preset("tiny");
  RunSpec spec;
  std::vector<LayerWeights> w;
  Inputs in;
};

// Probes that finish only on the second poll: every end-of-layer wait is reported, and reported over before the
// next stage begins (so a planted hang after a wait is named by its own stage, not by the wait's).
class SlowQueuedEngine : public ReferenceEngine {
 public:
  SlowQueuedEngine() : ReferenceEngine({}) {}
  bool queues_probes() const override { return true; }
  void probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req) override {
    pending_.push_back(probe(rank, spec, req));
    fresh_ = true;
  }
  void collect_probes(std::vector<ProbeRecord>& out, bool wait) override {
    if (!wait && fresh_) {  // the poll right after a stage: its probes are not finished yet
      fresh_ = false;
      return;
    }
    for (auto& r : pending_) out.push_back(std::move(r));
    pending_.clear();
  }

 private:
  bool fresh_ = false;
  std::vector<ProbeRecord> pending_;
};

class EventLog : public ProbeSink {
 public:
  void stage_begin(int, Stage, int) override { events += 'b'; }
  void waiting(int, Stage, int) override { events += 'w'; }
  void waiting_over() override { events += 'o'; }
  void record(int, const ProbeSpec&, int, const ProbeRecord&) override {}
  std::string events;
};

TEST(RunnerQueuedProbes, AWaitIsReportedOverBeforeTheNextStageBegins) {
  const TinyLayers t(2);
  Runner runner(t.cfg, t.spec);
  SlowQueuedEngine engine;
  EventLog sink;
  runner.run(engine, t.w, t.in, ProbePlan{}, sink);
  ASSERT_NE(sink.events.find('w'), std::string::npos) << "events: " << sink.events;
  bool waiting = false;
  for (char e : sink.events) {
    if (e == 'w') waiting = true;
    if (e == 'o') waiting = false;
    EXPECT_FALSE(e == 'b' && waiting) << "a stage began while a wait was still reported: " << sink.events;
  }
  EXPECT_FALSE(waiting) << sink.events;
}

// An engine that holds its probes until flush_probes (as the CUDA engine does with probe_launch=layer) and whose
// device, while the flushed records are on their way, is in `busy` (device_stage): the Runner must flush before it
// waits, and its wait must name the stage the device is in, not the oldest record's.
class HeldQueuedEngine : public ReferenceEngine {
 public:
  explicit HeldQueuedEngine(Stage busy) : ReferenceEngine({}), busy_(busy) {}
  bool queues_probes() const override { return true; }
  void probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req) override {
    held_.push_back(probe(rank, spec, req));
  }
  void flush_probes() override {
    ++flushes;
    for (auto& r : held_) flushed_.push_back(std::move(r));
    held_.clear();
    polls_ = 0;
  }
  bool device_stage(int, int& layer, Stage& stage) const override {
    if (flushed_.empty()) return false;
    layer = 0;
    stage = busy_;
    return true;
  }
  void collect_probes(std::vector<ProbeRecord>& out, bool wait) override {
    if (!held_.empty() && ++unflushed_polls_ > 100000) throw std::runtime_error("the Runner never flushed");
    if (!wait && ++polls_ < 3) return;  // the device is still at work
    for (auto& r : flushed_) out.push_back(std::move(r));
    flushed_.clear();
  }
  int flushes = 0;

 private:
  Stage busy_;
  int polls_ = 0, unflushed_polls_ = 0;
  std::vector<ProbeRecord> held_, flushed_;
};

TEST(RunnerQueuedProbes, HeldProbesAreFlushedAndTheWaitNamesTheDevicesStage) {
  const TinyLayers t(2);
  Runner runner(t.cfg, t.spec);
  HeldQueuedEngine engine(Stage::Stage_attention_mha);
  WaitWatcher sink(Stage::Stage_v_up);  // (never waited for: runs to the end)
  runner.run(engine, t.w, t.in, ProbePlan{}, sink);
  EXPECT_EQ(engine.flushes, t.spec.layers);  // once per layer, before its wait
  size_t probes = 0;
  for (const auto& st : runner.graph().stages) probes += st.outputs.size();
  EXPECT_EQ(sink.recorded.size(), probes * t.spec.layers);
  ASSERT_FALSE(sink.waited.empty());
  for (Stage s : sink.waited) EXPECT_EQ(s, Stage::Stage_attention_mha) << stage_name(s);
}


// An engine whose device finishes a layer's records only once the next layer has begun or the host has stopped
// feeding it (three polls with no stage between them), as the CUDA engine's tail of held probes runs behind the next
// layer's launches; it pipelines its probes when told to. It can also fail (a device fault) at a stage of layer 1.
class LaggingQueuedEngine : public ReferenceEngine {
 public:
  explicit LaggingQueuedEngine(bool pipelines) : ReferenceEngine({}), pipelines_(pipelines) {}
  bool queues_probes() const override { return true; }
  bool pipelines_probes() const override { return pipelines_; }
  void run_stage(const StageSpec& st, int layer, int rank) override {
    if (layer == 1 && fail_at == st.stage) throw EngineError("device fault");
    if (st.stage == first_) ++layers_begun_;
    polls_ = 0;
    ReferenceEngine::run_stage(st, layer, rank);
  }
  void probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req) override {
    pending_.push_back({layers_begun_, probe(rank, spec, req)});
  }
  void collect_probes(std::vector<ProbeRecord>& out, bool wait) override {
    const bool caught_up = wait || ++polls_ >= 3;
    while (!pending_.empty() && (caught_up || pending_.front().first < layers_begun_)) {
      out.push_back(std::move(pending_.front().second));
      pending_.pop_front();
    }
  }
  Stage first_ = Stage::Stage_layer_input;  // the graph's first stage
  std::optional<Stage> fail_at;             // the stage of layer 1 that fails

 private:
  bool pipelines_;
  int layers_begun_ = 0, polls_ = 0;
  std::deque<std::pair<int, ProbeRecord>> pending_;
};

// Stage beginnings and records, in the order the sink hears of them: (layer, 'b' or 'r').
class OrderLog : public ProbeSink {
 public:
  void stage_begin(int layer, Stage, int) override { events.push_back({layer, 'b'}); }
  void record(int layer, const ProbeSpec& spec, int, const ProbeRecord&) override {
    events.push_back({layer, 'r'});
    names[layer].push_back(spec.name);
  }
  std::vector<std::pair<int, char>> events;
  std::map<int, std::vector<std::string>> names;
  // Where the first event of `kind` of `layer` is (events.size() when none).
  size_t first(int layer, char kind) const {
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i] == std::make_pair(layer, kind)) return i;
    return events.size();
  }
};

TEST(RunnerQueuedProbes, APipeliningEngineHasALayersRecordsTakenWhileTheNextRuns) {
  const TinyLayers t(3);
  Runner runner(t.cfg, t.spec);
  std::vector<std::string> graph_probes;
  for (const auto& st : runner.graph().stages)
    graph_probes.insert(graph_probes.end(), st.outputs.begin(), st.outputs.end());
  for (bool pipelines : {false, true}) {
    SCOPED_TRACE(pipelines ? "pipelining" : "not pipelining");
    LaggingQueuedEngine engine(pipelines);
    engine.first_ = runner.graph().stages.front().stage;
    OrderLog sink;
    runner.run(engine, t.w, t.in, ProbePlan{}, sink);
    // Every record of every layer, in graph order, whichever way.
    for (int l = 0; l < t.spec.layers; ++l) EXPECT_EQ(sink.names[l], graph_probes) << "layer " << l;
    // Layer 0's records: before layer 1 begins when the Runner waits for them at the layer's end; after it when it
    // leaves them to be built while layer 1 runs. Layer 1's before layer 2's: a layer's records are awaited by the
    // next layer's end at the latest.
    for (int l = 0; l + 1 < t.spec.layers; ++l) {
      const size_t records = sink.first(l, 'r'), next = sink.first(l + 1, 'b');
      ASSERT_LT(records, sink.events.size()) << l;
      ASSERT_LT(next, sink.events.size()) << l;
      if (pipelines) EXPECT_GT(records, next) << "layer " << l;
      else EXPECT_LT(records, next) << "layer " << l;
      if (l + 2 < t.spec.layers) EXPECT_LT(records, sink.first(l + 2, 'b')) << "layer " << l;
    }
  }
}

TEST(RunnerQueuedProbes, AFaultInTheNextLayerKeepsThePipelinedLayersRecords) {
  const TinyLayers t(2);
  Runner runner(t.cfg, t.spec);
  LaggingQueuedEngine engine(true);
  engine.first_ = runner.graph().stages.front().stage;
  engine.fail_at = engine.first_;  // before layer 1 begins on the device: layer 0's records are not done
  OrderLog sink;
  EXPECT_THROW(runner.run(engine, t.w, t.in, ProbePlan{}, sink), EngineError);
  size_t probes = 0;
  for (const auto& st : runner.graph().stages) probes += st.outputs.size();
  EXPECT_EQ(sink.names[0].size(), probes);
}

}  // namespace
}  // namespace mla
