// HTML rendering with inline SVG.
#include "harness/report/html.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness/report/compare_report.h"

namespace mla {

namespace {

// Error relative to tolerance on a log scale: green below 1, through yellow, to red at 100x.
std::string color_for(double ratio) {
  if (!std::isfinite(ratio)) return "#7b2cbf";
  const double x = std::clamp((std::log10(std::max(ratio, 1e-3)) + 2.0) / 4.0, 0.0, 1.0);  // 0.01x .. 100x
  int r, g, b;
  if (x < 0.5) {  // green -> yellow up to the tolerance
    r = static_cast<int>(60 + 390 * x);
    g = 170;
    b = 80;
  } else {  // yellow -> red beyond it
    r = 230;
    g = static_cast<int>(170 - 300 * (x - 0.5));
    b = 60;
  }
  std::ostringstream os;
  os << "rgb(" << std::clamp(r, 0, 255) << "," << std::clamp(g, 0, 255) << "," << b << ")";
  return os.str();
}

void profile_svg(std::ostream& os, const CompareReport& rep) {
  const int n = static_cast<int>(rep.results.size());
  if (n == 0) return;
  const int W = std::max(600, 28 * n), H = 220, top = 10, bottom = 70, left = 50;
  auto y_of = [&](double ratio) {
    const double v = std::clamp(std::log10(std::max(ratio, 1e-4)), -4.0, 4.0);
    return top + (H - top - bottom) * (4.0 - v) / 8.0;
  };
  os << "<svg width='" << W + left << "' height='" << H << "' font-size='10' font-family='monospace'>\n";
  for (int e = -4; e <= 4; e += 2) {
    const double y = y_of(std::pow(10.0, e));
    os << "<line x1='" << left << "' x2='" << W + left << "' y1='" << y << "' y2='" << y
       << "' stroke='" << (e == 0 ? "#c00" : "#ddd") << "'/><text x='2' y='" << y + 3 << "'>1e" << e << "</text>\n";
  }
  os << "<text x='" << left + 4 << "' y='" << y_of(1.0) - 4 << "' fill='#c00'>tolerance</text>\n";
  const double step = static_cast<double>(W) / n;
  for (int i = 0; i < n; ++i) {
    const auto& r = rep.results[i];
    const double ratio = r.m.rel_l2 / std::max(r.tol.rel_l2, 1e-30);
    const double x = left + step * (i + 0.5), y = y_of(ratio);
    if (!r.matched())  // no bar: nothing was measured
      os << "<text x='" << x - 3 << "' y='" << H - bottom - 4 << "' fill='#c00'>&#8709;<title>layer " << r.layer << " "
         << xml_escape(r.name) << ": missing (" << xml_escape(r.why) << ")</title></text>\n";
    else
      os << "<rect x='" << x - step * 0.35 << "' y='" << y << "' width='" << step * 0.7 << "' height='"
         << std::max(1.0, H - bottom - y) << "' fill='" << color_for(ratio) << "'><title>layer " << r.layer << " "
         << xml_escape(r.name) << ": rel_l2 " << fmt_num(r.m.rel_l2) << " / tol " << fmt_num(r.tol.rel_l2)
         << "</title></rect>\n";
    os << "<text transform='translate(" << x + 3 << "," << H - bottom + 6 << ") rotate(60)'>"
       << (r.layer ? "L" + std::to_string(r.layer) + " " : "") << xml_escape(r.name) << "</text>\n";
  }
  os << "</svg>\n";
}

void token_svg(std::ostream& os, const Metrics& m, double tol) {
  const int T = static_cast<int>(m.token_rel.size());
  if (T == 0) return;
  const int W = std::max(400, std::min(1200, 8 * T)), H = 160, left = 50, bottom = 20;
  double mx = tol * 2;
  for (double v : m.token_rel)
    if (std::isfinite(v)) mx = std::max(mx, v);
  const double bw = static_cast<double>(W) / T;
  os << "<svg width='" << W + left << "' height='" << H << "' font-size='10' font-family='monospace'>\n";
  const double ty = (H - bottom) * (1 - tol / mx);
  for (int t = 0; t < T; ++t) {
    const double v = std::isfinite(m.token_rel[t]) ? m.token_rel[t] : mx;
    const double h = (H - bottom) * v / mx;
    os << "<rect x='" << left + t * bw << "' y='" << H - bottom - h << "' width='" << std::max(1.0, bw - 1)
       << "' height='" << h << "' fill='" << color_for(v / tol) << "'><title>token " << t << ": "
       << fmt_num(m.token_rel[t]) << "</title></rect>\n";
  }
  os << "<line x1='" << left << "' x2='" << W + left << "' y1='" << ty << "' y2='" << ty << "' stroke='#c00'/>"
     << "<text x='2' y='" << ty + 3 << "' fill='#c00'>tol</text><text x='2' y='10'>" << fmt_num(mx) << "</text>"
     << "<text x='" << left << "' y='" << H - 5 << "'>token 0</text><text x='" << W + left - 60 << "' y='" << H - 5
     << "'>token " << T - 1 << "</text></svg>\n";
}

void heatmap_svg(std::ostream& os, const Metrics& m, double tol) {
  const int64_t T = static_cast<int64_t>(m.token_rel.size());
  if (T == 0 || m.token_head_rel.empty()) return;
  const int64_t N = static_cast<int64_t>(m.token_head_rel.size()) / T;
  const double cw = std::clamp(900.0 / N, 3.0, 24.0), ch = std::clamp(500.0 / T, 2.0, 16.0);
  const int left = 60, top = 20;
  os << "<svg width='" << left + cw * N + 10 << "' height='" << top + ch * T + 10
     << "' font-size='10' font-family='monospace'><text x='" << left << "' y='12'>heads 0.." << N - 1
     << " &#8594;</text><text x='2' y='" << top + 10 << "'>token 0</text><text x='2' y='" << top + ch * T
     << "'>token " << T - 1 << "</text>\n";
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h) {
      const double v = m.token_head_rel[t * N + h];
      os << "<rect x='" << left + h * cw << "' y='" << top + t * ch << "' width='" << cw << "' height='" << ch
         << "' fill='" << color_for(v / tol) << "'><title>token " << t << " head " << h << ": " << fmt_num(v)
         << "</title></rect>";
    }
  os << "\n</svg>\n";
}

}  // namespace

std::string bisect_to_html(const BisectReport& r) {
  std::ostringstream os;
  os << "<!doctype html><html><head><meta charset='utf-8'><title>mla-bisect: " << xml_escape(r.headline)
     << "</title><style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}"
        "td,th{padding:2px 8px;text-align:right;font-family:monospace}th{background:#eee}"
        ".bad{background:#fdd}.verdict{font-size:1.3em}pre{background:#f6f6f6;padding:8px}</style></head><body>\n";
  os << "<h1>mla-bisect</h1><p class='verdict'><b>" << xml_escape(r.headline) << "</b></p>\n<p>candidate <code>"
     << xml_escape(r.candidate_engine) << "</code>" << (r.inject.empty() ? "" : " with <code>--inject " + xml_escape(r.inject) + "</code>")
     << "; dumps <code>" << xml_escape(r.reference_dump) << "</code>, <code>" << xml_escape(r.candidate_dump) << "</code></p>\n";
  if (!r.crash.empty()) os << "<h2>The candidate did not finish</h2><pre>" << xml_escape(r.crash) << "</pre>\n";
  if (r.first) {
    const auto& f = *r.first;
    os << "<h2>Diagnosis (" << xml_escape(r.diagnosis.confidence) << " confidence)</h2><p>"
       << xml_escape(r.diagnosis.pattern) << "</p><ul>";
    for (auto& e : r.diagnosis.evidence) os << "<li>" << xml_escape(e) << "</li>";
    os << "</ul><p>where: layer " << f.layer << ", probe <b>" << xml_escape(f.name) << "</b>, stage " << xml_escape(f.stage)
       << "<br>error: " << xml_escape(f.why) << "<br>tolerance: " << xml_escape(f.tol.origin) << "<br>isolation: "
       << xml_escape(r.isolation) << "</p>\n<pre>";
    for (auto& l : r.drill.lines) os << xml_escape(l) << "\n";
    os << "</pre>\n";
    const Metrics& m = r.full.basis.empty() ? f.m : r.full;
    os << "<h2>Error per token of " << xml_escape(f.name) << "</h2>\n";
    token_svg(os, m, f.tol.token_rel);
    if (!m.token_head_rel.empty()) {
      os << "<h2>Token &times; head heat map of " << xml_escape(f.name) << " (error / tolerance)</h2>\n";
      heatmap_svg(os, m, f.tol.rel_l2);
    }
  }
  os << "<p><b>" << xml_escape(r.compare.verdict_line()) << "</b></p>\n";
  os << "<h2>Error across the graph (rel_l2 / tolerance, log scale)</h2>\n";
  profile_svg(os, r.compare);
  os << "<h2>Probes</h2><table><tr><th>layer</th><th>probe</th><th>basis</th><th>rel_l2</th><th>cosine</th>"
        "<th>norm ratio</th><th>worst token</th><th>tolerance</th><th>verdict</th><th>tolerance origin</th></tr>\n";
  for (auto& p : r.compare.results) {
    if (!p.matched()) {  // nothing measured: no number stands in for one
      os << "<tr" << (p.missing_allowed ? "" : " class='bad'") << "><td>" << p.layer << "</td><td>" << xml_escape(p.name)
         << "</td><td>&mdash;</td><td>&mdash;</td><td>&mdash;</td><td>&mdash;</td><td>&mdash;</td><td>"
         << fmt_num(p.tol.rel_l2) << "</td><td>" << (p.missing_allowed ? "missing (allowed)" : "MISSING")
         << "</td><td style='text-align:left'>" << xml_escape(p.why) << "</td></tr>\n";
      continue;
    }
    const bool bad = p.verdict == Verdict::Verdict_diverge || p.verdict == Verdict::Verdict_nonfinite;
    os << "<tr" << (bad ? " class='bad'" : "") << "><td>" << p.layer << "</td><td>" << xml_escape(p.name) << "</td><td>"
       << xml_escape(p.m.basis) << "</td><td>" << fmt_num(p.m.rel_l2) << "</td><td>" << fmt_num(p.m.cosine, 5)
       << "</td><td>" << fmt_num(p.m.norm_ratio, 4) << "</td><td>" << fmt_num(p.m.max_token_rel) << "</td><td>"
       << fmt_num(p.tol.rel_l2) << "</td><td>" << verdict_name(p.verdict) << "</td><td style='text-align:left'>"
       << xml_escape(p.tol.origin) << "</td></tr>\n";
  }
  os << "</table></body></html>\n";
  return os.str();
}

}  // namespace mla
