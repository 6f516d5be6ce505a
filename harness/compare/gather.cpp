// Gathering a probe's shards to its global layout: concatenate head blocks, sum partials, check that replicas agree
// on the most their records carry (full data, else sketches, else stats).
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <string>

#include "harness/compare/compare.h"

namespace mla {

namespace {

// Equal as stored: the same bits, or both NaN (payloads aside).
bool same_value(float x, float y) {
  if (std::isnan(x) && std::isnan(y)) return true;
  uint32_t bx, by;
  std::memcpy(&bx, &x, 4);
  std::memcpy(&by, &y, 4);
  return bx == by;
}

std::string num_text(double v) {
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

// How two ranks' copies of a replicated probe differ, judged on the most both records carry: the full tensors
// (element by element), else the sketches, else the stats (l2, absmax, mean, std, NaN and Inf counts, per-token
// norms). Checksums count where both ranks carry one (0: the producer wrote none), never as agreement on their own.
struct ReplicaDiff {
  bool differs = false;
  std::string basis;   // "full data", "sketch", "stats", "checksum"
  std::string detail;  // how: count, largest difference and where
};

ReplicaDiff replica_diff(const ProbeRecord& x, const ProbeRecord& y, int64_t row) {
  ReplicaDiff d;
  row = std::max<int64_t>(row, 1);
  if (x.data.numel() > 0 && x.data.numel() == y.data.numel()) {
    d.basis = "full data";
    int64_t n = 0, first = -1, at = -1, nonfinite = 0;
    double worst = -1;
    for (int64_t i = 0; i < x.data.numel(); ++i) {
      const float a = x.data.data[i], b = y.data.data[i];
      if (same_value(a, b)) continue;
      ++n;
      if (first < 0) first = i;
      if (!std::isfinite(a) || !std::isfinite(b)) {
        ++nonfinite;
        continue;
      }
      const double diff = std::fabs(static_cast<double>(a) - b);
      if (diff > worst) worst = diff, at = i;
    }
    if (n > 0) {
      d.differs = true;
      const int64_t i = at >= 0 ? at : first;
      d.detail = std::to_string(n) + " of " + std::to_string(x.data.numel()) + " elements differ, max |difference| " +
                 (at >= 0 ? num_text(worst) : std::string("non-finite")) + " at token " + std::to_string(i / row) +
                 " column " + std::to_string(i % row) + " (" + num_text(y.data.data[i]) + " vs " +
                 num_text(x.data.data[i]) + ")" +
                 (nonfinite ? ", " + std::to_string(nonfinite) + " NaN/Inf at different places" : "");
      return d;
    }
  } else if (!x.sketch.empty() && x.sketch.size() == y.sketch.size()) {
    d.basis = "sketch";
    int64_t n = 0, at = -1;
    double worst = -1;
    for (size_t i = 0; i < x.sketch.size(); ++i) {
      if (same_value(x.sketch[i], y.sketch[i])) continue;
      ++n;
      const double diff = std::fabs(static_cast<double>(x.sketch[i]) - y.sketch[i]);
      if (at < 0 || diff > worst) worst = diff, at = static_cast<int64_t>(i);
    }
    if (n > 0) {
      d.differs = true;
      d.detail = std::to_string(n) + " of " + std::to_string(x.sketch.size()) + " sketch values differ, max |difference| " +
                 num_text(worst) + " at token " + std::to_string(at / kSketchDim);
      return d;
    }
  } else {
    d.basis = "stats";
    auto stat = [&](const char* what, double a, double b) {
      if (d.differs || (std::isnan(a) && std::isnan(b)) || a == b) return;
      d.differs = true;
      d.detail = std::string(what) + " " + num_text(b) + " vs " + num_text(a);
    };
    stat("l2", x.l2, y.l2);
    stat("absmax", x.absmax, y.absmax);
    stat("mean", x.mean, y.mean);
    stat("std", x.std, y.std);
    stat("NaN count", static_cast<double>(x.nan), static_cast<double>(y.nan));
    stat("Inf count", static_cast<double>(x.inf), static_cast<double>(y.inf));
    if (!d.differs && x.token_l2.size() == y.token_l2.size())
      for (size_t t = 0; t < x.token_l2.size() && !d.differs; ++t)
        if (!same_value(x.token_l2[t], y.token_l2[t]))
          stat(("token " + std::to_string(t) + " norm").c_str(), x.token_l2[t], y.token_l2[t]);
    if (d.differs) return d;
  }
  if (x.checksum != 0 && y.checksum != 0 && x.checksum != y.checksum) {
    d.differs = true;
    d.detail = "checksum " + std::to_string(y.checksum) + " vs " + std::to_string(x.checksum) + " (equal as " +
               d.basis + ")";
    d.basis = "checksum";
  }
  return d;
}

bool all_have(const DumpProbe& p, bool (*has)(const ProbeRecord&)) {
  if (p.ranks.empty()) return false;
  for (auto& r : p.ranks)
    if (!has(r)) return false;
  return true;
}
}  // namespace

Gathered gather(const DumpProbe& p) {
  Gathered g;
  g.shape = p.shape;
  g.tp = static_cast<int>(p.ranks.size());
  if (p.ranks.empty()) return g;
  const int64_t T = p.shape.empty() ? 1 : p.shape[0];
  const int64_t row = shape_numel(p.shape) / std::max<int64_t>(T, 1);
  const int tp = g.tp;
  // A columns-sharded weight gathers as heads do (each rank a block of every row); a rows-sharded one stacks its
  // ranks' rows.
  const bool heads = p.contract == "heads" || p.contract == "columns", partial = p.contract == "partial";
  const bool rows = p.contract == "rows";
  g.full = all_have(p, [](const ProbeRecord& r) { return r.data.numel() > 0; });
  g.sketch = all_have(p, [](const ProbeRecord& r) { return !r.sketch.empty(); });
  for (auto& r : p.ranks) {
    g.nan += r.nan;
    g.inf += r.inf;
  }
  if (rows) {
    const int64_t local_rows = T / std::max(tp, 1);
    double ss = 0;
    if (g.full) g.data = Tensor(p.shape);
    if (g.sketch) g.sketch_rows.assign(T * kSketchDim, 0.f);
    g.token_l2.assign(T, 0.f);
    for (int r = 0; r < tp; ++r) {
      const auto& rec = p.ranks[r];
      ss += rec.l2 * rec.l2;
      g.absmax = std::max(g.absmax, rec.absmax);
      const int64_t base = r * local_rows;
      if (g.full) {
        if (rec.data.numel() != local_rows * row) {
          g.problems.push_back("rank " + std::to_string(r) + " holds " + shape_string(rec.data.shape) +
                               ", expected its rows of " + shape_string(p.shape));
          g.full = false;
        } else {
          std::memcpy(g.data.ptr() + base * row, rec.data.ptr(), sizeof(float) * local_rows * row);
        }
      }
      if (g.sketch && static_cast<int64_t>(rec.sketch.size()) == local_rows * kSketchDim)
        std::copy(rec.sketch.begin(), rec.sketch.end(), g.sketch_rows.begin() + base * kSketchDim);
      for (int64_t t = 0; t < local_rows && t < static_cast<int64_t>(rec.token_l2.size()); ++t)
        g.token_l2[base + t] = rec.token_l2[t];
    }
    if (!g.full) g.data = Tensor();
    g.l2 = std::sqrt(ss);
    return g;
  }
  if (!heads && !partial) {
    // Replicated: the ranks must agree bit for bit. Ranks that agree form a group; the largest group's copy speaks
    // for all (its lowest rank), so a rank that differs is the one named, rank 0 included.
    std::vector<int> group(tp, -1), leaders;
    std::vector<int> size;
    for (int r = 0; r < tp; ++r) {
      for (size_t k = 0; k < leaders.size() && group[r] < 0; ++k)
        if (!replica_diff(p.ranks[leaders[k]], p.ranks[r], row).differs) group[r] = static_cast<int>(k);
      if (group[r] < 0) {
        group[r] = static_cast<int>(leaders.size());
        leaders.push_back(r);
        size.push_back(0);
      }
      ++size[group[r]];
    }
    // Ties (no majority, e.g. tp 2): the copy with fewer NaN/Inf speaks (a non-finite copy is the likelier bad one).
    const auto bad = [&](int r) { return p.ranks[r].nan + p.ranks[r].inf; };
    int speaker = leaders[0];
    for (size_t k = 1; k < leaders.size(); ++k) {
      const int r = leaders[k];
      const int v = size[k], vs = size[group[speaker]];
      if (v > vs || (v == vs && bad(r) < bad(speaker))) speaker = r;
    }
    const auto& r0 = p.ranks[speaker];
    const bool majority = 2 * size[group[speaker]] > tp;
    g.nan = r0.nan;
    g.inf = r0.inf;
    for (int r = 0; r < tp; ++r) {
      if (group[r] == group[speaker]) continue;
      const ReplicaDiff d = replica_diff(r0, p.ranks[r], row);
      const auto& pr = p.ranks[r];
      g.problems.push_back(
          "replicated probe differs on rank " + std::to_string(r) + " (" + d.basis + " vs rank " +
          std::to_string(speaker) + ": " + d.detail +
          (pr.nan || pr.inf
               ? "; NaN " + std::to_string(pr.nan) + ", Inf " + std::to_string(pr.inf) + " on rank " + std::to_string(r) +
                     " vs " + std::to_string(r0.nan) + ", " + std::to_string(r0.inf)
               : "") +
          (majority ? "" : "; no majority: either may be wrong") + ")");
    }
    g.l2 = r0.l2;
    g.absmax = r0.absmax;
    g.token_l2 = r0.token_l2;
    g.head_l2 = r0.head_l2;
    if (g.full) g.data = r0.data;
    if (g.sketch) g.sketch_rows = r0.sketch;
    return g;
  }
  if (g.sketch) {  // linear projection: shard sketches add up to the global sketch (heads and partials alike)
    g.sketch_rows.assign(p.ranks[0].sketch.size(), 0.f);
    for (auto& r : p.ranks)
      for (size_t i = 0; i < r.sketch.size() && i < g.sketch_rows.size(); ++i) g.sketch_rows[i] += r.sketch[i];
  }
  if (g.full) {
    g.data = Tensor(p.shape);
    const int64_t local_row = row / tp;
    for (int r = 0; r < tp; ++r) {
      const auto& d = p.ranks[r].data;
      if (d.numel() != (heads ? T * local_row : T * row)) {
        g.problems.push_back("rank " + std::to_string(r) + " holds " + shape_string(d.shape) + ", expected its part of " +
                             shape_string(p.shape));
        g.full = false;
        break;
      }
      for (int64_t t = 0; t < T; ++t) {
        if (heads) {
          std::memcpy(g.data.ptr() + t * row + r * local_row, d.ptr() + t * local_row, sizeof(float) * local_row);
        } else {
          for (int64_t c = 0; c < row; ++c) g.data.data[t * row + c] += d.data[t * row + c];
        }
      }
    }
  }
  if (heads) {
    double ss = 0;
    for (auto& r : p.ranks) {
      ss += r.l2 * r.l2;
      g.absmax = std::max(g.absmax, r.absmax);
    }
    g.l2 = std::sqrt(ss);
    g.token_l2.assign(T, 0.f);
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (auto& r : p.ranks)
        if (t < static_cast<int64_t>(r.token_l2.size())) s += static_cast<double>(r.token_l2[t]) * r.token_l2[t];
      g.token_l2[t] = static_cast<float>(std::sqrt(s));
    }
    const int64_t Nl = p.ranks[0].head_l2.size() / std::max<int64_t>(T, 1);
    if (Nl > 0) {
      g.head_l2.assign(T * Nl * tp, 0.f);
      for (int64_t t = 0; t < T; ++t)
        for (int r = 0; r < tp; ++r)
          for (int64_t h = 0; h < Nl && static_cast<size_t>(t * Nl + h) < p.ranks[r].head_l2.size(); ++h)
            g.head_l2[t * Nl * tp + r * Nl + h] = p.ranks[r].head_l2[t * Nl + h];
    }
  } else if (g.full) {  // partial: norms of the sum come from the summed tensor
    double ss = 0;
    g.token_l2.assign(T, 0.f);
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t c = 0; c < row; ++c) {
        const double v = g.data.data[t * row + c];
        if (std::isfinite(v)) g.absmax = std::max(g.absmax, std::fabs(v));
        s += v * v;
      }
      g.token_l2[t] = static_cast<float>(std::sqrt(s));
      ss += s;
    }
    g.l2 = std::sqrt(ss);
  } else {
    g.l2 = -1;  // unknown: the norm of a sum is not a function of the parts' norms
  }
  return g;
}

}  // namespace mla
