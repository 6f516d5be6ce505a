// `mla-bisect bench`: times every stage of one layer and the whole layer (probes off, then at each probe
// level), counts FLOPs with the formulas of stage_flops below, and measures in the same run the ceiling the figures are
// read against (for the reference: an Eigen GEMM of the largest projection's size).
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/probe/probe.h"

namespace mla {

struct BenchOptions {
  std::string engine = "reference";
  MlaConfig cfg;
  RunSpec spec;
  uint64_t weight_seed = 0;
  int repeats = 5;  // timed rounds; each round runs the GEMM, the layer with probes off, then each level
  int warmup = 1;   // untimed rounds before them
  std::vector<ProbeLevel> probe_levels = {ProbeLevel::ProbeLevel_stats, ProbeLevel::ProbeLevel_sketch};
  std::set<std::string> full_probes;  // captured in full in the probe-level runs
  // Device engines (--engine cuda) only: rounds of the probe-overhead comparison (each level against the
  // layer without probes; at T = 4096 a round spends seconds hashing checksums on the host); 0 skips it.
  int probe_repeats = 5;
  // Device engines: the probe overhead is also taken over runs of this many layers back to back (the layers of
  // `spec` again and again), each layer's records collected as the Runner collects them: a pipelining engine's
  // while the next layer runs (Engine::pipelines_probes).
  int run_layers = 8;
  std::function<void(const std::string&)> progress;  // a line per phase and round (the command's progress log)
};

// Median, min and max of a list of times (seconds).
struct Timing {
  std::vector<double> samples;
  double median = 0, min = 0, max = 0;
  static Timing of(std::vector<double> samples);
};

struct StageBench {
  std::string name;
  double flops = 0;  // per layer, summed over ranks; 0: not counted (elementwise and copy stages)
  Timing time;       // per layer, summed over ranks, probes off
  Timing probe_time; // per layer: time spent computing this stage's probes at the highest level measured
  double bytes = 0;  // device engines: the fewest bytes the stage moves (each input and weight read once,
                     // each output written once; bf16, lse fp32), summed over ranks
};

// A ceiling measured on the device in the same run (EngineTiming::measure_ceilings).
struct CeilingBench {
  std::string what;
  double flops = 0, bytes = 0;
  Timing time;
  double flops_per_s() const { return time.median > 0 ? flops / time.median : 0; }
  double bytes_per_s() const { return time.median > 0 ? bytes / time.median : 0; }
};

struct GemmCeiling {
  std::string what;  // which projection's size
  int64_t m = 0, n = 0, k = 0;  // Y[m, n] = X[m, k] · W[n, k]ᵀ
  double flops = 0;
  Timing time;
};

struct ProbeOverhead {
  std::string level;
  Timing layer_time;  // per layer: one layer alone, synchronized, its records awaited at its end
  // Device engines: of that, host time per layer in the probe calls made beside the stages (probe_async and the
  // collect after each stage), and the wait for the rest at the end of the layer (device work not yet done).
  Timing host_calls, end_wait;
  // Device engines: the layer's span on the device with these probes (first stage start to last stage end).
  Timing device_span;
  // Of host_calls, the probe_async calls alone (the rest is collect_probes after each stage); and host time per
  // layer in the stages' own calls (run_stage) during these walks.
  Timing host_starts, stage_calls;
  // Device engines: host time per layer building the records from the device's results
  // (EngineTiming::probe_build_seconds), and of the layer's last record (built after the device is done: part of the wall).
  Timing builds, last_build;
  // Device engines: per stage but the last, the device time from its end to the next stage's start beyond the bare
  // layer's (the kernels of the stage's probes, on the rank's stream between the stages), in graph order; the last
  // stage's probes run after the layer's span (part of what the wall pays after the device), named apart.
  struct AfterStage {
    std::string stage;
    std::vector<std::string> probes;  // the stage's outputs
    Timing extra;                     // per layer
  };
  std::vector<AfterStage> after_stage;
  AfterStage after_span;  // the last stage and its probes (no time)
  // Device engines: the probes were held and launched together after the last stage (and before the attention with
  // probe_launch=attention; EngineTiming::holds_probes_of): no gaps between the other stages, their cost on the
  // wall's tail.
  bool held = false;
  // Device engines: per layer of a run of BenchResult::run_layers layers back to back (BenchOptions::run_layers).
  Timing run_time;
};

struct BenchResult {
  std::string model, engine, mode, form;
  int tokens = 0, batch = 0, tp = 1, layers = 1, repeats = 0, warmup = 0;
  std::vector<int> context;
  // The machine, as the run saw it.
  int logical_cpus = 0, physical_cores = 0, eigen_threads = 0;
  std::string cpu_model, simd;
  std::vector<StageBench> stages;  // in graph order
  double layer_flops = 0;          // sum of the stages' FLOPs
  Timing layer_time;               // per layer, probes off (wall time of the run after prepare)
  double all_reduce_elems = 0;     // device engines: elements each rank all-reduces per layer (T · hidden)
  GemmCeiling gemm;
  std::vector<ProbeOverhead> probes;

  // Device engines: stage and layer times from device events (the layer: first stage's start to last stage's
  // end), the ceilings of the same run, and the layer's fewest bytes (weights, x in, h_out out, cache rows
  // written and read). Fraction of the roofline = max(FLOPs / GEMM rate, bytes / copy rate) / time.
  bool device = false;
  std::string device_name;
  bool random_cache = false;  // the context cache was filled with random rows, not the reference's prefill
  std::vector<CeilingBench> ceilings;  // [0] the GEMM, [1] the copy
  double layer_bytes = 0;
  Timing layer_wall;  // host wall clock per layer, synchronized, probes off
  // Host wall clock per layer of a run of run_layers layers back to back, probes off (measured with the probe
  // overhead); whether the engine collected a layer's records during the next (Engine::pipelines_probes).
  Timing run_wall;
  int run_layers = 0;
  bool pipelined = false;
  Timing bare_stage_calls;  // device engines: host time per layer in the stages' calls (run_stage), probes off
  double gemm_rate() const { return ceilings.size() > 0 ? ceilings[0].flops_per_s() : 0; }
  double copy_rate() const { return ceilings.size() > 1 ? ceilings[1].bytes_per_s() : 0; }
  double roofline_s(double flops, double bytes) const;  // max of the two floors at the measured ceilings

  double layer_gflops() const { return layer_time.median > 0 ? layer_flops / layer_time.median * 1e-9 : 0; }
  double gemm_gflops() const { return gemm.time.median > 0 ? gemm.flops / gemm.time.median * 1e-9 : 0; }
  double fraction_of_gemm() const { return gemm_gflops() > 0 ? layer_gflops() / gemm_gflops() : 0; }
};

// FLOPs of one stage of one layer over all ranks: projections 2·rows·in·out (replicated ones once
// per rank, as the ranks all compute them); attention_mha 2·N·(D+V)·(n(n+1)/2 + n·ctx) per sequence plus the
// context's up-projection 2·ctx·L·N·(P+V); attention_mqa 2·N·(2L+R)·(n(n+1)/2 + n·ctx); q_absorb 2·T·N·P·L;
// v_up 2·T·N·L·V. Elementwise and copy stages count 0.
double stage_flops(Stage stage, const MlaConfig& cfg, const RunSpec& spec, const Batch& batch);
// Fewest bytes one stage of one layer moves over all ranks (see StageBench::bytes); attention_mqa by FlashMLA's
// formula: (ΣL·(L+R) + T·N·(L+R) + T·N·L)·2, plus the lse.
double stage_bytes(Stage stage, const MlaConfig& cfg, const RunSpec& spec, const Batch& batch);

BenchResult run_bench(const BenchOptions& options);  // throws UsageError
// The same with an engine made by the caller (options.engine is then only recorded).
BenchResult run_bench(const BenchOptions& options, Engine& engine);

}  // namespace mla
