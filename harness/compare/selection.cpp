// DSA's selections compared as sets per query token: harness/compare/selection.h.
#include "harness/compare/selection.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "core/model/errors.h"

namespace mla {

const char* selection_pattern_name(SelectionPattern p) {
  switch (p) {
    case SelectionPattern::SelectionPattern_none: return "none";
    case SelectionPattern::SelectionPattern_future: return "future keys";
    case SelectionPattern::SelectionPattern_shifted: return "shifted";
    case SelectionPattern::SelectionPattern_recent: return "newest keys missing";
    case SelectionPattern::SelectionPattern_count: return "set size";
    case SelectionPattern::SelectionPattern_scattered: return "scattered";
  }
  return "?";
}

std::string selection_pattern_meaning(SelectionPattern p, int shift) {
  switch (p) {
    case SelectionPattern::SelectionPattern_future:
      return "it selects keys its query cannot see: a causal leak in the index scores";
    case SelectionPattern::SelectionPattern_shifted:
      return std::string("every differing key is the reference's moved by ") + (shift > 0 ? "+" : "") +
             std::to_string(shift) + ": an off-by-one in the selected indices or the gather";
    case SelectionPattern::SelectionPattern_recent:
      return "the missing keys are the newest each query sees: a causal offset in the scores' mask";
    case SelectionPattern::SelectionPattern_count:
      return "it selects a different number of keys: top-k off by one";
    case SelectionPattern::SelectionPattern_scattered:
      return "the differences follow no index pattern: the index scores differ (indexer q/k, rope, norm, weights)";
    case SelectionPattern::SelectionPattern_none: break;
  }
  return "";
}

namespace {
std::string key_list(const std::vector<int>& keys) {
  std::ostringstream os;
  const size_t n = std::min<size_t>(keys.size(), 6);
  for (size_t i = 0; i < n; ++i) os << (i ? ", " : "") << keys[i];
  if (keys.size() > n) os << ", ...";
  return os.str();
}
}  // namespace

std::string SelectionDiff::explain() const {
  std::ostringstream os;
  if (!diverges()) {
    os << "all " << tokens << " tokens select the reference's keys";
    if (near_tie_swaps > 0) os << " (" << near_tie_swaps << " swaps between keys whose scores tie)";
    return os.str();
  }
  os << differing << " of " << tokens << " tokens select other keys than the reference (mean overlap "
     << std::lround(mean_overlap * 100) << "%); first token " << first_token << " (" << first_size
     << " keys in the reference) lacks " << first_missing.size();
  if (!first_missing.empty()) os << " (" << key_list(first_missing) << ")";
  os << " and adds " << first_extra.size();
  if (!first_extra.empty()) os << " (" << key_list(first_extra) << ")";
  if (pattern != SelectionPattern::SelectionPattern_none) os << "; " << selection_pattern_meaning(pattern, shift);
  return os.str();
}

SelectionDiff compare_selection(const std::vector<std::vector<int>>& ref, const std::vector<std::vector<int>>& cand,
                                const Tensor& ref_scores, double tie_tol) {
  return compare_selection(ref, cand, ref_scores, std::vector<double>(ref.size(), tie_tol));
}

SelectionDiff compare_selection(const std::vector<std::vector<int>>& ref, const std::vector<std::vector<int>>& cand,
                                const Tensor& ref_scores, const std::vector<double>& tie_tol) {
  if (tie_tol.size() != ref.size())
    throw UsageError("selection: " + std::to_string(tie_tol.size()) + " near-tie bounds for " +
                     std::to_string(ref.size()) + " tokens");
  if (ref.size() != cand.size())
    throw UsageError("selection: the reference selects for " + std::to_string(ref.size()) +
                     " tokens, the candidate for " + std::to_string(cand.size()));
  const int64_t T = static_cast<int64_t>(ref.size());
  if (ref_scores.rank() != 2 || ref_scores.dim(0) != T)
    throw UsageError("selection: index scores of shape " + shape_string(ref_scores.shape) + " for " +
                     std::to_string(T) + " tokens");
  const int64_t K = ref_scores.dim(1);
  SelectionDiff d;
  d.tokens = T;
  double overlap = 0;
  // Evidence for the pattern over the differing tokens.
  bool any_future = false, any_count = false, all_recent = true, any_missing = false;
  std::set<int> shifts;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = ref_scores.ptr() + t * K;
    const auto visible = [&](int s) { return s >= 0 && s < K && std::isfinite(row[s]); };
    const std::set<int> r(ref[t].begin(), ref[t].end()), c(cand[t].begin(), cand[t].end());
    std::vector<int> missing, extra;
    for (int s : r)
      if (!c.count(s)) missing.push_back(s);
    for (int s : c)
      if (!r.count(s)) extra.push_back(s);
    overlap += r.empty() ? 1.0 : static_cast<double>(r.size() - missing.size()) / static_cast<double>(r.size());
    if (missing.empty() && extra.empty()) continue;
    // Near ties: same count, every swapped key visible and within tie_tol of the reference's last selected score.
    float last = INFINITY;
    for (int s : r)
      if (visible(s)) last = std::min(last, row[s]);
    const auto near = [&](int s) { return visible(s) && std::fabs(row[s] - last) <= tie_tol[t]; };
    if (missing.size() == extra.size() && std::all_of(missing.begin(), missing.end(), near) &&
        std::all_of(extra.begin(), extra.end(), near)) {
      d.near_tie_swaps += static_cast<int64_t>(extra.size());
      d.swapped_tokens.push_back(t);
      continue;
    }
    if (d.differing++ == 0) {
      d.first_token = t;
      d.first_size = static_cast<int64_t>(r.size());
      d.first_missing = missing;
      d.first_extra = extra;
    }
    for (int s : extra) any_future = any_future || !visible(s);
    any_count = any_count || r.size() != c.size();
    // Newest missing: the candidate lacks exactly the newest keys the query sees.
    int newest = -1;
    for (int s = static_cast<int>(K) - 1; s >= 0 && newest < 0; --s)
      if (visible(s)) newest = s;
    any_missing = any_missing || !missing.empty();
    std::vector<int> sorted_missing = missing;
    std::sort(sorted_missing.rbegin(), sorted_missing.rend());
    for (size_t i = 0; i < sorted_missing.size(); ++i)
      all_recent = all_recent && sorted_missing[i] == newest - static_cast<int>(i);
    // Shift: the candidate's set is the reference's moved by one offset.
    if (r.size() == c.size() && !r.empty()) {
      const int off = *c.begin() - *r.begin();
      bool same = off != 0;
      for (auto a = r.begin(), b = c.begin(); same && a != r.end(); ++a, ++b) same = *b - *a == off;
      shifts.insert(same ? off : 0);
    } else {
      shifts.insert(0);
    }
  }
  d.mean_overlap = T > 0 ? overlap / static_cast<double>(T) : 1.0;
  if (d.differing == 0) return d;
  // In this order: a uniform shift can push a key past the newest visible one, and a causal offset can change
  // how many keys a query that sees fewer than top-k keys selects.
  if (shifts.size() == 1 && *shifts.begin() != 0) {
    d.pattern = SelectionPattern::SelectionPattern_shifted;
    d.shift = *shifts.begin();
  } else if (any_future) {
    d.pattern = SelectionPattern::SelectionPattern_future;
  } else if (any_missing && all_recent) {
    d.pattern = SelectionPattern::SelectionPattern_recent;
  } else if (any_count) {
    d.pattern = SelectionPattern::SelectionPattern_count;
  } else {
    d.pattern = SelectionPattern::SelectionPattern_scattered;
  }
  return d;
}

}  // namespace mla
