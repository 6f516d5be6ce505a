// Terminal pictures of error maps: a heat map (rows x columns, e.g. token x head) and compact bar charts.
// Both use a log scale split at the tolerance, so "above tolerance" reads the same in every picture: ANSI
// 256-color background blocks on a terminal, the character ramp " .:-=+*#%@" elsewhere (logs, tests).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mla {

// An error grid, row-major; non-finite cells (NaN/Inf errors) are drawn as such.
struct HeatGrid {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;            // [rows, cols]
  std::string row_name = "token";   // axis names for the labels
  std::string col_name = "head";
};

struct HeatStyle {
  bool color = false;    // ANSI 256-color background blocks (a terminal); else the character ramp
  int width = 80;        // columns available, labels included
  int height = 40;       // rows of cells at most
  double threshold = 0;  // the tolerance: levels 0-4 are at or below it, 5-9 above
};

// The picture with axis labels and a legend; rows and columns beyond the space are merged (worst of a group).
std::string render_heatmap(const HeatGrid& g, const HeatStyle& s);

// Level 0..9 of a value on the log scale split at `threshold`, rising to `hi` (the largest value); -1: non-finite.
int heat_level(double v, double threshold, double hi);

struct Bar {
  std::string label;  // "head 3", "t 0-1"
  double value = 0;
  std::string note;   // printed after the value
};

// One line per bar: label, a log-scale bar with '|' at the threshold, the value, "off" above the threshold,
// the note. `unicode`: solid blocks instead of '#'.
std::string render_bars(const std::vector<Bar>& bars, double threshold, bool unicode, int width = 80);

// Merges `v` into at most `max_groups` runs of adjacent entries, keeping each run's maximum (non-finite wins);
// `starts` receives each run's first index.
std::vector<double> merge_max(const std::vector<double>& v, size_t max_groups, std::vector<int64_t>* starts);

}  // namespace mla
