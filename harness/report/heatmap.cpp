// Heat maps and bar charts for the terminal. The scale is logarithmic and split at the tolerance: an error a
// thousand times below it and one just under it must look different, and so must one just over it and one
// a thousand times over; what matters first is which side of the tolerance a cell is on.
#include "harness/report/heatmap.h"

#include <algorithm>
#include <cmath>

#include "harness/report/compare_report.h"

namespace mla {

namespace {

constexpr const char* kRamp = " .:-=+*#%@";
// 256-color backgrounds per level: greys and greens at or below the tolerance, yellow to red above it.
constexpr int kColors[10] = {234, 236, 239, 22, 28, 226, 220, 214, 202, 196};
constexpr int kNonFiniteColor = 201;  // magenta
constexpr const char* kReset = "\x1b[0m";

double floor_of(double threshold) { return threshold > 0 ? threshold : 1e-12; }

std::string color_cell(int level, int width) {
  const int c = level < 0 ? kNonFiniteColor : kColors[level];
  return "\x1b[48;5;" + std::to_string(c) + "m" + std::string(width, ' ') + kReset;
}

std::string ramp_cell(int level, int width) { return std::string(width, level < 0 ? '!' : kRamp[level]); }

double finite_max(const std::vector<double>& v) {
  double hi = 0;
  for (double x : v)
    if (std::isfinite(x)) hi = std::max(hi, x);
  return hi;
}

// Worst of a and b, where a non-finite error is the worst of all.
double worse(double a, double b) {
  if (!std::isfinite(a)) return a;
  if (!std::isfinite(b)) return b;
  return std::max(a, b);
}

std::string range_label(int64_t first, int64_t last) {
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

}  // namespace

int heat_level(double v, double threshold, double hi) {
  if (!std::isfinite(v)) return -1;
  const double thr = floor_of(threshold), lo = thr / 100;
  if (v <= lo) return 0;
  if (v <= thr) return 1 + std::min(3, static_cast<int>(4 * std::log(v / lo) / std::log(thr / lo)));
  const double top = std::max(hi, thr * 10);
  return 5 + std::min(4, static_cast<int>(5 * std::log(v / thr) / std::log(top / thr)));
}

std::vector<double> merge_max(const std::vector<double>& v, size_t max_groups, std::vector<int64_t>* starts) {
  const size_t n = v.size();
  const size_t g = n <= max_groups || max_groups == 0 ? 1 : (n + max_groups - 1) / max_groups;
  std::vector<double> out;
  if (starts) starts->clear();
  for (size_t i = 0; i < n; i += g) {
    double w = v[i];
    for (size_t j = i + 1; j < std::min(n, i + g); ++j) w = worse(w, v[j]);
    out.push_back(w);
    if (starts) starts->push_back(static_cast<int64_t>(i));
  }
  return out;
}

std::string render_heatmap(const HeatGrid& g, const HeatStyle& s) {
  if (g.rows <= 0 || g.cols <= 0) return "(empty map)\n";
  const double hi = finite_max(g.v);
  // Rows: merge runs of rows (worst of each run) to fit the height.
  const int64_t row_group = (g.rows + s.height - 1) / std::max(1, s.height);
  std::vector<int64_t> row_start;
  for (int64_t r = 0; r < g.rows; r += std::max<int64_t>(1, row_group)) row_start.push_back(r);
  std::vector<std::string> row_labels;
  for (size_t i = 0; i < row_start.size(); ++i) {
    const int64_t last = i + 1 < row_start.size() ? row_start[i + 1] - 1 : g.rows - 1;
    row_labels.push_back(range_label(row_start[i], last));
  }
  size_t label_w = g.row_name.size();
  for (auto& l : row_labels) label_w = std::max(label_w, l.size());
  label_w += 1;
  // Columns: up to 3 characters per cell when there is room, merged runs (worst shown) when there is not.
  const int avail = std::max(8, s.width - static_cast<int>(label_w) - 1);
  const int64_t col_group = (g.cols + avail - 1) / avail;
  const int64_t shown_cols = (g.cols + col_group - 1) / col_group;
  const int cw = static_cast<int>(std::clamp<int64_t>(avail / shown_cols, 1, 3));

  std::string out;
  // Axis labels: the column axis name, then the first index of a column wherever it fits.
  out += std::string(label_w, ' ') + g.col_name + (s.color ? " \u2192\n" : " ->\n");
  std::string ticks(static_cast<size_t>(shown_cols * cw), ' ');
  size_t next_free = 0;
  for (int64_t j = 0; j < shown_cols; ++j) {
    const std::string t = std::to_string(j * col_group);
    const size_t pos = static_cast<size_t>(j * cw);
    if (pos < next_free) continue;
    if (pos + t.size() > ticks.size()) ticks.resize(pos + t.size(), ' ');
    ticks.replace(pos, t.size(), t);
    next_free = pos + t.size() + 1;
  }
  std::string head = g.row_name;
  head.resize(label_w, ' ');
  while (!ticks.empty() && ticks.back() == ' ') ticks.pop_back();
  out += head + ticks + "\n";
  for (size_t i = 0; i < row_start.size(); ++i) {
    const int64_t r0 = row_start[i], r1 = i + 1 < row_start.size() ? row_start[i + 1] : g.rows;
    std::string line(label_w - 1 - row_labels[i].size(), ' ');
    line += row_labels[i] + " ";
    for (int64_t j = 0; j < shown_cols; ++j) {
      double w = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = j * col_group; c < std::min(g.cols, (j + 1) * col_group); ++c) w = worse(w, g.v[r * g.cols + c]);
      const int level = heat_level(w, s.threshold, hi);
      line += s.color ? color_cell(level, cw) : ramp_cell(level, cw);
    }
    out += line + "\n";
  }
  if (row_group > 1 || col_group > 1)
    out += "(merged: each row up to " + std::to_string(row_group) + " " + g.row_name + "s, each column up to " +
           std::to_string(col_group) + " " + g.col_name + "s; the worst is shown)\n";
  // Legend.
  const double thr = floor_of(s.threshold);
  auto sample = [&](int level) {
    if (s.color) return color_cell(level, 2);
    std::string q(1, '\'');
    q += ramp_cell(level, 1);
    q += '\'';
    return q;
  };
  std::string legend = "scale: " + sample(0) + " <= " + fmt_num(thr / 100, 2) + "  ";
  for (int l = 1; l <= 4; ++l) legend += sample(l) + " ";
  legend += "<= " + fmt_num(thr, 2) + " (tolerance) <  ";
  for (int l = 5; l <= 9; ++l) legend += sample(l) + " ";
  legend += "<= " + fmt_num(std::max(hi, thr * 10), 2) + "  " + sample(-1) + " NaN/Inf\n";
  out += legend;
  return out;
}

std::string render_bars(const std::vector<Bar>& bars, double threshold, bool unicode, int width) {
  if (bars.empty()) return "(nothing to draw)\n";
  size_t label_w = 0;
  std::vector<double> values;
  for (auto& b : bars) {
    label_w = std::max(label_w, b.label.size());
    values.push_back(b.value);
  }
  const double thr = floor_of(threshold), lo = thr / 100, hi = std::max(finite_max(values), thr * 10);
  const int bw = std::clamp(width - static_cast<int>(label_w) - 24, 10, 40);
  auto pos = [&](double v) {
    if (!(v > lo)) return 0;
    return std::clamp(static_cast<int>(std::lround(bw * std::log(v / lo) / std::log(hi / lo))), 0, bw);
  };
  const int mark = pos(thr);
  const std::string fill = unicode ? "\u2588" : "#";
  std::string out;
  for (auto& b : bars) {
    std::string line = "  " + b.label + std::string(label_w - b.label.size(), ' ') + "  ";
    const bool finite = std::isfinite(b.value);
    const int n = finite ? pos(b.value) : bw;
    for (int i = 0; i < bw; ++i) {
      if (i == mark) line += "|";
      else if (!finite) line += "!";
      else line += i < n ? fill : " ";
    }
    std::string v = fmt_num(b.value, 3);
    line += "  " + std::string(v.size() < 9 ? 9 - v.size() : 0, ' ') + v;
    line += b.value > threshold || !finite ? "  off" : "     ";
    if (!b.note.empty()) line += "  " + b.note;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  out += "  (log scale " + fmt_num(lo, 2) + " .. " + fmt_num(hi, 2) + "; | = tolerance " + fmt_num(threshold, 3) + ")\n";
  return out;
}

}  // namespace mla
