// Rendering of a benchmark's result (harness/run/bench.h): the terminal tables and the JSON document.
#include "harness/report/bench_report.h"

#include <cstdio>
#include <ostream>
#include <string>

#include "harness/compare/compare.h"

namespace mla {

namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

nlohmann::json timing_json(const Timing& t) {
  return {{"median_s", t.median}, {"min_s", t.min}, {"max_s", t.max}, {"samples_s", t.samples}};
}

void print_device_bench(const BenchResult& r, std::ostream& os) {
  std::string ctx;
  for (int c : r.context) ctx += (ctx.empty() ? "" : ",") + std::to_string(c);
  os << "bench  model " << r.model << "  engine " << r.engine << "  mode " << r.mode << "  attention " << r.form
     << "  tokens " << r.tokens << "  batch " << r.batch << (ctx.empty() ? "" : "  context " + ctx) << "  tp " << r.tp
     << "  layers " << r.layers << "\n"
     << "device  " << r.device_name << "; host " << r.cpu_model << ", " << r.logical_cpus << " logical CPUs"
     << (r.random_cache ? "; context cache: random rows (timing only)" : "") << "\n";
  for (const auto& c : r.ceilings)
    os << "ceiling  " << c.what << ": " << fmt("%.3f", c.time.median * 1e3) << " ms (" << fmt("%.3f", c.time.min * 1e3)
       << ".." << fmt("%.3f", c.time.max * 1e3) << ")"
       << (c.flops > 0 ? " = " + fmt("%.1f", c.flops_per_s() * 1e-12) + " TFLOP/s" : "")
       << (c.flops == 0 && c.bytes > 0 ? " = " + fmt("%.1f", c.bytes_per_s() * 1e-9) + " GB/s" : "") << "\n";
  os << "times: device events, median of " << r.repeats << " rounds after " << std::max(r.warmup, 1)
     << " warm-up (min..max); per layer; a stage spans all its ranks; roofline = max(FLOP / GEMM rate, "
        "bytes / copy rate) / time\n\n";
  char line[320];
  std::snprintf(line, sizeof line, "%-16s %10s %21s %9s %8s %9s %8s %8s %6s\n", "stage", "time ms", "(min..max)",
                "GFLOP", "TFLOP/s", "MB", "GB/s", "roofline", "bound");
  os << line;
  const auto row = [&](const std::string& name, const Timing& t, double flops, double bytes) {
    const double sec = t.median;
    const double floor_s = r.roofline_s(flops, bytes);
    const bool compute = r.gemm_rate() > 0 && r.copy_rate() > 0 && flops / r.gemm_rate() > bytes / r.copy_rate();
    const std::string range = "(" + fmt("%.3f", t.min * 1e3) + ".." + fmt("%.3f", t.max * 1e3) + ")";
    std::snprintf(line, sizeof line, "%-16s %10.4f %21s %9s %8s %9s %8s %8s %6s\n", name.c_str(), sec * 1e3,
                  range.c_str(), flops > 0 ? fmt("%.2f", flops * 1e-9).c_str() : "-",
                  flops > 0 && sec > 0 ? fmt("%.1f", flops / sec * 1e-12).c_str() : "-",
                  bytes > 0 ? fmt("%.1f", bytes * 1e-6).c_str() : "-",
                  bytes > 0 && sec > 0 ? fmt("%.0f", bytes / sec * 1e-9).c_str() : "-",
                  floor_s > 0 && sec > 0 ? fmt("%.3f", floor_s / sec).c_str() : "-",
                  floor_s > 0 ? (compute ? "FLOP" : "bytes") : "-");
    os << line;
  };
  double stage_sum = 0;
  for (const auto& s : r.stages) {
    row(s.name, s.time, s.flops, s.bytes);
    stage_sum += s.time.median;
  }
  row("layer", r.layer_time, r.layer_flops, r.layer_bytes);
  os << "(layer: first stage start to last stage end on the device; sum of the stage medians "
     << fmt("%.3f", stage_sum * 1e3) << " ms; host wall, synchronized: " << fmt("%.3f", r.layer_wall.median * 1e3)
     << " ms; layer bytes = weights + x + h_out + cache rows)\n";
  // A layer wall with probes over the one without (0 when that was not measured).
  const auto over_bare = [&](double s) { return r.layer_wall.median > 0 ? s / r.layer_wall.median : 0.0; };
  const auto over_run = [&](double s) { return r.run_wall.median > 0 ? s / r.run_wall.median : 0.0; };
  for (const auto& p : r.probes) {
    os << "probe overhead at " << p.level << ": ";
    if (!p.run_time.samples.empty())
      os << fmt("%+.1f", 100 * (over_run(p.run_time.median) - 1)) << "% in a run of " << r.run_layers
         << " layers back to back: " << fmt("%.3f", p.run_time.median * 1e3) << " ms per layer vs "
         << fmt("%.3f", r.run_wall.median * 1e3) << " ms without probes = " << fmt("%.3f", over_run(p.run_time.median))
         << "x (median of " << p.run_time.samples.size() << " rounds, each " << fmt("%.3f", over_run(p.run_time.min))
         << "x.." << fmt("%.3f", over_run(p.run_time.max)) << "x; "
         << (r.pipelined ? "a layer's records built while the next one runs"
                         : "each layer's records awaited at its end")
         << "; targets: stats <= +5%, sketch <= +10%, <= +5% at prefill T 4096)\n  one layer alone, ";
    os << "layer wall " << fmt("%.3f", p.layer_time.median * 1e3) << " ms vs "
       << fmt("%.3f", r.layer_wall.median * 1e3) << " ms without probes = "
       << fmt("%.3f", over_bare(p.layer_time.median)) << "x (+"
       << fmt("%.1f", r.layer_wall.median > 0 ? 100 * (over_bare(p.layer_time.median) - 1) : 0)
       << "%; synchronized, its records awaited at its end; median of " << p.layer_time.samples.size()
       << " rounds, each " << fmt("%.3f", over_bare(p.layer_time.min)) << "x.."
       << fmt("%.3f", over_bare(p.layer_time.max)) << "x)\n"
       << "  of which host time in the probe calls beside the stages " << fmt("%.3f", p.host_calls.median * 1e3)
       << " ms (starting them " << fmt("%.3f", p.host_starts.median * 1e3) << " ms, the rest taking finished records)"
       << ", waiting for probes at the end of the layer " << fmt("%.3f", p.end_wait.median * 1e3) << " ms\n"
       << "  building the records from the device's results on the host " << fmt("%.3f", p.builds.median * 1e3)
       << " ms, the layer's last record " << fmt("%.3f", p.last_build.median * 1e3)
       << " ms (after the device is done: part of the wall)\n"
       << "  host time in the stages' calls " << fmt("%.3f", p.stage_calls.median * 1e3) << " ms vs "
       << fmt("%.3f", r.bare_stage_calls.median * 1e3) << " ms without probes\n"
       << "  on the device: the layer's span with these probes " << fmt("%.3f", p.device_span.median * 1e3)
       << " ms vs " << fmt("%.3f", r.layer_time.median * 1e3) << " ms without ("
       << fmt("%+.3f", (p.device_span.median - r.layer_time.median) * 1e3) << " ms, each round "
       << fmt("%+.3f", (p.device_span.min - r.layer_time.median) * 1e3) << ".."
       << fmt("%+.3f", (p.device_span.max - r.layer_time.median) * 1e3) << " ms: the probes' device work between "
       << "the stages; the rest of the wall's overhead is the host's and the last records' copies)\n";
    if (p.held)
      os << "  held (cuda:probe_launch=layer or attention): the probes' kernels run together after the last stage "
         << "(and before the attention with attention), then one copy (beside the next layer's stages; behind the "
         << "kernels with probe_copy=rank) and the records: the wall's overhead is that tail\n";
    // Where the span's growth is: the device time after each stage beyond the bare layer's, largest first.
    if (!p.after_stage.empty() && !p.held) {
      auto order = p.after_stage;
      std::stable_sort(order.begin(), order.end(),
                       [](const auto& a, const auto& b) { return a.extra.median > b.extra.median; });
      os << "  after each stage, its probes' device time (the gap to the next stage beyond the bare layer's, median, "
         << "ms):";
      const auto names = [](const std::vector<std::string>& probes) {
        std::string all;
        for (const auto& n : probes) all += (all.empty() ? "" : " ") + n;
        return all;
      };
      for (const auto& a : order)
        os << "\n    " << a.stage << std::string(a.stage.size() < 16 ? 16 - a.stage.size() : 0, ' ') << " "
           << fmt("%+8.4f", a.extra.median * 1e3) << "  " << names(a.probes);
      if (!p.after_span.stage.empty())
        os << "\n    (the last stage's, " << p.after_span.stage << ": " << names(p.after_span.probes)
           << ", run after the span: with their copies and records, the wall's tail)";
      os << "\n";
    }
  }
  // The all-reduce as NCCL's tests report it: algbw = bytes / time, busbw = algbw · 2(n-1)/n (the rate each
  // link sustains in a ring), with the time of the stage's slowest device.
  for (const auto& s : r.stages)
    if (s.name == "all_reduce" && r.tp > 1 && s.time.median > 0) {
      const double bytes = 2.0 * r.all_reduce_elems;
      const double alg = bytes / s.time.median;
      os << "all_reduce  " << r.tp << " ranks, " << fmt("%.1f", bytes * 1e-6) << " MB per rank (bf16 [" << r.tokens
         << ", hidden]): " << fmt("%.4f", s.time.median * 1e3) << " ms, algbw " << fmt("%.1f", alg * 1e-9)
         << " GB/s, busbw " << fmt("%.1f", alg * 2.0 * (r.tp - 1) / r.tp * 1e-9) << " GB/s\n";
    }
}

}  // namespace

void print_bench(const BenchResult& r, std::ostream& os) {
  if (r.device) {
    print_device_bench(r, os);
    return;
  }
  std::string ctx;
  for (int c : r.context) ctx += (ctx.empty() ? "" : ",") + std::to_string(c);
  os << "bench  model " << r.model << "  engine " << r.engine << "  mode " << r.mode << "  attention " << r.form
     << "  tokens " << r.tokens << "  batch " << r.batch << (ctx.empty() ? "" : "  context " + ctx) << "  tp " << r.tp
     << "  layers " << r.layers << "\n"
     << "machine  " << r.cpu_model << ", " << r.logical_cpus << " logical CPUs, " << r.physical_cores
     << " physical cores; Eigen threads " << r.eigen_threads << "; Eigen SIMD " << r.simd << "\n"
     << "times: median of " << r.repeats << " rounds after " << r.warmup
     << " warm-up (min..max in brackets); per layer, summed over ranks; probes off\n\n";

  const std::string top = r.probes.empty() ? "" : r.probes.back().level;
  const std::string probe_head = top.empty() ? "" : "probes ms (" + top + ")";
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %11s %23s %9s %9s %8s %12s\n", "stage", "time ms", "(min..max)", "GFLOP",
                "GFLOP/s", "of GEMM", probe_head.c_str());
  os << line;
  const double gemm_rate = r.gemm_gflops();
  const auto row = [&](const std::string& name, const Timing& t, double flops, const std::string& probe) {
    const double rate = flops > 0 && t.median > 0 ? flops / t.median * 1e-9 : 0;
    const std::string range = "(" + fmt("%.3f", t.min * 1e3) + ".." + fmt("%.3f", t.max * 1e3) + ")";
    std::snprintf(line, sizeof line, "%-16s %11.3f %23s %9s %9s %8s %12s\n", name.c_str(), t.median * 1e3,
                  range.c_str(), flops > 0 ? fmt("%.4g", flops * 1e-9).c_str() : "-",
                  rate > 0 ? fmt("%.2f", rate).c_str() : "-",
                  rate > 0 && gemm_rate > 0 ? fmt("%.2f", rate / gemm_rate).c_str() : "-", probe.c_str());
    os << line;
  };
  double stage_sum = 0, probe_sum = 0;
  for (const auto& s : r.stages) {
    row(s.name, s.time, s.flops, top.empty() ? "" : fmt("%.3f", s.probe_time.median * 1e3));
    stage_sum += s.time.median;
    probe_sum += s.probe_time.median;
  }
  row("layer", r.layer_time, r.layer_flops, top.empty() ? "" : fmt("%.3f", probe_sum * 1e3));
  os << "(sum of the stage medians " << fmt("%.3f", stage_sum * 1e3) << " ms)\n\n";

  os << "ceiling: Eigen GEMM of the " << r.gemm.what << " size, Y[" << r.gemm.m << " x " << r.gemm.n << "] = X["
     << r.gemm.m << " x " << r.gemm.k << "] * W[" << r.gemm.n << " x " << r.gemm.k << "]^T: "
     << fmt("%.3f", r.gemm.time.median * 1e3) << " ms (" << fmt("%.3f", r.gemm.time.min * 1e3) << ".."
     << fmt("%.3f", r.gemm.time.max * 1e3) << "), " << fmt("%.4g", r.gemm.flops * 1e-9) << " GFLOP, "
     << fmt("%.2f", gemm_rate) << " GFLOP/s\n";
  os << "layer: " << fmt("%.2f", r.layer_gflops()) << " GFLOP/s = " << fmt("%.3f", r.fraction_of_gemm())
     << " of the GEMM ceiling" << (r.engine.rfind("reference", 0) == 0 ? " (the reference aims for >= 0.8)" : "") << "\n";
  for (const auto& p : r.probes)
    os << "probe overhead at " << p.level << ": layer " << fmt("%.3f", p.layer_time.median * 1e3) << " ms = "
       << fmt("%.3f", r.layer_time.median > 0 ? p.layer_time.median / r.layer_time.median : 0) << "x the layer without probes\n";
}

nlohmann::json bench_to_json(const BenchResult& r) {
  nlohmann::json j;
  j["schema_version"] = kJsonSchemaVersion;
  j["command"] = "bench";
  j["model"] = r.model;
  j["engine"] = r.engine;
  j["mode"] = r.mode;
  j["attention"] = r.form;
  j["tokens"] = r.tokens;
  j["batch"] = r.batch;
  j["context"] = r.context;
  j["tp"] = r.tp;
  if (r.device) j["all_reduce_bytes_per_rank"] = 2.0 * r.all_reduce_elems;
  j["layers"] = r.layers;
  j["repeats"] = r.repeats;
  j["warmup"] = r.warmup;
  j["machine"] = {{"cpu_model", r.cpu_model},       {"logical_cpus", r.logical_cpus},
                  {"physical_cores", r.physical_cores}, {"eigen_threads", r.eigen_threads},
                  {"eigen_simd", r.simd}};
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : r.stages) {
    nlohmann::json e = {{"stage", s.name}, {"flops", s.flops}, {"time", timing_json(s.time)},
                        {"probe_time", timing_json(s.probe_time)}};
    e["gflops_per_s"] = s.flops > 0 && s.time.median > 0 ? s.flops / s.time.median * 1e-9 : 0.0;
    stages.push_back(e);
  }
  j["stages"] = stages;
  j["layer"] = {{"flops", r.layer_flops}, {"time", timing_json(r.layer_time)}, {"gflops_per_s", r.layer_gflops()},
                {"fraction_of_gemm", r.fraction_of_gemm()}};
  j["gemm_ceiling"] = {{"projection", r.gemm.what}, {"m", r.gemm.m},   {"n", r.gemm.n},
                       {"k", r.gemm.k},             {"flops", r.gemm.flops}, {"time", timing_json(r.gemm.time)},
                       {"gflops_per_s", r.gemm_gflops()}};
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : r.probes)
    probes.push_back({{"level", p.level},
                      {"layer_time", timing_json(p.layer_time)},
                      {"ratio", r.layer_time.median > 0 ? p.layer_time.median / r.layer_time.median : 0.0}});
  j["probe_overhead"] = probes;
  if (r.device) {
    j["device"] = {{"name", r.device_name}, {"random_cache", r.random_cache}};
    nlohmann::json ceilings = nlohmann::json::array();
    for (const auto& c : r.ceilings)
      ceilings.push_back({{"what", c.what}, {"flops", c.flops}, {"bytes", c.bytes}, {"time", timing_json(c.time)},
                          {"flops_per_s", c.flops_per_s()}, {"bytes_per_s", c.bytes_per_s()}});
    j["ceilings"] = ceilings;
    for (size_t i = 0; i < r.stages.size(); ++i) {
      const auto& s = r.stages[i];
      auto& e = j["stages"][i];
      e["bytes"] = s.bytes;
      e["bytes_per_s"] = s.time.median > 0 ? s.bytes / s.time.median : 0.0;
      e["roofline_fraction"] = s.time.median > 0 ? r.roofline_s(s.flops, s.bytes) / s.time.median : 0.0;
    }
    j["layer"]["bytes"] = r.layer_bytes;
    j["layer"]["wall"] = timing_json(r.layer_wall);
    j["layer"]["run_wall"] = timing_json(r.run_wall);
    j["run_layers"] = r.run_layers;
    j["pipelined"] = r.pipelined;
    j["layer"]["roofline_fraction"] = r.layer_time.median > 0 ? r.roofline_s(r.layer_flops, r.layer_bytes) / r.layer_time.median : 0.0;
    for (size_t i = 0; i < r.probes.size(); ++i) {
      auto& e = j["probe_overhead"][i];
      e["ratio"] = r.layer_wall.median > 0 ? r.probes[i].layer_time.median / r.layer_wall.median : 0.0;
      e["host_calls"] = timing_json(r.probes[i].host_calls);
      e["end_wait"] = timing_json(r.probes[i].end_wait);
      e["device_span"] = timing_json(r.probes[i].device_span);
      e["host_starts"] = timing_json(r.probes[i].host_starts);
      e["stage_calls"] = timing_json(r.probes[i].stage_calls);
      e["builds"] = timing_json(r.probes[i].builds);
      e["last_build"] = timing_json(r.probes[i].last_build);
      e["held"] = r.probes[i].held;
      e["run_time"] = timing_json(r.probes[i].run_time);
      e["run_ratio"] = r.run_wall.median > 0 ? r.probes[i].run_time.median / r.run_wall.median : 0.0;
      nlohmann::json after = nlohmann::json::array();
      for (const auto& a : r.probes[i].after_stage)
        after.push_back({{"stage", a.stage}, {"probes", a.probes}, {"extra", timing_json(a.extra)}});
      e["after_stage"] = after;
      e["after_span"] = {{"stage", r.probes[i].after_span.stage}, {"probes", r.probes[i].after_span.probes}};
    }
  }
  return j;
}


}  // namespace mla
