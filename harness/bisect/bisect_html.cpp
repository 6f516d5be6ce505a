// HTML rendering with inline SVG and CSS only (no scripts, no external files): one file to mail or attach to a CI run.
#include "harness/bisect/bisect_html.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "harness/report/compare_report.h"
#include "probes/dump.h"

namespace mla {

namespace {

// The bug classes re-run on the introducing stage: each variant's worst residual against its tolerance as a bar on a
// log axis (1 = the tolerance; confirmed ones within it), the confirmed first, then the closest.
void hypotheses_html(std::ostream& os, const hyp::Report& h) {
  if (h.reason.empty()) return;
  os << "<h2>Causes tested: bug classes re-run on stage " << xml_escape(h.stage) << "</h2>\n<p>" << xml_escape(h.reason);
  if (h.searched) os << " (" << fmt_num(h.seconds, 2) << " s)";
  os << "</p>\n";
  if (!h.searched) return;
  os << "<p>" << (h.confirmed.empty() ? "No class reproduces the candidate within tolerance: the diagnosis above is an "
                                        "unconfirmed pattern."
                                      : "Confirmed: " + xml_escape(h.sentence()))
     << "</p>\n<table><tr><th>class</th><th>variant</th><th>residual / tolerance (log scale; the line is 1)</th>"
        "<th></th></tr>\n";
  const double lo = std::log10(0.01), hi = std::log10(1e4);
  for (size_t i = 0; i < h.tried.size() && i < 15; ++i) {
    const auto& t = h.tried[i];
    const double w = std::isfinite(t.worst) ? std::clamp((std::log10(std::max(t.worst, 0.01)) - lo) / (hi - lo), 0.0, 1.0) : 1.0;
    const double one = (0 - lo) / (hi - lo);
    os << "<tr><td><code>" << xml_escape(t.cls) << "</code></td><td>" << xml_escape(t.phrase)
       << "</td><td><svg width='240' height='12'><rect width='" << static_cast<int>(240 * w) << "' height='12' fill='"
       << (t.confirmed ? "#2a7" : "#c64") << "'/><line x1='" << static_cast<int>(240 * one) << "' x2='"
       << static_cast<int>(240 * one) << "' y1='0' y2='12' stroke='black'/></svg></td><td>"
       << (t.confirmed ? "confirmed" : t.pretest_only ? fmt_num(t.worst, 3) + "x (pre-test)" : fmt_num(t.worst, 3) + "x")
       << "</td></tr>\n";
  }
  os << "</table>\n";
}


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

// A log10 axis over whole decades: from a decade below the smallest positive finite value (or the tolerance, when
// lower) to the decade above the largest (or the tolerance), at most 12 decades deep. Values at or below the floor,
// zeros included, are drawn at the floor.
struct LogAxis {
  int lo = -6, hi = 0;  // decades: the floor is 10^lo, the top 10^hi
  double floor() const { return std::pow(10.0, lo); }
  // 0 at the floor, 1 at the top.
  double frac(double v) const {
    return std::clamp((std::log10(std::max(v, floor())) - lo) / static_cast<double>(hi - lo), 0.0, 1.0);
  }
};

LogAxis log_axis(const std::vector<double>& values, double tol) {
  double mn = INFINITY, mx = 0;
  for (double v : values)
    if (std::isfinite(v) && v > 0) {
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
  if (std::isfinite(tol) && tol > 0) {
    mn = std::min(mn, tol);
    mx = std::max(mx, tol);
  }
  LogAxis a;
  if (mx <= 0) return a;  // nothing positive to place: the default decades
  a.hi = static_cast<int>(std::ceil(std::log10(mx)));
  a.lo = static_cast<int>(std::floor(std::log10(mn))) - 1;
  if (a.hi <= a.lo) a.hi = a.lo + 1;
  a.lo = std::max(a.lo, a.hi - 12);
  return a;
}

// Relative error per token on a log axis with the tolerance line at its value. Zeros (and values below the floor)
// are drawn as a grey stub on the floor, NaN/Inf as full bars in the NaN colour; a note under the chart counts both.
void token_svg(std::ostream& os, const Metrics& m, double tol) {
  const int T = static_cast<int>(m.token_rel.size());
  if (T == 0) return;
  const LogAxis ax = log_axis(m.token_rel, tol);
  const int W = std::max(400, std::min(1200, 8 * T)), H = 180, left = 50, top = 10, bottom = 20;
  const double ph = H - top - bottom, base = H - bottom;
  auto y_of = [&](double v) { return top + ph * (1.0 - ax.frac(v)); };
  const double bw = static_cast<double>(W) / T;
  os << "<svg class='token-chart' data-y-scale='log' width='" << W + left << "' height='" << H
     << "' font-size='10' font-family='monospace'>\n";
  const int step = ax.hi - ax.lo > 8 ? 2 : 1;  // the floor always labelled
  for (int e = ax.lo; e <= ax.hi; e += step) {
    const double y = y_of(std::pow(10.0, e));
    os << "<line class='decade' x1='" << left << "' x2='" << W + left << "' y1='" << y << "' y2='" << y
       << "' stroke='#ddd'/><text x='2' y='" << y + 3 << "'>1e" << e << "</text>\n";
  }
  int zeros = 0, nonfinite = 0;
  for (int t = 0; t < T; ++t) {
    const double v = m.token_rel[t];
    os << "<rect x='" << left + t * bw << "' width='" << std::max(1.0, bw - 1);
    if (!std::isfinite(v)) {
      ++nonfinite;
      os << "' y='" << top << "' height='" << ph << "' fill='" << color_for(NAN) << "'><title>token " << t
         << ": NaN/Inf</title></rect>\n";
    } else if (v <= ax.floor()) {
      ++zeros;
      os << "' y='" << base - 2 << "' height='2' fill='#999'><title>token " << t << ": " << fmt_num(v)
         << " (drawn at the floor, 1e" << ax.lo << ")</title></rect>\n";
    } else {
      const double y = y_of(v);
      os << "' y='" << y << "' height='" << std::max(1.0, base - y) << "' fill='" << color_for(v / std::max(tol, 1e-30))
         << "'><title>token " << t << ": " << fmt_num(v) << "</title></rect>\n";
    }
  }
  const double ty = y_of(tol);
  os << "<line class='tolerance' x1='" << left << "' x2='" << W + left << "' y1='" << ty << "' y2='" << ty
     << "' stroke='#c00'/><text x='" << left + 4 << "' y='" << ty - 3 << "' fill='#c00'>tolerance " << fmt_num(tol)
     << "</text><text x='" << left << "' y='" << H - 5 << "'>token 0</text><text x='" << W + left - 60 << "' y='"
     << H - 5 << "'>token " << T - 1 << "</text></svg>\n";
  os << "<p class='axis-note'><small>rel error per token, log scale (1e" << ax.lo << " .. 1e" << ax.hi
     << "); the red line is the per-token tolerance";
  if (zeros)
    os << "; " << zeros << " token" << (zeros == 1 ? "" : "s") << " with zero error (or below 1e" << ax.lo
       << ") drawn at the floor in grey";
  if (nonfinite) os << "; " << nonfinite << " token" << (nonfinite == 1 ? "" : "s") << " NaN/Inf drawn full height";
  os << "</small></p>\n";
}

// A probe's per-token error as a small inline chart for the probe table: log scale over the probe's own values and
// tolerance (the red dashed line), zeros on the floor, NaN/Inf as purple ticks.
void sparkline_svg(std::ostream& os, const std::vector<double>& v, double tol) {
  const int T = static_cast<int>(v.size());
  if (T == 0) {
    os << "&mdash;";
    return;
  }
  const LogAxis ax = log_axis(v, tol);
  const double W = 120, H = 20, pad = 1;
  auto x_of = [&](int t) { return T == 1 ? W / 2 : pad + (W - 2 * pad) * t / (T - 1); };
  auto y_of = [&](double e) { return pad + (H - 2 * pad) * (1.0 - ax.frac(e)); };
  os << "<svg class='spark' width='" << W << "' height='" << H << "'><title>per-token rel error, log scale 1e" << ax.lo
     << " .. 1e" << ax.hi << "; tolerance " << fmt_num(tol) << "</title>";
  if (std::isfinite(tol) && tol > 0)
    os << "<line x1='0' x2='" << W << "' y1='" << y_of(tol) << "' y2='" << y_of(tol)
       << "' stroke='#c00' stroke-dasharray='2,2'/>";
  std::string pts;
  for (int t = 0; t < T; ++t) {
    if (!std::isfinite(v[t])) {
      os << "<line x1='" << x_of(t) << "' x2='" << x_of(t) << "' y1='0' y2='" << H << "' stroke='" << color_for(NAN)
         << "'/>";
      continue;
    }
    pts += fmt_num(x_of(t), 5) + "," + fmt_num(y_of(v[t]), 4) + " ";
  }
  if (T == 1 && !pts.empty())
    os << "<circle cx='" << x_of(0) << "' cy='" << y_of(v[0]) << "' r='2' fill='#333'/>";
  else if (!pts.empty())
    os << "<polyline points='" << pts << "' fill='none' stroke='#333' stroke-width='1'/>";
  os << "</svg>";
}

// The weights both dumps recorded, compared before any activation: one row each, the diagnosis of one that differs.
void weights_table(std::ostream& os, const CompareReport& rep) {
  if (rep.weights.empty()) return;
  const int off = rep.divergent_weights();
  os << "<h2>Weights (" << rep.weights.size() << " compared, " << off << " beyond tolerance)</h2>\n"
     << "<table class='weights'><tr><th>layer</th><th>weight</th><th>contract</th><th>rel_l2</th><th>tolerance</th>"
        "<th>verdict</th><th>diagnosis</th></tr>\n";
  for (const auto& w : rep.weights) {
    const bool bad = w.verdict == Verdict::Verdict_diverge || w.verdict == Verdict::Verdict_nonfinite;
    os << "<tr" << (bad ? " class='bad'" : "") << "><td>" << w.layer << "</td><td>" << xml_escape(w.name)
       << "</td><td>" << xml_escape(w.contract) << "</td><td>" << fmt_num(w.m.rel_l2) << "</td><td>"
       << fmt_num(w.tol.rel_l2) << "</td><td>" << verdict_name(w.verdict) << "</td><td style='text-align:left'>";
    if (!w.pattern.empty()) os << "<b>" << xml_escape(w.pattern) << "</b>";
    else if (bad) os << xml_escape(w.why);
    if (!w.ranks_off.empty()) {
      os << "<br><small>ranks off:";
      for (int r : w.ranks_off) os << " " << r;
      os << "</small>";
    }
    for (size_t i = 0; i < w.evidence.size() && i < 6; ++i)
      os << "<br><small>" << xml_escape(w.evidence[i]) << "</small>";
    os << "</td></tr>\n";
  }
  os << "</table>\n";
}

// Token x head cells; ticks on both axes, rank boundaries (tp > 1: a heads probe's shards) as dark lines.
void heatmap_svg(std::ostream& os, const Metrics& m, double tol, int tp) {
  const int64_t T = static_cast<int64_t>(m.token_rel.size());
  if (T == 0 || m.token_head_rel.empty()) return;
  const int64_t N = static_cast<int64_t>(m.token_head_rel.size()) / T;
  const double cw = std::clamp(900.0 / N, 3.0, 24.0), ch = std::clamp(500.0 / T, 2.0, 16.0);
  const int left = 60, top = tp > 1 ? 34 : 20, bottom = 30;
  const double W = left + cw * N + 10, H = top + ch * T + bottom;
  os << "<svg class='heat' width='" << W << "' height='" << H << "' font-size='10' font-family='monospace'>\n";
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h) {
      const double v = m.token_head_rel[t * N + h];
      os << "<rect x='" << left + h * cw << "' y='" << top + t * ch << "' width='" << cw << "' height='" << ch
         << "' fill='" << color_for(v / tol) << "'><title>token " << t << " head " << h;
      if (tp > 1) os << " (rank " << h / std::max<int64_t>(1, N / tp) << ")";
      os << ": " << fmt_num(v) << "</title></rect>";
    }
  os << "\n";
  // Head ticks: about 16 along the axis, on round steps.
  int64_t hs = 1;
  while (N / hs > 16) hs *= (hs == 1 || hs % 10 == 0 || hs % 10 == 5) ? 2 : (hs % 10 == 2 ? 5 : 2);
  for (int64_t h = 0; h < N; h += hs) {
    const double x = left + (h + 0.5) * cw;
    os << "<line class='tick' x1='" << x << "' x2='" << x << "' y1='" << top + ch * T << "' y2='" << top + ch * T + 4
       << "' stroke='#333'/><text x='" << x << "' y='" << top + ch * T + 14 << "' text-anchor='middle'>" << h
       << "</text>";
  }
  os << "<text x='" << left + cw * N / 2 << "' y='" << H - 2 << "' text-anchor='middle'>head</text>\n";
  int64_t ts = 1;
  while (T / ts > 24) ts *= 2;
  for (int64_t t = 0; t < T; t += ts)
    os << "<text x='" << left - 4 << "' y='" << top + (t + 0.5) * ch + 3 << "' text-anchor='end'>" << t << "</text>";
  os << "<text x='2' y='" << top - 6 << "'>token</text>\n";
  if (tp > 1 && N % tp == 0) {
    const int64_t per = N / tp;
    for (int k = 0; k < tp; ++k) {
      const double x = left + k * per * cw;
      if (k > 0)
        os << "<line class='rank-boundary' x1='" << x << "' x2='" << x << "' y1='" << top - 12 << "' y2='"
           << top + ch * T << "' stroke='#000' stroke-width='2'/>";
      os << "<text x='" << x + per * cw / 2 << "' y='" << top - 4 << "' text-anchor='middle'>rank " << k << "</text>";
    }
    os << "\n";
  }
  os << "</svg>\n";
}

// The colour scale: error / tolerance on a log scale, with the tolerance marked, and the NaN/Inf colour.
void legend_svg(std::ostream& os) {
  const int left = 10, w = 400, top = 6, h = 14;
  os << "<div class='legend'><svg width='" << left + w + 150 << "' height='44' font-size='10' font-family='monospace'>";
  const int steps = 80;
  for (int i = 0; i < steps; ++i) {
    const double e = -2.0 + 4.0 * (i + 0.5) / steps;  // log10(error / tolerance)
    os << "<rect x='" << left + i * w / static_cast<double>(steps) << "' y='" << top << "' width='"
       << w / static_cast<double>(steps) + 0.5 << "' height='" << h << "' fill='" << color_for(std::pow(10.0, e)) << "'/>";
  }
  const char* labels[] = {"0.01x", "0.1x", "1x tolerance", "10x", "100x"};
  for (int e = -2; e <= 2; ++e) {
    const double x = left + w * (e + 2) / 4.0;
    os << "<line x1='" << x << "' x2='" << x << "' y1='" << top << "' y2='" << top + h + 4 << "' stroke='"
       << (e == 0 ? "#c00" : "#333") << "'/><text x='" << x << "' y='" << top + h + 14 << "' text-anchor='"
       << (e == -2 ? "start" : e == 2 ? "end" : "middle") << "'" << (e == 0 ? " fill='#c00'" : "") << ">"
       << labels[e + 2] << "</text>";
  }
  os << "<rect x='" << left + w + 20 << "' y='" << top << "' width='14' height='" << h << "' fill='" << color_for(NAN)
     << "'/><text x='" << left + w + 38 << "' y='" << top + 11 << "'>NaN/Inf</text></svg>"
     << "<br><small>colour = error / tolerance, log scale: green within tolerance, yellow at it, red beyond "
        "(clipped below 0.01x and above 100x)</small></div>\n";
}

// Candidate and reference values on one axis: reference as filled bars, candidate as an outline on top.
void histogram_svg(std::ostream& os, const ValueHistogram& h) {
  const int n = static_cast<int>(h.candidate.size());
  if (n == 0) return;
  const int left = 60, W = 720, H = 220, top = 10, bottom = 40;
  int64_t mx = 1;
  for (int i = 0; i < n; ++i) mx = std::max({mx, h.candidate[i], h.reference[i]});
  const double bw = static_cast<double>(W) / n;
  auto y_of = [&](int64_t c) { return top + (H - top - bottom) * (1.0 - static_cast<double>(c) / mx); };
  os << "<svg class='hist' width='" << left + W + 20 << "' height='" << H + 20
     << "' font-size='10' font-family='monospace'>\n";
  for (int i = 0; i < n; ++i) {
    const double lo = h.lo + (h.hi - h.lo) * i / n, hi = h.lo + (h.hi - h.lo) * (i + 1) / n;
    os << "<rect x='" << left + i * bw << "' y='" << y_of(h.reference[i]) << "' width='" << std::max(1.0, bw - 1)
       << "' height='" << H - bottom - y_of(h.reference[i]) << "' fill='#8ab4e8'><title>[" << fmt_num(lo, 4) << ", "
       << fmt_num(hi, 4) << "): reference " << h.reference[i] << ", candidate " << h.candidate[i]
       << "</title></rect>";
  }
  std::string path;
  for (int i = 0; i < n; ++i) {
    const double y = y_of(h.candidate[i]);
    path += (i ? " L" : "M") + fmt_num(left + i * bw, 6) + " " + fmt_num(y, 6) + " L" + fmt_num(left + (i + 1) * bw, 6) +
            " " + fmt_num(y, 6);
  }
  os << "\n<path d='" << path << "' fill='none' stroke='#c0392b' stroke-width='2'/>\n";
  os << "<line x1='" << left << "' x2='" << left + W << "' y1='" << H - bottom << "' y2='" << H - bottom
     << "' stroke='#333'/><line x1='" << left << "' x2='" << left << "' y1='" << top << "' y2='" << H - bottom
     << "' stroke='#333'/>";
  for (int k = 0; k <= 4; ++k) {
    const double x = left + W * k / 4.0;
    os << "<line x1='" << x << "' x2='" << x << "' y1='" << H - bottom << "' y2='" << H - bottom + 4
       << "' stroke='#333'/><text x='" << x << "' y='" << H - bottom + 15 << "' text-anchor='middle'>"
       << fmt_num(h.lo + (h.hi - h.lo) * k / 4.0, 3) << "</text>";
  }
  os << "<text x='" << left + W / 2 << "' y='" << H - bottom + 30 << "' text-anchor='middle'>value</text>"
     << "<text x='" << left - 4 << "' y='" << top + 8 << "' text-anchor='end'>" << mx << "</text><text x='"
     << left - 4 << "' y='" << H - bottom << "' text-anchor='end'>0</text>"
     << "<rect x='" << left + W - 190 << "' y='" << top << "' width='12' height='10' fill='#8ab4e8'/><text x='"
     << left + W - 174 << "' y='" << top + 9 << "'>reference</text><line x1='" << left + W - 100 << "' x2='"
     << left + W - 86 << "' y1='" << top + 5 << "' y2='" << top + 5 << "' stroke='#c0392b' stroke-width='2'/><text x='"
     << left + W - 82 << "' y='" << top + 9 << "'>candidate</text></svg>\n";
  if (h.candidate_nonfinite || h.reference_nonfinite)
    os << "<p>non-finite values (not drawn): candidate " << h.candidate_nonfinite << ", reference "
       << h.reference_nonfinite << "</p>\n";
}

// The dumps' own record of how they were made (meta only: no probes, no tensors).
std::optional<Dump> dump_meta(const std::string& path, std::string* why) {
  if (path.empty()) return std::nullopt;
  try {
    DumpReadOptions o;
    o.inputs = o.probes = o.data = false;
    return read_dump(path, o);
  } catch (const std::exception& e) {
    *why += path + ": " + e.what() + "; ";
    return std::nullopt;
  }
}

void provenance_table(std::ostream& os, const BisectReport& r) {
  std::string why;
  const auto cand = dump_meta(r.candidate_dump, &why), ref = dump_meta(r.reference_dump, &why);
  os << "<h2>Provenance</h2>\n";
  if (!cand && !ref) {
    os << "<p>the dumps' records could not be read: " << xml_escape(why.empty() ? "no dump paths in the report" : why)
       << "</p>\n";
    return;
  }
  const auto opt = [](const Dump& d, const char* key) -> std::string {
    const auto& ro = d.meta.run_options;
    if (!ro.is_object() || !ro.contains(key)) return "";
    const auto& v = ro[key];
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  using F = std::string (*)(const Dump&);
  static const std::vector<std::pair<std::string, F>> rows = {
      {"model", [](const Dump& d) -> std::string {
         return d.meta.model.is_object() ? d.meta.model.value("name", d.meta.model.value("model_type", std::string("?")))
                                         : std::string("?");
       }},
      {"engine", [](const Dump& d) { return d.meta.engine + (d.meta.engine_options.empty() ? "" : ":" + d.meta.engine_options); }},
      {"inject", [](const Dump& d) { return d.meta.inject.empty() ? std::string("none") : d.meta.inject; }},
      {"mode", [](const Dump& d) { return d.meta.mode; }},
      {"tp", [](const Dump& d) { return std::to_string(d.meta.tp); }},
      {"input seed", [](const Dump& d) { return std::to_string(d.meta.seed); }},
      {"probe level", [](const Dump& d) { return d.meta.probe_level; }},
      {"device", [](const Dump& d) { return d.meta.device; }},
      {"tool version", [](const Dump& d) { return d.tool_version + (d.git_sha.empty() ? "" : " (" + d.git_sha + ")"); }},
      {"created (UTC)", [](const Dump& d) { return d.created_utc; }},
      {"status", [](const Dump& d) { return d.status; }},
  };
  os << "<table class='prov'><tr><th></th><th>candidate</th><th>reference</th></tr>\n";
  auto cell = [&](const std::optional<Dump>& d, const std::string& v) {
    os << "<td>" << (d ? xml_escape(v) : std::string("&mdash;")) << "</td>";
  };
  for (auto& [name, get] : rows) {
    os << "<tr><th>" << name << "</th>";
    cell(cand, cand ? get(*cand) : "");
    cell(ref, ref ? get(*ref) : "");
    os << "</tr>\n";
  }
  for (const char* key : {"tokens", "batch", "weight_seed", "weights", "layers"}) {
    os << "<tr><th>" << (std::string(key) == "weight_seed" ? "weight seed" : key) << "</th>";
    cell(cand, cand ? opt(*cand, key) : "");
    cell(ref, ref ? opt(*ref, key) : "");
    os << "</tr>\n";
  }
  os << "</table>\n<p>commands:</p><pre class='cmd'>";
  if (cand) os << "candidate: " << xml_escape(cand->meta.command) << "\n";
  if (ref) os << "reference: " << xml_escape(ref->meta.command) << "\n";
  os << "</pre>\n";
  if (!why.empty()) os << "<p>not read: " << xml_escape(why) << "</p>\n";
  os << "<p><small>report written by mla-bisect " << MLA_VERSION << "</small></p>\n";
}

// The first divergence's values: the report's own (full tensors recomputed in process), else the dumps' when both
// hold the probe in full.
ValueHistogram first_values(const BisectReport& r, std::string* why) {
  if (!r.first_values.empty()) return r.first_values;
  const auto& f = *r.first;
  try {
    const Dump a = read_dump(r.candidate_dump), b = read_dump(r.reference_dump);
    const DumpProbe *pa = a.find(f.layer, f.name), *pb = b.find(f.layer, f.name);
    if (pa && pb) {
      const Gathered ga = gather(*pa), gb = gather(*pb);
      if (ga.full && gb.full) {
        ValueHistogram h = value_histogram(ga.data.data, gb.data.data);
        h.probe = "layer " + std::to_string(f.layer) + " " + f.name;
        h.source = "full tensors in the dumps";
        return h;
      }
    }
    *why = "the dumps hold no full tensors of " + f.name + " (run with --full-probes " + f.name +
           " or --probe-level full to have them)";
  } catch (const std::exception& e) {
    *why = std::string("the dumps could not be read: ") + e.what();
  }
  return {};
}

}  // namespace

std::string bisect_to_html(const BisectReport& r) {
  std::ostringstream os;
  os << "<!doctype html><html><head><meta charset='utf-8'><title>mla-bisect: " << xml_escape(r.headline)
     << "</title><style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}"
        "td,th{padding:2px 8px;text-align:right;font-family:monospace}th{background:#eee}"
        ".bad{background:#fdd}.verdict{font-size:1.3em}pre{background:#f6f6f6;padding:8px;white-space:pre-wrap}"
        "table.prov th{text-align:left}table.prov td{text-align:left}.est{color:#a05a00}</style></head><body>\n";
  os << "<h1>mla-bisect</h1><p class='verdict'><b>" << xml_escape(r.headline) << "</b></p>\n<p>candidate <code>"
     << xml_escape(r.candidate_engine) << "</code>" << (r.inject.empty() ? "" : " with <code>--inject " + xml_escape(r.inject) + "</code>")
     << "; dumps <code>" << xml_escape(r.reference_dump) << "</code>, <code>" << xml_escape(r.candidate_dump) << "</code></p>\n";
  if (!r.crash.empty()) os << "<h2>The candidate did not finish</h2><pre>" << xml_escape(r.crash) << "</pre>\n";
  const bool have_full = !r.full.basis.empty();
  if (r.first) {
    const auto& f = *r.first;
    os << "<h2>Diagnosis (" << xml_escape(diagnosis_label(r.diagnosis))
       << (have_full ? ", on full tensors recomputed in process" : f.m.basis == "full" ? "" : ", on estimates from sketches/norms")
       << ")</h2><p>"
       << xml_escape(r.diagnosis.pattern) << "</p><ul>";
    const bool exact = f.m.basis == "full" || f.m.basis == "sets";  // sets: DSA's topk, from its full indices
    for (auto& e : r.diagnosis.evidence) os << "<li>" << xml_escape(e) << "</li>";
    os << "</ul><p>where: layer " << f.layer << ", probe <b>" << xml_escape(f.name) << "</b>, stage " << xml_escape(f.stage)
       << "<br>error: " << xml_escape(f.why)
       << (exact ? "" : " <span class='est'>[estimate (from sketches/norms)]</span>");
    if (!exact && have_full)
      os << "<br>on full tensors (recomputed in process): rel_l2 " << fmt_num(r.full.rel_l2) << ", worst token "
         << fmt_num(r.full.max_token_rel) << " &mdash; the drill-down, diagnosis and pictures below use these";
    os << "<br>tolerance: " << xml_escape(f.tol.origin) << "<br>isolation: "
       << xml_escape(r.isolation) << "</p>\n<pre>";
    for (auto& l : r.drill.lines) os << xml_escape(l) << "\n";
    os << "</pre>\n";
    hypotheses_html(os, r.hypotheses);
    const Metrics& m = r.full.basis.empty() ? f.m : r.full;
    const std::string basis = m.basis == "full" ? "full tensors" : "estimate (from sketches/norms)";
    os << "<h2>Error per token of " << xml_escape(f.name) << " (rel error, log scale, " << basis << ")</h2>\n";
    token_svg(os, m, f.tol.token_rel);
    legend_svg(os);
    if (!m.token_head_rel.empty()) {
      const int tp = f.contract == "heads" && m.rank_rel.size() > 1 ? static_cast<int>(m.rank_rel.size()) : 1;
      os << "<h2>Token &times; head heat map of " << xml_escape(f.name) << " (error / tolerance, " << basis
         << ")</h2>\n";
      heatmap_svg(os, m, f.tol.rel_l2, tp);
    }
    std::string why;
    const ValueHistogram h = first_values(r, &why);
    os << "<h2>Values of " << xml_escape(f.name) << ": candidate vs reference</h2>\n";
    if (h.empty()) {
      os << "<p class='hist-missing'>no histogram: " << xml_escape(why) << "</p>\n";
    } else {
      os << "<p>" << xml_escape(h.probe) << ", " << xml_escape(h.source) << "; " << h.candidate.size()
         << " bins over [" << fmt_num(h.lo, 4) << ", " << fmt_num(h.hi, 4) << "]</p>\n";
      histogram_svg(os, h);
    }
  }
  os << "<p><b>" << xml_escape(r.compare.verdict_line()) << "</b></p>\n";
  legend_svg(os);
  os << "<h2>Error across the graph (rel_l2 / tolerance, log scale)</h2>\n";
  profile_svg(os, r.compare);
  weights_table(os, r.compare);
  os << "<h2>Probes</h2><table class='probes'><tr><th>layer</th><th>probe</th><th>basis</th><th>rel_l2</th>"
        "<th>cosine</th><th>norm ratio</th><th>worst token</th><th>per token (log)</th><th>tolerance</th>"
        "<th>verdict</th><th>tolerance origin</th></tr>\n";
  for (auto& p : r.compare.results) {
    if (!p.matched()) {  // nothing measured: no number stands in for one
      os << "<tr" << (p.missing_allowed ? "" : " class='bad'") << "><td>" << p.layer << "</td><td>" << xml_escape(p.name)
         << "</td><td>&mdash;</td><td>&mdash;</td><td>&mdash;</td><td>&mdash;</td><td>&mdash;</td><td>&mdash;</td><td>"
         << fmt_num(p.tol.rel_l2) << "</td><td>" << (p.missing_allowed ? "missing (allowed)" : "MISSING")
         << "</td><td style='text-align:left'>" << xml_escape(p.why) << "</td></tr>\n";
      continue;
    }
    const bool bad = p.verdict == Verdict::Verdict_diverge || p.verdict == Verdict::Verdict_nonfinite;
    os << "<tr" << (bad ? " class='bad'" : "") << "><td>" << p.layer << "</td><td>" << xml_escape(p.name) << "</td><td>"
       << xml_escape(p.m.basis == "sketch" ? "sketch (estimate)" : p.m.basis) << "</td><td>" << fmt_num(p.m.rel_l2) << "</td><td>" << fmt_num(p.m.cosine, 5)
       << "</td><td>" << fmt_num(p.m.norm_ratio, 4) << "</td><td>" << fmt_num(p.m.max_token_rel) << "</td><td>";
    sparkline_svg(os, p.m.token_rel, p.tol.token_rel);
    os << "</td><td>" << fmt_num(p.tol.rel_l2) << "</td><td>" << verdict_name(p.verdict)
       << "</td><td style='text-align:left'>" << xml_escape(p.tol.origin) << "</td></tr>\n";
  }
  os << "</table>\n";
  provenance_table(os, r);
  os << "</body></html>\n";
  return os.str();
}

}  // namespace mla
