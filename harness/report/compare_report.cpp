// Terminal, JSON and JUnit renderings of a comparison.
#include "harness/report/compare_report.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "harness/model/errors.h"

namespace mla {

std::string fmt_num(double v, int precision) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

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

void print_compare(std::ostream& os, const CompareReport& rep, bool all_rows) {
  os << "candidate " << rep.a_path << " (" << rep.a_status << ")\nreference " << rep.b_path << " (" << rep.b_status
     << ")\n";
  if (rep.first_divergence >= 0) {
    const auto& r = rep.results[rep.first_divergence];
    os << "\nFIRST DIVERGENCE: layer " << r.layer << " probe " << r.name << " (stage " << r.stage << "): " << r.why << "\n";
    if (r.m.basis == "full")
      os << "  worst element " << fmt_num(r.m.a_at_max, 6) << " vs " << fmt_num(r.m.b_at_max, 6) << " at "
         << r.m.max_at.to_string() << "\n";
    os << "  tolerance " << fmt_num(r.tol.rel_l2) << ": " << r.tol.origin << "\n";
  } else {
    os << "\nno divergence: every probe within its tolerance\n";
  }
  for (auto& n : rep.notes) os << "note: " << n << "\n";
  if (!all_rows) return;
  char line[512];
  std::snprintf(line, sizeof line, "\n%-3s %-12s %-8s %10s %9s %9s %10s %9s %10s  %s\n", "L", "probe", "basis", "rel_l2",
                "cosine", "norm", "worst tok", "mismatch", "tol", "verdict");
  os << line;
  for (size_t i = 0; i < rep.results.size(); ++i) {
    const auto& r = rep.results[i];
    std::snprintf(line, sizeof line, "%-3d %-12s %-8s %10s %9s %9s %10s %9s %10s  %s%s\n", r.layer, r.name.c_str(),
                  r.m.basis.substr(0, 8).c_str(), fmt_num(r.m.rel_l2).c_str(), fmt_num(r.m.cosine, 5).c_str(),
                  fmt_num(r.m.norm_ratio, 4).c_str(), fmt_num(r.m.max_token_rel).c_str(),
                  r.m.basis == "full" ? fmt_num(r.m.mismatch, 2).c_str() : "-", fmt_num(r.tol.rel_l2).c_str(),
                  verdict_name(r.verdict), static_cast<int>(i) == rep.first_divergence ? "  <- first" : "");
    os << line;
    for (auto& p : r.problems) os << "      " << p << "\n";
  }
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

nlohmann::json compare_to_json(const CompareReport& rep) {
  nlohmann::json j;
  j["candidate"] = {{"path", rep.a_path}, {"status", rep.a_status}};
  j["reference"] = {{"path", rep.b_path}, {"status", rep.b_status}};
  j["notes"] = rep.notes;
  j["first_divergence"] = nullptr;
  nlohmann::json probes = nlohmann::json::array();
  for (size_t i = 0; i < rep.results.size(); ++i) {
    const auto& r = rep.results[i];
    nlohmann::json p{{"layer", r.layer},  {"probe", r.name},         {"stage", r.stage},
                     {"shape", r.shape},  {"verdict", verdict_name(r.verdict)}, {"why", r.why},
                     {"tolerance", {{"rel_l2", r.tol.rel_l2}, {"token_rel", r.tol.token_rel}, {"origin", r.tol.origin}}},
                     {"metrics", metrics_to_json(r.m)}, {"problems", r.problems}};
    if (static_cast<int>(i) == rep.first_divergence) j["first_divergence"] = p;
    probes.push_back(std::move(p));
  }
  j["probes"] = std::move(probes);
  return j;
}

std::string compare_to_junit(const CompareReport& rep, const std::string& suite) {
  int failures = 0;
  for (auto& r : rep.results)
    failures += r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite;
  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\"" << xml_escape(suite)
     << "\" tests=\"" << rep.results.size() << "\" failures=\"" << failures << "\" errors=\""
     << (rep.stopped_early() ? 1 : 0) << "\">\n";
  for (auto& r : rep.results) {
    os << "  <testcase classname=\"" << xml_escape(suite) << ".layer" << r.layer << "\" name=\"" << xml_escape(r.name)
       << "\">";
    if (r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite)
      os << "<failure message=\"" << xml_escape(r.why) << "\">" << xml_escape(r.why + "\ntolerance: " + r.tol.origin)
         << "</failure>";
    else if (r.verdict == Verdict::Verdict_missing)
      os << "<skipped message=\"" << xml_escape(r.why) << "\"/>";
    os << "</testcase>\n";
  }
  if (rep.stopped_early())
    os << "  <testcase classname=\"" << xml_escape(suite) << "\" name=\"run_complete\"><error message=\""
       << xml_escape("a dump stopped early: " + rep.a_status + " / " + rep.b_status) << "\"/></testcase>\n";
  os << "</testsuite>\n</testsuites>\n";
  return os.str();
}

}  // namespace mla
