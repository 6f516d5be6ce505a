// Replay of a whole-model capture, layer by layer (harness/bisect/replay_layers.h).
#include "harness/bisect/replay_layers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include <omp.h>

#include <Eigen/Core>

#include "harness/bisect/bisect_html.h"
#include "harness/compare/diagnose.h"
#include "core/model/errors.h"
#include "harness/report/compare_report.h"
#include "harness/report/progress.h"
#include "harness/run/memory_estimate.h"
#include "probes/dump.h"
#include "reference/cpu_threads.h"

namespace mla {

namespace fs = std::filesystem;

std::map<int, std::string> layer_capture_files(const std::string& path) {
  std::map<int, std::string> out;
  const fs::path p(path);
  std::string stem = p.filename().string();
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".h5") == 0) stem.resize(stem.size() - 3);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  // FILE.layer<L>.h5, its journal, or rank R's part FILE.layer<L>.rank<R>.h5 (and their journals).
  const std::regex re(std::regex_replace(stem, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                      R"(\.layer(\d+)(\.rank\d+)?\.h5(\.journal)?)");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, re)) continue;
    const int layer = std::stoi(m[1].str());
    out[layer] = (dir / (stem + ".layer" + m[1].str() + ".h5")).string();
  }
  return out;
}

bool is_layer_capture_set(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path, ec) || fs::exists(path + ".journal", ec) || fs::exists(rank_dump_path(path, 0), ec) ||
      fs::exists(rank_dump_path(path, 0) + ".journal", ec))
    return false;
  return !layer_capture_files(path).empty();
}

namespace {

void scan_measure_worst(LayerReplay& l) {
  for (const auto& r : l.rep.compare.results) {
    if (r.weight || r.verdict == Verdict::Verdict_missing || r.tol.rel_l2 <= 0) continue;
    const double ratio = std::isfinite(r.m.rel_l2) ? r.m.rel_l2 / r.tol.rel_l2 : HUGE_VAL;
    if (ratio > l.worst_ratio || l.worst_probe.empty()) {
      l.worst_ratio = ratio;
      l.worst_probe = r.name;
    }
  }
}

std::string scan_layer_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return s;
}

std::string scan_cause_text(const BisectReport& rep) {
  if (!rep.first) return "";
  const Diagnosis& d = rep.diagnosis;
  if (d.pattern.empty()) return "";
  return (d.confidence == "confirmed" ? "" : "(" + diagnosis_label(d) + ") ") + d.pattern;
}

std::string scan_verdict_word(const LayerReplay& l) {
  switch (l.exit_code) {
    case 0: return "agrees";
    case 1: return "DIVERGES";
    case 3: return "stopped";
    default: return "not replayed";
  }
}

}  // namespace

namespace {

// The memory one layer's replay holds at its peak, from the first layer's capture: the reference run's estimate (its
// weights, activations, scores, cache and probes) and again half of it for the calibration run and the capture's
// records beside it. 0 when the capture cannot be read (that layer then reports why).
double layer_replay_bytes(const std::string& file, int threads) {
  try {
    DumpReadOptions ro;
    ro.data = false;
    const Dump d = read_dump(file, ro);
    const MlaConfig cfg = d.config();
    const RunSpec spec = d.spec();
    MemoryEstimateInput in;
    in.cfg = &cfg;
    in.spec = &spec;
    in.threads = threads;
    return 1.5 * estimate_host_memory(in).total();
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

ScanPlan plan_replay_scan(int jobs, size_t layers, const std::string& first_file) {
  ScanPlan plan;
  const int cores = std::max(1, ref::set_eigen_threads());
  // A layer's replay has serial parts (reading the capture and the checkpoint's tensors, calibration set-up,
  // comparison) beside its parallel GEMMs and attention: one layer per core, the cores shared among the layers
  // running, keeps every core busy through them.
  plan.workers = jobs > 0 ? jobs : cores;
  plan.why = jobs > 0 ? "--jobs " + std::to_string(jobs) : std::to_string(cores) + " cores";
  if (plan.workers > static_cast<int>(layers)) plan.workers = static_cast<int>(layers);
  plan.workers = std::max(plan.workers, 1);
  if (plan.workers > 1) {
    const double each = layer_replay_bytes(first_file, std::max(1, cores / plan.workers));
    const MemoryAvailable have = available_host_memory();
    if (each > 0 && have.bytes > 0) {
      const int by_memory = std::max(1, static_cast<int>(0.8 * have.bytes / each));
      if (by_memory < plan.workers) {
        plan.workers = by_memory;
        plan.why = format_bytes(have.bytes) + " available (" + have.source + "), about " + format_bytes(each) +
                   " a layer";
      }
    }
  }
  plan.threads = std::max(1, cores / plan.workers);
  return plan;
}

ReplayScan run_replay_layers(const ReplayOptions& base, const std::map<int, std::string>& files,
                             const std::optional<std::pair<int, int>>& only, int jobs) {
  const ProgressLog progress(base.progress);
  ReplayScan scan;
  scan.capture = base.capture;
  std::vector<std::pair<int, std::string>> todo;
  for (const auto& [layer, file] : files)
    if (!only || (layer >= only->first && layer < only->second)) todo.emplace_back(layer, file);
  if (todo.empty())
    throw UsageError(base.capture + ": no captured layer in " +
                     (only ? std::to_string(only->first) + ":" + std::to_string(only->second) : std::string("the set")));
  const ScanPlan plan = plan_replay_scan(jobs, todo.size(), todo.front().second);
  scan.workers = plan.workers;
  if (plan.workers > 1)
    progress.step(std::to_string(todo.size()) + " layers, " + std::to_string(plan.workers) + " at once with " +
                  std::to_string(plan.threads) + (plan.threads == 1 ? " thread" : " threads") + " each (" + plan.why + ")");

  std::vector<LayerReplay> done(todo.size());
  std::mutex mu;  // the next layer to take, the progress lines, an unexpected error
  size_t next = 0, finished = 0;
  std::exception_ptr unexpected;
  const auto replay_one = [&](size_t i) {
    const auto& [layer, file] = todo[i];
    LayerReplay& l = done[i];
    l.layer = layer;
    l.file = file;
    ReplayOptions o = base;
    o.capture = file;
    o.layer = layer;
    o.progress = false;
    if (!base.reference_out.empty()) o.reference_out = base.reference_out + ".layer" + std::to_string(layer) + ".h5";
    const auto t0 = std::chrono::steady_clock::now();
    try {
      l.rep = run_replay(o);
      l.exit_code = l.rep.exit_code;
      scan_measure_worst(l);
    } catch (const EngineError& e) {
      l.exit_code = ExitCode_engine;
      l.error = e.what();
    } catch (const UsageError& e) {
      l.exit_code = ExitCode_usage;
      l.error = e.what();
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lock(mu);
    ++finished;
    if (plan.workers > 1) {
      std::ostringstream line;
      line << "layer " << layer << " done (" << finished << " of " << todo.size() << ", " << std::fixed
           << std::setprecision(1) << sec << " s): "
           << (l.exit_code == 0 ? "agrees" : l.exit_code == 1 ? "diverges" : l.exit_code == 3 ? "stopped"
                                                                                                  : "not replayed");
      progress.step(line.str());
    }
  };
  if (plan.workers == 1) {
    for (size_t i = 0; i < todo.size(); ++i) {
      progress.step("layer " + std::to_string(todo[i].first) + " (" + std::to_string(i + 1) + " of " +
                    std::to_string(todo.size()) + "): replaying " + todo[i].second);
      replay_one(i);
    }
  } else {
    // Eigen's thread count is one setting for the process: every layer's GEMMs take the same share of the cores
    // while they run side by side (and OpenMP's per thread, for the reference's own parallel loops).
    const int eigen_threads = Eigen::nbThreads();
    Eigen::setNbThreads(plan.threads);
    std::vector<std::thread> pool;
    for (int w = 0; w < plan.workers; ++w)
      pool.emplace_back([&] {
        omp_set_num_threads(plan.threads);
        for (;;) {
          size_t i;
          {
            std::lock_guard lock(mu);
            if (next >= todo.size() || unexpected) return;
            i = next++;
          }
          try {
            replay_one(i);
          } catch (...) {
            std::lock_guard lock(mu);
            if (!unexpected) unexpected = std::current_exception();
          }
        }
      });
    for (auto& t : pool) t.join();
    Eigen::setNbThreads(eigen_threads);
    if (unexpected) std::rethrow_exception(unexpected);
  }
  scan.layers = std::move(done);

  std::vector<int> agree, diverge, stopped, failed;
  for (const auto& l : scan.layers) {
    (l.exit_code == 0 ? agree : l.exit_code == 1 ? diverge : l.exit_code == 3 ? stopped : failed).push_back(l.layer);
    if (l.exit_code == 1 && scan.first_layer < 0) scan.first_layer = l.layer;
  }
  const std::string n = std::to_string(scan.layers.size());
  if (!diverge.empty()) {
    const LayerReplay& f = *std::find_if(scan.layers.begin(), scan.layers.end(),
                                         [&](const LayerReplay& l) { return l.layer == scan.first_layer; });
    scan.exit_code = ExitCode_divergence;
    scan.headline = "layer " + std::to_string(f.layer) + "'s MLA diverges on its own captured inputs" +
                    (f.rep.first ? ": first divergent probe " + f.rep.first->name + " (stage " + f.rep.first->stage + ")"
                                 : std::string()) +
                    (diverge.size() > 1 ? "; layers " + scan_layer_list(diverge) + " diverge" : std::string()) +
                    (agree.empty() ? std::string() : "; layers " + scan_layer_list(agree) + " agree");
  } else if (!stopped.empty() || !failed.empty()) {
    scan.exit_code = !stopped.empty() ? ExitCode_engine : ExitCode_usage;
    scan.headline = std::to_string(agree.size()) + " of " + n + " captured layers agree with the reference on their own " +
                    "inputs" + (stopped.empty() ? "" : "; layers " + scan_layer_list(stopped) + " stopped early") +
                    (failed.empty() ? "" : "; layers " + scan_layer_list(failed) + " could not be replayed") +
                    ": no verdict on those";
  } else {
    scan.exit_code = ExitCode_ok;
    scan.headline = "every MLA layer agrees with the reference on its own inputs (layers " + scan_layer_list(agree) +
                    "): if the model's output is wrong, the error enters outside MLA attention (MLP/MoE, embeddings, "
                    "sampling), or in a layer not captured";
  }
  scan.seconds = progress.seconds();
  return scan;
}

void print_replay_scan(std::ostream& os, const ReplayScan& scan) {
  os << "== mla-bisect: " << scan.headline << " ==\n\n";
  os << "layer  verdict        worst/tol  worst probe   first divergent            isolation / diagnosis\n";
  for (const auto& l : scan.layers) {
    std::ostringstream ratio;
    if (l.worst_probe.empty()) ratio << "-";
    else if (!std::isfinite(l.worst_ratio)) ratio << "non-finite";
    else ratio << std::setprecision(3) << l.worst_ratio << "x";
    os << std::left << std::setw(7) << l.layer << std::setw(15) << scan_verdict_word(l) << std::setw(11) << ratio.str()
       << std::setw(14) << (l.worst_probe.empty() ? "-" : l.worst_probe) << std::setw(27)
       << (l.rep.first ? l.rep.first->name + " (" + l.rep.first->stage + ")" : std::string("-")) << std::right;
    if (!l.error.empty()) os << l.error;
    else if (l.rep.first) {
      os << (l.rep.isolation.empty() ? "" : l.rep.isolation);
      const std::string c = scan_cause_text(l.rep);
      if (!c.empty()) os << (l.rep.isolation.empty() ? "" : "; ") << c;
    }
    os << "\n";
  }
  os << "\n(worst/tol: the largest rel_l2 over the layer's captured probes divided by that probe's tolerance; "
        "each layer replayed on its own captured inputs)\n";
  for (const auto& l : scan.layers)
    if (l.layer == scan.first_layer && l.rep.isolation.rfind("not isolated", 0) == 0)
      os << "next: capture layer " << l.layer << " with its probes in full (mla_bisect.hf.capture_layer(model, "
         << l.layer << ", PATH), or capture_model(..., layers=[" << l.layer
         << "], probe_level=\"full\")) and replay it: the stage is then isolated and its causes tested\n";
  if (scan.first_layer >= 0) {
    for (const auto& l : scan.layers)
      if (l.layer == scan.first_layer) {
        os << "\n---- layer " << l.layer << " (" << l.file << ") ----\n";
        print_bisect(os, l.rep);
      }
  }
  os << "\n" << scan.layers.size() << " layers replayed (" << std::setprecision(3) << scan.seconds << " s)\n";
}

nlohmann::json replay_scan_to_json(const ReplayScan& scan) {
  nlohmann::json j;
  j["command"] = "replay";
  j["capture"] = scan.capture;
  j["headline"] = scan.headline;
  j["exit_code"] = scan.exit_code;
  j["first_layer"] = scan.first_layer >= 0 ? nlohmann::json(scan.first_layer) : nlohmann::json(nullptr);
  j["seconds"] = scan.seconds;
  j["layers"] = nlohmann::json::array();
  for (const auto& l : scan.layers) {
    nlohmann::json e = {{"layer", l.layer}, {"file", l.file}, {"exit_code", l.exit_code}, {"verdict", scan_verdict_word(l)}};
    if (!l.error.empty()) e["error"] = l.error;
    if (!l.worst_probe.empty()) {
      e["worst_probe"] = l.worst_probe;
      e["worst_ratio"] = std::isfinite(l.worst_ratio) ? nlohmann::json(l.worst_ratio) : nlohmann::json(nullptr);
    }
    if (l.error.empty()) e["report"] = bisect_to_json(l.rep);
    j["layers"].push_back(std::move(e));
  }
  return j;
}

std::string replay_scan_to_junit(const ReplayScan& scan) {
  std::ostringstream x;
  size_t failures = 0, errors = 0;
  for (const auto& l : scan.layers) (l.exit_code == 1 ? failures : errors) += l.exit_code == 0 ? 0 : 1;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"mla-bisect replay " << xml_escape(scan.capture)
    << "\" tests=\"" << scan.layers.size() << "\" failures=\"" << failures << "\" errors=\"" << errors << "\">\n";
  for (const auto& l : scan.layers) {
    x << "  <testcase classname=\"replay\" name=\"layer " << l.layer << "\">";
    if (l.exit_code == 1)
      x << "<failure message=\"" << xml_escape(l.rep.headline) << "\">" << xml_escape(l.rep.isolation) << "</failure>";
    else if (l.exit_code != 0)
      x << "<error message=\"" << xml_escape(l.error.empty() ? l.rep.headline : l.error) << "\"/>";
    x << "</testcase>\n";
  }
  x << "</testsuite>\n";
  return x.str();
}

std::string replay_scan_to_html(const ReplayScan& scan) {
  std::ostringstream h;
  h << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>mla-bisect replay</title><style>"
       "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
       "padding:3px 8px;text-align:left}.bad{color:#b00;font-weight:bold}</style></head><body>";
  h << "<h1>" << xml_escape(scan.headline) << "</h1><p>capture " << xml_escape(scan.capture) << "</p>";
  // The chart: each layer's worst rel_l2 / tolerance on a log axis from 1e-3 to 1e3; the tolerance is the line at 1.
  const double W = 640, H = 220, left = 50, bottom = 30, top = 10;
  const size_t n = std::max<size_t>(scan.layers.size(), 1);
  const double bw = (W - left - 10) / static_cast<double>(n);
  auto y_of = [&](double r) {
    const double v = std::clamp(std::log10(std::max(r, 1e-3)), -3.0, 3.0);
    return top + (H - top - bottom) * (3.0 - v) / 6.0;
  };
  h << "<svg width=\"" << W << "\" height=\"" << H << "\" xmlns=\"http://www.w3.org/2000/svg\">";
  for (int e = -3; e <= 3; ++e)
    h << "<text x=\"2\" y=\"" << y_of(std::pow(10.0, e)) + 4 << "\" font-size=\"10\">1e" << e << "</text>";
  h << "<line x1=\"" << left << "\" x2=\"" << W - 10 << "\" y1=\"" << y_of(1) << "\" y2=\"" << y_of(1)
    << "\" stroke=\"#b00\" stroke-dasharray=\"4\"/>";
  for (size_t i = 0; i < scan.layers.size(); ++i) {
    const auto& l = scan.layers[i];
    const double r = l.worst_probe.empty() ? 1e-3 : (std::isfinite(l.worst_ratio) ? l.worst_ratio : 1e3);
    const double x = left + i * bw, y = y_of(r), base = y_of(1e-3);
    h << "<rect x=\"" << x + 1 << "\" y=\"" << y << "\" width=\"" << std::max(bw - 2, 1.0) << "\" height=\""
      << base - y << "\" fill=\"" << (l.exit_code == 0 ? "#4a4" : l.exit_code == 1 ? "#c33" : "#999")
      << "\"><title>layer " << l.layer << ": " << xml_escape(l.worst_probe) << " " << r << "x tolerance</title></rect>";
    h << "<text x=\"" << x + bw / 2 - 4 << "\" y=\"" << H - 12 << "\" font-size=\"10\">" << l.layer << "</text>";
  }
  h << "<text x=\"" << left << "\" y=\"" << H - 1 << "\" font-size=\"10\">layer (bar: worst rel_l2 / tolerance, "
       "log scale; dashed: the tolerance)</text></svg>";
  h << "<table><tr><th>layer</th><th>verdict</th><th>worst/tol</th><th>worst probe</th><th>first divergent</th>"
       "<th>isolation / diagnosis</th></tr>";
  for (const auto& l : scan.layers) {
    h << "<tr><td>" << l.layer << "</td><td" << (l.exit_code == 1 ? " class=\"bad\"" : "") << ">" << scan_verdict_word(l)
      << "</td><td>" << (l.worst_probe.empty() ? "-" : std::to_string(l.worst_ratio)) << "</td><td>"
      << xml_escape(l.worst_probe) << "</td><td>"
      << (l.rep.first ? xml_escape(l.rep.first->name + " (" + l.rep.first->stage + ")") : "-") << "</td><td>"
      << xml_escape(!l.error.empty() ? l.error : l.rep.isolation + (scan_cause_text(l.rep).empty() ? "" : "; " + scan_cause_text(l.rep)))
      << "</td></tr>";
  }
  h << "</table>";
  for (const auto& l : scan.layers)
    if (l.layer == scan.first_layer)
      h << "<h2>layer " << l.layer << "</h2><iframe style=\"width:100%;height:1400px;border:0\" srcdoc=\""
        << xml_escape(bisect_to_html(l.rep)) << "\"></iframe>";
  h << "</body></html>\n";
  return h.str();
}

}  // namespace mla
