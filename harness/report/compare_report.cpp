// Terminal, JSON and JUnit renderings of a comparison, and the diagnosis of its first divergence.
#include "harness/report/compare_report.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "harness/compare/weight_diff.h"
#include "core/model/batch.h"
#include "core/model/errors.h"

namespace mla {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') out += '?';
        else out += c;
    }
  }
  return out;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw UsageError("cannot write " + path);
  f << text;
  if (!f) throw UsageError("failed writing " + path);
}

void print_findings(std::ostream& os, const Findings& f) {
  if (!f.diagnosis.pattern.empty()) {
    os << "\ndiagnosis (" << diagnosis_label(f.diagnosis) << "): " << f.diagnosis.pattern << "\n";
    for (auto& e : f.diagnosis.evidence) os << "  - " << e << "\n";
  }
  if (!f.drill.lines.empty()) {
    os << "\ndrill-down\n";
    for (auto& l : f.drill.lines) os << "  " << l << "\n";
  }
}

void print_weight_difference(std::ostream& os, const ProbeResult& w) {
  os << "\nWEIGHT DIFFERS: layer " << w.layer << " " << w.name << " (used by stage " << w.stage << ")";
  if (!w.ranks_off.empty() && w.m.rank_rel.size() > 1) {
    std::vector<int64_t> v(w.ranks_off.begin(), w.ranks_off.end());
    os << " on rank" << (v.size() == 1 ? " " : "s ") << ranges(v);
  }
  os << ": " << w.why << "\n";
  if (!w.pattern.empty()) os << "  pattern: " << w.pattern << "\n";
  for (auto& e : w.evidence) os << "  - " << e << "\n";
  os << "  tolerance " << fmt_num(w.tol.rel_l2) << ": " << w.tol.origin << "\n";
}

void print_compare(std::ostream& os, const CompareReport& rep, bool all_rows, const Findings* findings) {
  os << "candidate " << rep.a_path << " (" << rep.a_status << ")\nreference " << rep.b_path << " (" << rep.b_status
     << ")\n";
  if (rep.stopped_early()) {
    os << "\nSTOPPED EARLY: " << (rep.a_status != "complete" ? "the candidate " + rep.a_status : "")
       << (rep.a_status != "complete" && rep.b_status != "complete" ? "; " : "")
       << (rep.b_status != "complete" ? "the reference " + rep.b_status : "")
       << "\n  the comparison covers only the probes recorded before it stopped\n";
  }
  if (rep.first_weight >= 0) print_weight_difference(os, rep.weights[rep.first_weight]);
  if (rep.first_divergence >= 0) {
    const auto& r = rep.results[rep.first_divergence];
    os << "\nFIRST DIVERGENCE: layer " << r.layer << " probe " << r.name << " (stage " << r.stage << "): " << r.why << "\n";
    if (r.m.basis == "full")
      os << "  worst element " << fmt_num(r.m.a_at_max, 6) << " vs " << fmt_num(r.m.b_at_max, 6) << " at "
         << r.m.max_at.to_string() << "\n";
    os << "  tolerance " << fmt_num(r.tol.rel_l2) << ": " << r.tol.origin << "\n";
    if (findings) print_findings(os, *findings);
  } else if (!rep.stopped_early() && rep.matched > 0 && !rep.missing_fails() && rep.first_weight < 0) {
    os << "\nno divergence: every " << (rep.missing(true).empty() ? "" : "matched ") << "probe within its tolerance\n";
  }
  const auto miss = rep.missing(false), allowed = rep.missing(true);
  if (!miss.empty() || !allowed.empty()) {
    os << "\nMISSING: " << miss.size() + allowed.size() << " of " << rep.expected << " expected probes not compared"
       << (allowed.empty() ? "" : " (" + std::to_string(allowed.size()) + " allowed)") << " (expected: "
       << rep.expected_from << ")\n";
    for (const auto* list : {&miss, &allowed})
      for (const auto* r : *list) os << "  " << r->label() << ": " << r->why << "\n";
  }
  for (auto& n : rep.notes) os << "note: " << n << "\n";
  if (all_rows && !rep.weights.empty()) {
    char line[512];
    std::snprintf(line, sizeof line, "\n%-3s %-20s %-8s %10s %9s %9s %10s %10s  %s\n", "L", "weight", "basis", "rel_l2",
                  "cosine", "norm", "worst row", "tol", "verdict");
    os << line;
    for (size_t i = 0; i < rep.weights.size(); ++i) {
      const auto& r = rep.weights[i];
      std::snprintf(line, sizeof line, "%-3d %-20s %-8s %10s %9s %9s %10s %10s  %s%s\n", r.layer, r.name.c_str(),
                    r.m.basis.substr(0, 8).c_str(), fmt_num(r.m.rel_l2).c_str(), fmt_num(r.m.cosine, 5).c_str(),
                    fmt_num(r.m.norm_ratio, 4).c_str(), fmt_num(r.m.max_token_rel).c_str(), fmt_num(r.tol.rel_l2).c_str(),
                    verdict_name(r.verdict), static_cast<int>(i) == rep.first_weight ? "  <- first" : "");
      os << line;
      for (auto& p : r.problems) os << "      " << p << "\n";
    }
  }
  if (all_rows) {
    char line[512];
    std::snprintf(line, sizeof line, "\n%-3s %-12s %-8s %10s %9s %9s %10s %9s %10s  %s\n", "L", "probe", "basis",
                  "rel_l2", "cosine", "norm", "worst tok", "mismatch", "tol", "verdict");
    os << line;
    for (size_t i = 0; i < rep.results.size(); ++i) {
      const auto& r = rep.results[i];
      if (!r.matched()) {
        // Nothing was measured: no number may stand in for one.
        // (widths +2 for the dash's extra UTF-8 bytes)
        std::snprintf(line, sizeof line, "%-3d %-12s %-10s %12s %11s %11s %12s %11s %10s  %s\n", r.layer, r.name.c_str(),
                      "—", "—", "—", "—", "—", "—", fmt_num(r.tol.rel_l2).c_str(),
                      r.missing_allowed ? "missing (allowed)" : "MISSING");
        os << line;
        continue;
      }
      std::snprintf(line, sizeof line, "%-3d %-12s %-8s %10s %9s %9s %10s %9s %10s  %s%s\n", r.layer, r.name.c_str(),
                    r.m.basis.substr(0, 8).c_str(), fmt_num(r.m.rel_l2).c_str(), fmt_num(r.m.cosine, 5).c_str(),
                    fmt_num(r.m.norm_ratio, 4).c_str(), fmt_num(r.m.max_token_rel).c_str(),
                    r.m.basis == "full" ? fmt_num(r.m.mismatch, 2).c_str() : "-", fmt_num(r.tol.rel_l2).c_str(),
                    verdict_name(r.verdict), static_cast<int>(i) == rep.first_divergence ? "  <- first" : "");
      os << line;
      for (auto& p : r.problems) os << "      " << p << "\n";
    }
  }
  os << "\n" << rep.verdict_line() << "\n";
}

nlohmann::json findings_to_json(const Findings& f) {
  return {{"diagnosis", {{"pattern", f.diagnosis.pattern}, {"confidence", f.diagnosis.confidence},
                         {"fit", f.diagnosis.fit}, {"rule_pattern", f.diagnosis.rule_pattern}, {"evidence", f.diagnosis.evidence}}},
          {"drill_down", {{"ranks_off", f.drill.ranks_off}, {"heads_off", f.drill.heads_off},
                          {"tokens_off", f.drill.tokens_off}, {"channels", f.drill.channels}, {"lines", f.drill.lines}}}};
}

nlohmann::json metrics_to_json(const Metrics& m) {
  auto num = [](double v) -> nlohmann::json {
    if (std::isfinite(v)) return v;
    return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  };
  auto arr = [&](const std::vector<double>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (double x : v) a.push_back(num(x));
    return a;
  };
  nlohmann::json j{{"basis", m.basis},         {"rel_l2", num(m.rel_l2)},     {"cosine", num(m.cosine)},
                   {"nmse", num(m.nmse)},       {"norm_ratio", num(m.norm_ratio)}, {"max_abs", num(m.max_abs)},
                   {"max_abs_at", {{"layer", m.max_at.layer}, {"rank", m.max_at.rank}, {"token", m.max_at.token},
                                   {"head", m.max_at.head}, {"channel", m.max_at.channel}}},
                   {"a_at_max", num(m.a_at_max)}, {"b_at_max", num(m.b_at_max)}, {"mismatch", num(m.mismatch)},
                   {"nan", {m.nan_a, m.nan_b}},   {"inf", {m.inf_a, m.inf_b}},   {"nonfinite_agree", m.nonfinite_agree},
                   {"max_token_rel", num(m.max_token_rel)}, {"token_rel", arr(m.token_rel)},
                   {"head_rel", arr(m.head_rel)}, {"rank_rel", arr(m.rank_rel)}};
  if (m.rope_rel >= 0) j["rope_rel"] = num(m.rope_rel);
  if (m.nope_rel >= 0) j["nope_rel"] = num(m.nope_rel);
  if (!m.first_nonfinite.empty()) j["first_nonfinite"] = m.first_nonfinite;
  return j;
}

nlohmann::json compare_to_json(const CompareReport& rep, const Findings* findings) {
  nlohmann::json j;
  j["schema_version"] = kJsonSchemaVersion;
  const int code = rep.exit_code();
  j["verdict"] = code == ExitCode_ok ? "pass" : code == ExitCode_divergence ? "fail" : code == ExitCode_engine ? "stopped"
                                                                                                              : "nothing compared";
  j["verdict_line"] = rep.verdict_line();
  j["exit_code"] = code;
  j["candidate"] = {{"path", rep.a_path}, {"status", rep.a_status}};
  j["reference"] = {{"path", rep.b_path}, {"status", rep.b_status}};
  j["stopped_early"] = rep.stopped_early();
  j["expected"] = rep.expected;
  j["expected_from"] = rep.expected_from;
  j["matched"] = rep.matched;
  j["divergent"] = rep.divergent();
  nlohmann::json missing = nlohmann::json::array();
  for (const auto& r : rep.results)
    if (!r.matched())
      missing.push_back({{"layer", r.layer}, {"probe", r.name}, {"stage", r.stage}, {"reason", r.why},
                         {"allowed", r.missing_allowed}});
  j["missing"] = std::move(missing);
  j["notes"] = rep.notes;
  j["first_divergence"] = nullptr;
  nlohmann::json probes = nlohmann::json::array();
  for (size_t i = 0; i < rep.results.size(); ++i) {
    const auto& r = rep.results[i];
    nlohmann::json p{{"layer", r.layer},  {"probe", r.name},         {"stage", r.stage},
                     {"shape", r.shape},  {"verdict", verdict_name(r.verdict)}, {"why", r.why},
                     {"tolerance", {{"rel_l2", r.tol.rel_l2}, {"token_rel", r.tol.token_rel}, {"origin", r.tol.origin}}},
                     {"metrics", r.matched() ? metrics_to_json(r.m) : nlohmann::json(nullptr)}, {"problems", r.problems}};
    if (!r.matched()) p["missing_allowed"] = r.missing_allowed;
    if (r.selection)  // DSA's topk as sets of keys: metrics.rel_l2 is 1 − mean overlap, mismatch the tokens that differ
      p["selection"] = {{"pattern", selection_pattern_name(r.selection_pattern)},
                        {"near_tie_swaps", r.near_tie_swaps}};
    if (static_cast<int>(i) == rep.first_divergence) j["first_divergence"] = p;
    probes.push_back(std::move(p));
  }
  j["probes"] = std::move(probes);
  // The weights both dumps recorded (compared before the probes); [] when either recorded none.
  nlohmann::json weights = nlohmann::json::array();
  j["first_weight"] = nullptr;
  for (size_t i = 0; i < rep.weights.size(); ++i) {
    const auto& r = rep.weights[i];
    nlohmann::json w{{"layer", r.layer},
                     {"weight", r.name},
                     {"stage", r.stage},
                     {"contract", r.contract},
                     {"shape", r.shape},
                     {"verdict", verdict_name(r.verdict)},
                     {"why", r.why},
                     {"tolerance", {{"rel_l2", r.tol.rel_l2}, {"row_rel", r.tol.token_rel}, {"origin", r.tol.origin}}},
                     {"metrics", metrics_to_json(r.m)},
                     {"ranks_off", r.ranks_off},
                     {"pattern", r.pattern},
                     {"evidence", r.evidence},
                     {"problems", r.problems}};
    if (static_cast<int>(i) == rep.first_weight) j["first_weight"] = w;
    weights.push_back(std::move(w));
  }
  j["weights"] = std::move(weights);
  j["divergent_weights"] = rep.divergent_weights();
  if (findings) {
    const auto f = findings_to_json(*findings);
    j["diagnosis"] = f["diagnosis"];
    j["drill_down"] = f["drill_down"];
  }
  return j;
}

std::string compare_to_junit(const CompareReport& rep, const std::string& suite) {
  int failures = 0;
  for (auto& r : rep.results)
    failures += r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite ||
                (r.verdict == Verdict::Verdict_missing && !r.missing_allowed);
  failures += rep.divergent_weights();
  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\"" << xml_escape(suite)
     << "\" tests=\"" << rep.results.size() + rep.weights.size() << "\" failures=\"" << failures << "\" errors=\""
     << (rep.stopped_early() ? 1 : 0) << "\">\n";
  // The first divergence (and the first weight that differs) as suite properties, so CI can show it without parsing
  // failure messages.
  const ProbeResult* first = rep.first_divergence >= 0 ? &rep.results[rep.first_divergence] : nullptr;
  if (first || rep.first_weight >= 0) {
    os << "  <properties>\n";
    if (first)
      os << "    <property name=\"first_divergence\" value=\""
         << xml_escape("layer " + std::to_string(first->layer) + " " + first->name) << "\"/>\n"
         << "    <property name=\"first_divergence_stage\" value=\"" << xml_escape(first->stage) << "\"/>\n";
    if (rep.first_weight >= 0) {
      const ProbeResult& w = rep.weights[rep.first_weight];
      os << "    <property name=\"first_weight\" value=\""
         << xml_escape("layer " + std::to_string(w.layer) + " " + w.name) << "\"/>\n";
    }
    os << "  </properties>\n";
  }
  auto probe_case = [&](const ProbeResult& r) {
    os << "  <testcase classname=\"" << xml_escape(suite) << ".layer" << r.layer << "\" name=\"" << xml_escape(r.name)
       << "\">";
    if (r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite) {
      const std::string msg = (&r == first ? "first divergence: " : "") + r.why;
      os << "<failure message=\"" << xml_escape(msg) << "\">" << xml_escape(msg + "\ntolerance: " + r.tol.origin)
         << "</failure>";
    } else if (r.verdict == Verdict::Verdict_missing && r.missing_allowed) {
      os << "<skipped message=\"" << xml_escape("missing: " + r.why) << "\"/>";
    } else if (r.verdict == Verdict::Verdict_missing) {
      os << "<failure type=\"missing\" message=\"" << xml_escape("missing: " + r.why) << "\">"
         << xml_escape("missing: " + r.why + "\nexpected: " + rep.expected_from) << "</failure>";
    }
    os << "</testcase>\n";
  };
  // The first divergent probe is the first testcase, so the first failure a CI page lists is where the runs part;
  // the weights follow, then every other probe in (layer, graph order).
  if (first) probe_case(*first);
  for (auto& r : rep.weights) {
    os << "  <testcase classname=\"" << xml_escape(suite) << ".layer" << r.layer << ".weights\" name=\""
       << xml_escape(r.name) << "\">";
    if (r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite)
      os << "<failure type=\"weight\" message=\"" << xml_escape(weight_sentence(r)) << "\">"
         << xml_escape(r.why + "\npattern: " + r.pattern + "\ntolerance: " + r.tol.origin) << "</failure>";
    os << "</testcase>\n";
  }
  for (auto& r : rep.results)
    if (&r != first) probe_case(r);
  if (rep.stopped_early())
    os << "  <testcase classname=\"" << xml_escape(suite) << "\" name=\"run_complete\"><error message=\""
       << xml_escape("a dump stopped early: " + rep.a_status + " / " + rep.b_status) << "\"/></testcase>\n";
  os << "</testsuite>\n</testsuites>\n";
  return os.str();
}

}  // namespace mla
