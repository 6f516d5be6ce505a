// Golden dumps: making one (FP32 reference, full probes), checking an engine against one in process, SHA-256 and
// the manifest.
#include "harness/golden/golden.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/engine/engine.h"
#include "core/model/errors.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/run_meta.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "harness/run/tolerance_for.h"
#include "harness/run/watchdog.h"
#include "probes/collect.h"
#include "probes/journal.h"

namespace mla {

namespace fs = std::filesystem;

namespace {

DumpMeta golden_meta(const MlaConfig& cfg, const RunSpec& spec, uint64_t weight_seed, const Engine& engine) {
  RunDescription run;
  run.options = run_spec_to_json(spec);
  run.options["weights"] = "synthetic";
  run.options["weight_seed"] = weight_seed;
  run.options["input"] = "synthetic";
  run.options["probe_level"] = "full";
  run.options["full_probes"] = "";
  run.probe_level = "full";
  return run_dump_meta(engine, cfg, spec, run, "");
}

// Forwards to a sink and tells `on_stop` when a watchdog closes the run ("stopped: ...").
class StopHook : public ProbeSink {
 public:
  StopHook(ProbeSink& inner, const std::function<void(const std::string&)>& on_stop) : inner_(inner), on_stop_(on_stop) {}
  void stage_begin(int layer, Stage stage, int rank) override { inner_.stage_begin(layer, stage, rank); }
  void waiting(int layer, Stage stage, int rank) override { inner_.waiting(layer, stage, rank); }
  void waiting_over() override { inner_.waiting_over(); }
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override {
    inner_.record(layer, spec, rank, rec);
  }
  void record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override {
    inner_.record_weight(layer, spec, rank, rec);
  }
  void finish(const std::string& status) override {
    inner_.finish(status);
    if (on_stop_ && status.rfind("stopped", 0) == 0) on_stop_(status);
  }

 private:
  ProbeSink& inner_;
  const std::function<void(const std::string&)>& on_stop_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Make and check
// ---------------------------------------------------------------------------------------------------

Dump make_golden(const MlaConfig& cfg, const RunSpec& spec, uint64_t weight_seed, const std::string& command) {
  Runner runner(cfg, spec);
  auto engine = make_engine(EngineSpec::parse("reference:precision=fp32"));
  const auto weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, weight_seed);
  const Inputs inputs = synthetic_inputs(cfg, spec, weights);
  DumpMeta meta = golden_meta(cfg, spec, weight_seed, *engine);
  meta.command = command;
  CollectSink sink(meta, spec.tp);
  ProbePlan plan;
  plan.level = ProbeLevel::ProbeLevel_full;
  runner.run(*engine, weights, inputs, plan, sink);
  Dump d = sink.take();
  d.has_inputs = true;
  d.inputs = inputs;
  return d;
}

GoldenCheck check_golden(const Dump& golden, const GoldenCheckOptions& opt,
                         const std::function<void(const std::string&)>& on_stop) {
  const std::string& g = golden.path;
  if (!golden.has_inputs) throw UsageError(g + ": the golden has no /inputs, so it cannot be re-run");
  const MlaConfig cfg = golden.config();
  RunSpec spec = golden.spec();
  if (opt.tp > 0) spec.tp = opt.tp;
  const auto weights_spec = golden.meta.run_options.value("weights", std::string("synthetic"));
  if (weights_spec != "synthetic")
    throw UsageError(g + ": made with weights '" + weights_spec + "'; golden check re-runs synthetic weights only");
  uint64_t weight_seed = 0;
  try {
    weight_seed = golden.meta.run_options.value("weight_seed", uint64_t{0});
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(g + ": run_options.weight_seed: " + e.what());
  }
  if (static_cast<int>(golden.inputs.kv_cache.size()) != spec.layers)
    throw UsageError(g + ": /inputs holds kv caches for " + std::to_string(golden.inputs.kv_cache.size()) +
                     " layers but the run spec has " + std::to_string(spec.layers));
  if (golden.inputs.x.dim(1) != cfg.hidden)
    throw UsageError(g + ": /inputs/x is " + shape_string(golden.inputs.x.shape) + " but the model's hidden size is " +
                     std::to_string(cfg.hidden));

  if (!opt.only.empty() || !opt.allow_missing.empty()) {  // unknown probe names: a usage error before the run
    CompareOptions names;
    names.only = opt.only;
    names.allow_missing = opt.allow_missing;
    expected_probes(golden, golden, names);
  }
  Runner runner(cfg, spec);
  std::vector<std::string> names;
  for (const auto& p : runner.graph().probes) names.push_back(p.name);
  check_tol_overrides(opt.overrides, names, "the golden's stage graph");
  auto engine = make_engine(EngineSpec::parse(opt.engine));
  engine->set_injections(parse_injections(opt.inject));
  const auto weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, weight_seed);
  DumpMeta meta = golden_meta(cfg, spec, weight_seed, *engine);
  meta.inject = opt.inject;
  meta.command = "golden check " + g + " --engine " + opt.engine;
  CollectSink sink(meta, spec.tp);
  sink.dump().path = engine->name() + ":" + engine->options() + (opt.inject.empty() ? "" : " --inject " + opt.inject) +
                     " (re-run of " + g + ")";
  ProbePlan plan;
  plan.level = ProbeLevel::ProbeLevel_full;
  StopHook hook(sink, on_stop);
  {
    WatchdogSink watchdog(hook, opt.timeout_s);
    try {
      runner.run(*engine, weights, golden.inputs, plan, watchdog);
    } catch (const EngineError& e) {
      sink.finish(std::string("stopped: engine error: ") + e.what());
    }
  }
  GoldenCheck out;
  out.candidate = sink.take();
  ToleranceModel tol = tolerance_for(out.candidate, golden, "auto", opt.k);
  tol.overrides = opt.overrides;
  CompareOptions copt;
  copt.only = opt.only;
  copt.allow_missing = opt.allow_missing;
  out.report = compare_dumps(out.candidate, golden, tol, copt);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// The manifest
// ---------------------------------------------------------------------------------------------------


std::vector<ManifestEntry> read_manifest(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  std::ifstream in(path);
  if (!in) throw UsageError(path + ": cannot open the golden manifest");
  std::vector<ManifestEntry> out;
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.value("format", std::string()) != "mla-bisect-golden-manifest")
      throw UsageError(path + ": not a golden manifest (format is not 'mla-bisect-golden-manifest')");
    for (const auto& e : j.at("goldens")) {
      ManifestEntry m;
      m.file = e.at("file").get<std::string>();
      m.sha256 = e.at("sha256").get<std::string>();
      m.command = e.value("command", std::string());
      m.tool_version = e.value("tool_version", std::string());
      m.created = e.value("created", std::string());
      out.push_back(std::move(m));
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": malformed golden manifest: " + e.what());
  }
  return out;
}

void write_manifest(const std::string& path, const std::vector<ManifestEntry>& entries) {
  nlohmann::ordered_json j;
  j["format"] = "mla-bisect-golden-manifest";
  j["version"] = 1;
  j["regenerate"] = "run an entry's command from the repository root; golden make updates this file";
  j["goldens"] = nlohmann::ordered_json::array();
  for (const auto& e : entries)
    j["goldens"].push_back({{"file", e.file},
                            {"sha256", e.sha256},
                            {"command", e.command},
                            {"tool_version", e.tool_version},
                            {"created", e.created}});
  const std::string text = j.dump(2) + "\n";
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UsageError(tmp + ": cannot write the golden manifest: " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw UsageError(tmp + ": write failed: " + std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw UsageError(path + ": cannot put the golden manifest in place: " + std::strerror(errno));
  }
  journal::sync_dir(path);
}

ManifestEntry manifest_entry(const std::string& golden_path, const std::string& manifest_dir) {
  DumpReadOptions ro;
  ro.inputs = false;
  ro.probes = false;
  const Dump d = read_dump(golden_path, ro);
  if (!d.complete()) throw UsageError(golden_path + ": status '" + d.status + "': not a complete golden");
  ManifestEntry e;
  std::error_code ec;
  e.file = fs::relative(fs::absolute(golden_path), fs::absolute(manifest_dir), ec).generic_string();
  if (ec || e.file.empty()) e.file = fs::path(golden_path).filename().string();
  e.sha256 = sha256_file(golden_path);
  e.command = d.meta.command;
  e.tool_version = d.tool_version;
  e.created = d.created_utc;
  return e;
}

std::vector<ManifestEntry> update_manifest(const std::string& manifest_path, const std::vector<std::string>& goldens,
                                           bool prune) {
  const fs::path dir = fs::path(manifest_path).parent_path().empty() ? fs::path(".") : fs::path(manifest_path).parent_path();
  std::vector<ManifestEntry> entries = read_manifest(manifest_path);
  for (const auto& g : goldens) {
    ManifestEntry e = manifest_entry(g, dir.string());
    auto it = std::find_if(entries.begin(), entries.end(), [&](const ManifestEntry& x) { return x.file == e.file; });
    if (it != entries.end()) *it = std::move(e);
    else entries.push_back(std::move(e));
  }
  if (prune) {
    std::error_code ec;
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const ManifestEntry& e) { return !fs::exists(dir / e.file, ec); }),
                  entries.end());
  }
  std::sort(entries.begin(), entries.end(), [](const ManifestEntry& a, const ManifestEntry& b) { return a.file < b.file; });
  write_manifest(manifest_path, entries);
  return entries;
}

}  // namespace mla
