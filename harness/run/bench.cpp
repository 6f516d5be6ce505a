// The benchmark: per-stage and per-layer times of one engine, FLOPs, and the GEMM ceiling of the same run.
// Engines that run on a device (Engine::timing) take another path, run_device_bench: the weights
// are placed once, stages are timed with device events, and the ceilings (a large GEMM and a device copy)
// are measured on that device in the same run.
// The FLOPs and bytes a stage is counted with are in bench_flops.cpp.
#include "harness/run/bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>
#include <tuple>

#include <Eigen/Core>

#include "core/engine/engine.h"
#include "core/engine/engine_timing.h"
#include "core/model/errors.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "reference/cpu_threads.h"

namespace mla {

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Forwards to an engine and times it: each run_stage (synchronized, so asynchronous engines are timed whole),
// each probe, and the moment prepare returned. Times are summed over layers and ranks.
class TimedEngine : public Engine {
 public:
  explicit TimedEngine(Engine& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  std::string options() const override { return inner_.options(); }
  std::string dtype() const override { return inner_.dtype(); }
  std::string device() const override { return inner_.device(); }

  void prepare(const RunContext& ctx) override {
    inner_.prepare(ctx);
    inner_.synchronize();
    stage_s.clear();
    probe_s.clear();
    prepared = Clock::now();
  }
  void run_stage(const StageSpec& stage, int layer, int rank) override {
    const auto t0 = Clock::now();
    inner_.run_stage(stage, layer, rank);
    inner_.synchronize();
    stage_s[stage.stage] += seconds_since(t0);
  }
  Tensor download(int rank, const std::string& name) override { return inner_.download(rank, name); }
  void upload(int rank, const std::string& name, const Tensor& t) override { inner_.upload(rank, name, t); }
  ProbeRecord probe(int rank, const ProbeSpec& spec, const ProbeRequest& req) override {
    const auto t0 = Clock::now();
    ProbeRecord r = inner_.probe(rank, spec, req);
    inner_.synchronize();
    probe_s[spec.stage] += seconds_since(t0);
    return r;
  }
  void synchronize() override { inner_.synchronize(); }

  std::map<Stage, double> stage_s, probe_s;
  Clock::time_point prepared;

 private:
  Engine& inner_;
};

class NullSink : public ProbeSink {
 public:
  void record(int, const ProbeSpec&, int, const ProbeRecord&) override {}
};

struct LayerRun {
  std::map<Stage, double> stage_s, probe_s;  // per layer
  double layer_s = 0;                        // per layer: wall time after prepare, probes included
};

struct Projection {
  Stage stage;
  int64_t in = 0, out = 0;  // this rank's weight [out, in]
};

// The single-GEMM projections of this run, with one rank's shapes.
std::vector<Projection> projections(const MlaConfig& c, const RunSpec& spec, const StageGraph& g) {
  const int64_t Nl = c.heads / spec.tp, H = c.hidden, L = c.kv_lora_rank, R = c.qk_rope;
  const std::vector<Projection> all = {
      {Stage::Stage_q_a_proj, H, c.q_lora_rank},
      {Stage::Stage_q_b_proj, c.q_lora_rank, Nl * c.qk_head()},
      {Stage::Stage_q_proj, H, Nl * c.qk_head()},
      {Stage::Stage_kv_a_proj, H, L + R},
      {Stage::Stage_kv_b_proj, L, Nl * (c.qk_nope + c.v_head)},
      {Stage::Stage_o_proj, Nl * c.v_head, H},
  };
  std::vector<Projection> present;
  for (const auto& p : all)
    if (g.find_stage(p.stage)) present.push_back(p);
  return present;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown";
}


// The bench's inputs. synthetic_inputs fills the context cache through the reference's kv path on the CPU:
// minutes at B = 64, L = 4096 with DeepSeek-V3 dims. Device timing does not depend on the values, so large
// contexts get random N(0,1) rows instead (bf16-exact, never zeros: the tensor cores run faster on zeros, which would flatter the timing).
Inputs bench_inputs(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                    bool* random_cache) {
  Batch batch = make_batch(spec);
  int64_t ctx = 0;
  for (int c : batch.context_lens) ctx += c;
  *random_cache = ctx * cfg.hidden > (int64_t{1} << 27);
  if (!*random_cache) return synthetic_inputs(cfg, spec, weights);
  Inputs in;
  in.x = synthetic_hidden(batch.tokens(), cfg.hidden, spec.seed, 1000);
  for (int l = 0; l < spec.layers; ++l) {
    Tensor cache({batch.num_blocks, kPageSize, cfg.cache_row()});
    fill_normal(cache.ptr(), cache.numel(), spec.seed, 3000 + l, 1.0f);
    round_in_place(cache, Precision::Precision_bf16);
    in.kv_cache.push_back(std::move(cache));
    if (cfg.has_dsa()) {
      Tensor index({batch.num_blocks, kPageSize, cfg.index_head_dim});
      fill_normal(index.ptr(), index.numel(), spec.seed, 4000 + l, 1.0f);
      round_in_place(index, Precision::Precision_bf16);
      in.index_cache.push_back(std::move(index));
    }
  }
  in.batch = std::move(batch);
  return in;
}

// The layer's fewest bytes (2·N_w + 29,824·T for DeepSeek-V3 prefill at tp 1): every rank's weights
// once, x in and h_out out, the cache rows written, and the context rows read.
double layer_min_bytes(const MlaConfig& c, const RunSpec& spec, const Batch& batch) {
  const double tp = spec.tp, Nl = c.heads / spec.tp, H = c.hidden, Lq = c.q_lora_rank, L = c.kv_lora_rank;
  const double R = c.qk_rope, P = c.qk_nope, V = c.v_head, D = c.qk_head(), W = L + R, T = batch.tokens();
  double ctx = 0;
  for (int x : batch.context_lens) ctx += x;
  const double q_w = Lq > 0 ? Lq * H + Lq + Nl * D * Lq : Nl * D * H;
  const double w = q_w + W * H + L + Nl * (P + V) * L + H * Nl * V + (spec.graph_shape().input_norm ? H : 0);
  return 2 * (tp * w + 2 * T * H + T * W + ctx * W);
}

// What was run and where: the header of both paths' results.
BenchResult describe_run(const BenchOptions& o, const Engine& engine) {
  const RunSpec& spec = o.spec;
  BenchResult r;
  r.model = o.cfg.name;
  r.engine = engine.name() + ":" + engine.options();
  r.mode = mode_name(spec.mode);
  r.form = form_name(spec.form);
  r.tokens = spec.tokens;
  r.batch = spec.batch;
  r.context = spec.context;
  r.tp = spec.tp;
  r.layers = spec.layers;
  r.repeats = o.repeats;
  r.warmup = o.warmup;
  r.logical_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  r.physical_cores = ref::physical_cores();
  r.cpu_model = cpu_model_name();
  return r;
}

// The device path: prepare once, warm up, time every stage with device events, then the probe overhead.
BenchResult run_device_bench(const BenchOptions& o, Engine& engine, EngineTiming& timing, const Runner& runner) {
  const MlaConfig& cfg = o.cfg;
  const RunSpec& spec = o.spec;
  const StageGraph& graph = runner.graph();
  BenchResult r = describe_run(o, engine);
  r.device = true;
  r.device_name = engine.device();

  const auto weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, o.weight_seed);
  const Inputs inputs = bench_inputs(cfg, spec, weights, &r.random_cache);
  const RunContext ctx{&cfg, &spec, &graph, &weights, &inputs};
  engine.prepare(ctx);
  engine.synchronize();
  for (auto& c : timing.measure_ceilings(std::max(o.repeats, 20)))
    r.ceilings.push_back({c.what, c.flops, c.bytes, Timing::of(c.samples_s)});

  // As the Runner walks: a stage's probes are started after it, finished records taken after each stage,
  // the rest at the end of each layer.
  std::vector<ProbeRecord> recs;
  // The last walk's host seconds per layer: in the stages' calls, in the probe calls (of which starting the
  // probes), in the end-of-layer waits, building records (Engine::probe_build_seconds); and the last layer's last
  // record's build.
  struct WalkHost {
    double stage_calls = 0, probe_calls = 0, probe_starts = 0, end_wait = 0, builds = 0, last_build = 0;
  } host;
  // Starts the probes of a stage's outputs on every rank; returns how many.
  const auto start_probes = [&](const StageSpec& st, const ProbePlan& plan) {
    size_t n = 0;
    for (int rank = 0; rank < spec.tp; ++rank)
      for (const auto& name : st.outputs) {
        const ProbeSpec& p = *graph.find(name);
        engine.probe_async(rank, p, make_probe_request(p, spec.tp, rank, plan.level_for(name)));
        ++n;
      }
    return n;
  };
  const auto walk = [&](const ProbePlan* plan) {
    host = WalkHost{};
    const double built0 = timing.probe_build_seconds().total;
    for (int layer = 0; layer < spec.layers; ++layer) {
      for (const auto& st : graph.stages) {
        const auto ts = Clock::now();
        for (int rank = 0; rank < spec.tp; ++rank) engine.run_stage(st, layer, rank);
        host.stage_calls += seconds_since(ts);
        if (!plan) continue;
        const auto t0 = Clock::now();
        start_probes(st, *plan);
        host.probe_starts += seconds_since(t0);
        engine.collect_probes(recs, false);
        host.probe_calls += seconds_since(t0);
      }
      if (plan) {
        const auto t0 = Clock::now();
        engine.collect_probes(recs, true);
        host.end_wait += seconds_since(t0);
      }
      recs.clear();
    }
    const auto built = timing.probe_build_seconds();
    host.builds = built.total - built0;
    for (double* s : {&host.stage_calls, &host.probe_calls, &host.probe_starts, &host.end_wait, &host.builds})
      *s /= spec.layers;
    host.last_build = built.last;
  };
  const auto wall = [&](const ProbePlan* plan) {
    engine.synchronize();
    const auto t0 = Clock::now();
    walk(plan);
    engine.synchronize();
    return seconds_since(t0) / spec.layers;
  };
  // A run of `n` layers back to back (the bench's layers again and again, as a deeper model's or decode steps'),
  // synchronized at both ends, per layer. Its records are taken as the Runner takes them: after each stage those
  // done, at each layer's end those of the layer before (a pipelining engine) or its own, at the end the rest.
  const bool pipelined = engine.queues_probes() && engine.pipelines_probes();
  const auto run_wall = [&](const ProbePlan* plan, int n) {
    engine.synchronize();
    const auto t0 = Clock::now();
    size_t started = 0, taken = 0;
    const auto take = [&](bool wait) {
      engine.collect_probes(recs, wait);
      taken += recs.size();
      recs.clear();
    };
    for (int i = 0; i < n; ++i) {
      const int layer = i % spec.layers;
      const size_t before = started;  // the records of the layers before this one
      for (const auto& st : graph.stages) {
        for (int rank = 0; rank < spec.tp; ++rank) engine.run_stage(st, layer, rank);
        if (!plan) continue;
        started += start_probes(st, *plan);
        take(false);
      }
      if (!plan) continue;
      if (!pipelined || i + 1 == n) {
        take(true);
        continue;
      }
      engine.flush_probes();
      while (taken < before) {
        take(false);
        if (taken < before) std::this_thread::yield();
      }
    }
    engine.synchronize();
    if (taken != started)
      throw EngineError("bench: a run of " + std::to_string(n) + " layers took " + std::to_string(taken) + " of the " +
                        std::to_string(started) + " probe records it started");
    return seconds_since(t0) / n;
  };
  for (int i = 0; i < std::max(o.warmup, 1); ++i) walk(nullptr);
  engine.synchronize();

  // A stage's time spans all its ranks (ranks sharing a GPU run concurrently on their own streams):
  // first rank's start to last rank's end, summed over layers; the layer: its first start to its last end.
  // Ranks on several GPUs: each device's clock is its own, so the span is taken per device and the stage's
  // time is the slowest device's.
  std::map<Stage, std::vector<double>> stage_s, bare_gap_s;
  std::vector<double> span_s;
  std::map<Stage, Stage> next_stage;  // in graph order
  for (size_t i = 0; i + 1 < graph.stages.size(); ++i) next_stage[graph.stages[i].stage] = graph.stages[i + 1].stage;
  // The last walk's device times (timing on): per stage, and from each stage's end to the next one's start (`gap`,
  // in graph order: the probes' kernels run there; the slowest device's), both per layer; returns the layer's span.
  const auto take_spans = [&](std::map<Stage, double>& per, std::map<Stage, double>& gap) {
    std::map<std::tuple<int, Stage, int>, std::pair<double, double>> st_span;  // (layer, stage, device)
    std::map<std::pair<int, int>, std::pair<double, double>> layer_span;      // (layer, device)
    const auto widen = [](auto& m, const auto& key, double s, double e) {
      auto it = m.find(key);
      if (it == m.end()) m.emplace(key, std::make_pair(s, e));
      else it->second = {std::min(it->second.first, s), std::max(it->second.second, e)};
    };
    for (const auto& t : timing.take_stage_timings()) {
      widen(st_span, std::make_tuple(t.layer, t.stage, t.device), t.start_s, t.end_s);
      widen(layer_span, std::make_pair(t.layer, t.device), t.start_s, t.end_s);
    }
    std::map<std::pair<int, Stage>, double> slowest;  // (layer, stage) -> the slowest device's span
    for (const auto& [key, se] : st_span) {
      double& v = slowest[{std::get<0>(key), std::get<1>(key)}];
      v = std::max(v, se.second - se.first);
    }
    for (const auto& [key, v] : slowest) per[key.second] += v / spec.layers;
    std::map<std::pair<int, Stage>, double> gap_slowest;  // (layer, stage) -> the slowest device's gap after it
    for (const auto& [key, se] : st_span) {
      const auto [layer, stage, device] = key;
      const auto after = next_stage.find(stage);
      if (after == next_stage.end()) continue;  // the last stage
      const auto next = st_span.find(std::make_tuple(layer, after->second, device));
      if (next == st_span.end()) continue;
      double& v = gap_slowest[{layer, stage}];
      v = std::max(v, next->second.first - se.second);
    }
    for (const auto& [key, v] : gap_slowest) gap[key.second] += v / spec.layers;
    std::map<int, double> layer_slowest;
    for (const auto& [key, se] : layer_span) layer_slowest[key.first] = std::max(layer_slowest[key.first], se.second - se.first);
    double span = 0;
    for (const auto& [l, v] : layer_slowest) span += v;
    return span / spec.layers;
  };
  timing.set_device_timing(true);
  for (int i = 0; i < o.repeats; ++i) {
    walk(nullptr);
    std::map<Stage, double> per, gap;
    span_s.push_back(take_spans(per, gap));
    for (const auto& st : graph.stages) {
      stage_s[st.stage].push_back(per[st.stage]);
      bare_gap_s[st.stage].push_back(gap[st.stage]);
    }
  }
  timing.set_device_timing(false);

  // Probe overhead: host wall clock of the layer (synchronized) without probes and at each level, alternating.
  std::vector<ProbePlan> levels;
  for (ProbeLevel l : o.probe_levels) {
    if (o.probe_repeats == 0) break;
    ProbePlan p;
    p.level = l;
    p.full = o.full_probes;
    levels.push_back(p);
  }
  for (const auto& plan : levels) {  // warm-up: probe scratch buffers, and a run's second set of them
    walk(&plan);
    run_wall(&plan, 2);
  }
  std::vector<double> bare_s, bare_run_s;
  std::vector<std::vector<double>> level_s(levels.size()), level_run_s(levels.size());
  std::vector<WalkHost> bare_host;
  std::vector<std::vector<WalkHost>> level_host(levels.size());
  const int probe_rounds = std::max(1, std::min(o.repeats, o.probe_repeats));
  const int run_layers = std::max(1, o.run_layers);
  for (int i = 0; i < (levels.empty() ? std::min(o.repeats, 5) : probe_rounds); ++i) {
    bare_s.push_back(wall(nullptr));
    bare_host.push_back(host);
    for (size_t k = 0; k < levels.size(); ++k) {
      level_s[k].push_back(wall(&levels[k]));
      level_host[k].push_back(host);
    }
    if (levels.empty()) continue;
    bare_run_s.push_back(run_wall(nullptr, run_layers));
    for (size_t k = 0; k < levels.size(); ++k) level_run_s[k].push_back(run_wall(&levels[k], run_layers));
  }
  // The device's side of it: the layer's span (first stage start to last stage end, the probes' kernels between
  // the stages included) with probes at each level, from walks of their own (stage events on).
  std::vector<std::vector<double>> dev_s(levels.size());
  std::vector<std::map<Stage, std::vector<double>>> gap_s(levels.size());
  timing.set_device_timing(true);
  for (int i = 0; i < probe_rounds; ++i)
    for (size_t k = 0; k < levels.size(); ++k) {
      engine.synchronize();
      walk(&levels[k]);
      engine.synchronize();
      std::map<Stage, double> per, gap;
      dev_s[k].push_back(take_spans(per, gap));
      for (const auto& st : graph.stages) gap_s[k][st.stage].push_back(gap[st.stage]);
    }
  timing.set_device_timing(false);

  for (const auto& st : graph.stages) {
    StageBench sb;
    sb.name = stage_name(st.stage);
    sb.flops = stage_flops(st.stage, cfg, spec, inputs.batch);
    sb.bytes = stage_bytes(st.stage, cfg, spec, inputs.batch);
    sb.time = Timing::of(stage_s[st.stage]);
    r.layer_flops += sb.flops;
    r.stages.push_back(std::move(sb));
  }
  r.layer_bytes = layer_min_bytes(cfg, spec, inputs.batch);
  r.all_reduce_elems = static_cast<double>(inputs.batch.tokens()) * cfg.hidden;
  r.layer_time = Timing::of(span_s);
  r.layer_wall = Timing::of(bare_s);
  // One figure of the walks' host times, over the rounds.
  const auto over_rounds = [](const std::vector<WalkHost>& rounds, double WalkHost::*figure) {
    std::vector<double> v;
    for (const WalkHost& h : rounds) v.push_back(h.*figure);
    return Timing::of(v);
  };
  for (size_t k = 0; k < levels.size(); ++k) {
    const auto& h = level_host[k];
    r.probes.push_back({probe_level_name(levels[k].level), Timing::of(level_s[k]),
                        over_rounds(h, &WalkHost::probe_calls), over_rounds(h, &WalkHost::end_wait),
                        Timing::of(dev_s[k]), over_rounds(h, &WalkHost::probe_starts),
                        over_rounds(h, &WalkHost::stage_calls), over_rounds(h, &WalkHost::builds),
                        over_rounds(h, &WalkHost::last_build)});
    r.probes.back().run_time = Timing::of(level_run_s[k]);
    // Each round's gap after a stage less the bare layer's median gap there.
    for (size_t i = 0; i + 1 < graph.stages.size(); ++i) {
      const StageSpec& st = graph.stages[i];
      const double bare = Timing::of(bare_gap_s[st.stage]).median;
      std::vector<double> extra;
      for (double g : gap_s[k][st.stage]) extra.push_back(g - bare);
      r.probes.back().after_stage.push_back({stage_name(st.stage), st.outputs, Timing::of(extra)});
    }
    if (!graph.stages.empty())
      r.probes.back().after_span = {stage_name(graph.stages.back().stage), graph.stages.back().outputs, Timing{}};
    r.probes.back().held = timing.holds_probes_of(inputs.batch.tokens());
  }
  r.bare_stage_calls = over_rounds(bare_host, &WalkHost::stage_calls);
  if (!levels.empty()) r.run_wall = Timing::of(bare_run_s);
  r.run_layers = run_layers;
  r.pipelined = pipelined;
  return r;
}

}  // namespace

double BenchResult::roofline_s(double flops, double bytes) const {
  const double a = gemm_rate() > 0 ? flops / gemm_rate() : 0, b = copy_rate() > 0 ? bytes / copy_rate() : 0;
  return std::max(a, b);
}

Timing Timing::of(std::vector<double> samples) {
  Timing t;
  t.samples = samples;
  if (samples.empty()) return t;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  t.median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  t.min = samples.front();
  t.max = samples.back();
  return t;
}

BenchResult run_bench(const BenchOptions& o) {
  auto engine = make_engine(EngineSpec::parse(o.engine));  // the reference sets Eigen's threads here
  return run_bench(o, *engine);
}

BenchResult run_bench(const BenchOptions& o, Engine& engine) {
  const MlaConfig& cfg = o.cfg;
  const RunSpec& spec = o.spec;
  if (o.repeats < 1) throw UsageError("--repeats must be at least 1");
  if (o.warmup < 0) throw UsageError("--warmup must not be negative");
  Runner runner(cfg, spec);
  const auto progress = [&](const std::string& what) {
    if (o.progress) o.progress(what);
  };
  const auto ms = [](double sec) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f ms", 1e3 * sec);
    return std::string(buf);
  };
  progress("bench: " + engine.name() + " on " + cfg.name + ", setup (weights, inputs)");
  if (EngineTiming* timing = engine.timing()) {
    timing->set_device_timing(false);
    return run_device_bench(o, engine, *timing, runner);
  }
  TimedEngine timed(engine);
  const auto weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, o.weight_seed);
  const Inputs inputs = synthetic_inputs(cfg, spec, weights);
  const StageGraph& graph = runner.graph();

  BenchResult r = describe_run(o, engine);
  r.eigen_threads = Eigen::nbThreads();
  r.simd = Eigen::SimdInstructionSetsInUse();

  // The ceiling: Y = X·Wᵀ at the size of the largest projection this run does (one rank's shapes), in Eigen,
  // exactly as ref::linear computes it, on seeded non-zero data.
  const auto projs = projections(cfg, spec, graph);
  if (projs.empty()) throw UsageError("bench: the stage graph has no projection to size the GEMM ceiling");
  const Projection big = *std::max_element(projs.begin(), projs.end(), [](const Projection& a, const Projection& b) {
    return a.in * a.out < b.in * b.out;
  });
  r.gemm.what = stage_name(big.stage);
  r.gemm.m = inputs.batch.tokens();
  r.gemm.n = big.out;
  r.gemm.k = big.in;
  r.gemm.flops = 2.0 * r.gemm.m * r.gemm.n * r.gemm.k;
  RowMatrix X(r.gemm.m, r.gemm.k), W(r.gemm.n, r.gemm.k), Y(r.gemm.m, r.gemm.n);
  fill_normal(X.data(), X.size(), o.weight_seed, 901, 1.0f);
  fill_normal(W.data(), W.size(), o.weight_seed, 902, 1.0f / std::sqrt(static_cast<float>(r.gemm.k)));
  const auto gemm_once = [&] {
    const auto t0 = Clock::now();
    Y.noalias() = X * W.transpose();
    return seconds_since(t0);
  };

  NullSink sink;
  const auto layer_once = [&](const ProbePlan& plan) {
    runner.run(timed, weights, inputs, plan, sink);
    LayerRun run;
    run.layer_s = seconds_since(timed.prepared) / spec.layers;
    for (auto& [s, v] : timed.stage_s) run.stage_s[s] = v / spec.layers;
    for (auto& [s, v] : timed.probe_s) run.probe_s[s] = v / spec.layers;
    return run;
  };
  ProbePlan off;
  off.off = true;
  std::vector<ProbePlan> levels;
  for (ProbeLevel l : o.probe_levels) {
    ProbePlan p;
    p.level = l;
    p.full = o.full_probes;
    levels.push_back(p);
  }

  // Rounds interleave the GEMM, the layer without probes and the layer at each level, so that noise from
  // other work on the machine lands on all of them alike.
  std::vector<double> gemm_s, layer_s;
  std::map<Stage, std::vector<double>> stage_s, probe_s;
  std::vector<std::vector<double>> level_s(levels.size());
  for (int round = 0; round < o.warmup + o.repeats; ++round) {
    const bool timed_round = round >= o.warmup;
    const double g = gemm_once();
    const LayerRun bare = layer_once(off);
    std::vector<LayerRun> probed;
    for (const auto& plan : levels) probed.push_back(layer_once(plan));
    progress("round " + std::to_string(round + 1) + "/" + std::to_string(o.warmup + o.repeats) +
             (timed_round ? "" : " (warm-up)") + ": GEMM " + ms(g) + ", layer " + ms(bare.layer_s));
    if (!timed_round) continue;
    gemm_s.push_back(g);
    layer_s.push_back(bare.layer_s);
    for (const auto& st : graph.stages) {
      stage_s[st.stage].push_back(bare.stage_s.count(st.stage) ? bare.stage_s.at(st.stage) : 0.0);
      const double p = probed.empty() || !probed.back().probe_s.count(st.stage) ? 0.0 : probed.back().probe_s.at(st.stage);
      probe_s[st.stage].push_back(p);
    }
    for (size_t i = 0; i < levels.size(); ++i) level_s[i].push_back(probed[i].layer_s);
  }

  for (const auto& st : graph.stages) {
    StageBench s;
    s.name = stage_name(st.stage);
    s.flops = stage_flops(st.stage, cfg, spec, inputs.batch);
    s.time = Timing::of(stage_s[st.stage]);
    s.probe_time = Timing::of(probe_s[st.stage]);
    r.layer_flops += s.flops;
    r.stages.push_back(std::move(s));
  }
  r.layer_time = Timing::of(layer_s);
  r.gemm.time = Timing::of(gemm_s);
  for (size_t i = 0; i < levels.size(); ++i) r.probes.push_back({probe_level_name(levels[i].level), Timing::of(level_s[i])});
  return r;
}

}  // namespace mla
