// Gathering a probe's shards to its global layout: concatenate head blocks, sum partials, check replicas.
#include <cmath>
#include <cstring>
#include <map>

#include "harness/compare/compare.h"

namespace mla {

namespace {
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
  const bool heads = p.contract == "heads", partial = p.contract == "partial";
  g.full = all_have(p, [](const ProbeRecord& r) { return r.data.numel() > 0; });
  g.sketch = all_have(p, [](const ProbeRecord& r) { return !r.sketch.empty(); });
  for (auto& r : p.ranks) {
    g.nan += r.nan;
    g.inf += r.inf;
  }
  if (!heads && !partial) {
    // Replicated: the ranks must agree bit for bit. The copy most ranks hold speaks for all (the lowest such rank),
    // so a rank that differs is the one named, rank 0 included.
    std::map<uint64_t, int> votes;
    for (auto& r : p.ranks) ++votes[r.checksum];
    // Ties (no majority, e.g. tp 2): the copy with fewer NaN/Inf speaks (a non-finite copy is the likelier bad one).
    int speaker = 0;
    const auto bad = [&](int r) { return p.ranks[r].nan + p.ranks[r].inf; };
    for (int r = 1; r < tp; ++r) {
      const int v = votes[p.ranks[r].checksum], vs = votes[p.ranks[speaker].checksum];
      if (v > vs || (v == vs && bad(r) < bad(speaker))) speaker = r;
    }
    const auto& r0 = p.ranks[speaker];
    const bool majority = 2 * votes[r0.checksum] > tp;
    g.nan = r0.nan;
    g.inf = r0.inf;
    for (int r = 0; r < tp; ++r)
      if (p.ranks[r].checksum != r0.checksum)
        g.problems.push_back(
            "replicated probe differs on rank " + std::to_string(r) + " (checksum " + std::to_string(p.ranks[r].checksum) +
            " vs rank " + std::to_string(speaker) + " " + std::to_string(r0.checksum) +
            (p.ranks[r].nan || p.ranks[r].inf
                 ? "; NaN " + std::to_string(p.ranks[r].nan) + ", Inf " + std::to_string(p.ranks[r].inf) + " on rank " +
                       std::to_string(r) + " vs " + std::to_string(r0.nan) + ", " + std::to_string(r0.inf)
                 : "") +
            (majority ? "" : "; no majority: either may be wrong") + ")");
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
