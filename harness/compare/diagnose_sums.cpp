// Diagnosis rules that read sums and neighbouring probes: the all-reduce, DSA's index combination, a neighbour's
// tensor equal to the candidate or to its error, a part of the sum missing or counted twice.
#include "harness/compare/diagnose_internal.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace mla::diagnose_detail {

namespace {

// "1/2", "3/4": the simple fraction nearest f (denominators up to 4: energies of a few random terms are not known
// better), or "" when none is within 0.06.
std::string simple_fraction(double f) {
  std::string best;
  double err = 0.06;
  for (int q = 2; q <= 4; ++q)
    for (int p = 1; p < q; ++p)
      if (std::gcd(p, q) == 1 && std::fabs(f - static_cast<double>(p) / q) < err) {
        err = std::fabs(f - static_cast<double>(p) / q);
        best = std::to_string(p) + "/" + std::to_string(q);
      }
  return best;
}

// Neighbouring probes of this layer (earlier in the graph, same tokens and channels) whose per-channel energy the
// error or the candidate has: the candidate equals one of them (h_out = o: h never added), or the error is one of
// them (a tensor missing from a sum, or added twice). Energies per channel summed over tokens match to a fraction of
// a percent when the tensors are the same, and by tens of percent for two different tensors of the same kind.
struct NeighbourMatch {
  const ProbeResult* p = nullptr;
  double miss = 1e300;  // L1 distance of the per-channel energies, relative to the neighbour's
  std::string same;     // other neighbours with the same reference (o_partial and o at tp 1)
  const ProbeResult* next = nullptr;  // the best of another profile
  double next_miss = 1e300;
};

NeighbourMatch match_neighbour(const Ctx& c, const std::vector<double>& energy) {
  NeighbourMatch best;
  std::vector<std::pair<double, const ProbeResult*>> ms;
  for (const auto& x : c.all.results) {
    if (x.layer != c.r.layer || x.name == c.r.name || x.order >= c.r.order || x.shape.empty() || c.r.shape.empty() ||
        x.shape[0] != c.r.shape[0] || static_cast<int64_t>(x.m.channel_ref2.size()) != c.C)
      continue;
    const double e = std::accumulate(x.m.channel_ref2.begin(), x.m.channel_ref2.end(), 0.0);
    if (!(e > 0)) continue;
    double d = 0;
    for (int64_t ch = 0; ch < c.C; ++ch) d += std::fabs(energy[ch] - x.m.channel_ref2[ch]);
    ms.push_back({d / e, &x});
  }
  if (ms.empty()) return best;
  std::sort(ms.begin(), ms.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  best.p = ms[0].second;
  best.miss = ms[0].first;
  const auto& bref = best.p->m.channel_ref2;
  const double be = std::accumulate(bref.begin(), bref.end(), 0.0);
  for (size_t i = 1; i < ms.size() && !best.next; ++i) {
    double d = 0;
    for (int64_t ch = 0; ch < c.C; ++ch) d += std::fabs(ms[i].second->m.channel_ref2[ch] - bref[ch]);
    if (d / be < 0.02) {
      best.same += (best.same.empty() ? "" : ", ") + ms[i].second->name;
    } else {
      best.next = ms[i].second;
      best.next_miss = ms[i].first;
    }
  }
  return best;
}

bool clear_match(const NeighbourMatch& n) { return n.p && n.miss < 0.05 && (!n.next || n.next_miss > 3 * n.miss); }

std::string match_line(const std::string& what, const NeighbourMatch& n, int64_t C) {
  return what + " matches " + n.p->name + (n.same.empty() ? "" : " (= " + n.same + ")") +
         "'s per-channel energy to " + percent(n.miss) + " (L1 over " + std::to_string(C) + " channels)" +
         (n.next ? "; the next neighbour (" + n.next->name + ") to " + percent(n.next_miss) : "");
}

}  // namespace

// o wrong while every rank's o_partial agrees: the all-reduce, with how much of the sum it kept.
Found rule_all_reduce(const Ctx& c) {
  if (c.r.name != "o") return std::nullopt;
  for (const auto& other : c.all.results)
    if (other.layer == c.r.layer && other.name == "o_partial" && other.verdict == Verdict::Verdict_pass) {
      std::vector<std::string> ev{"o_partial passes on every rank (rel_l2 " + fmt_num(other.m.rel_l2) + ")"};
      const double k = part_index(c.m.norm_ratio, c.m.rel_l2), keep = c.m.norm_ratio * c.m.norm_ratio;
      const int64_t tp = static_cast<int64_t>(other.m.rank_rel.size());
      std::string what = "a missing or doubled partial";
      if (std::fabs(k + 1) < 0.2) {
        what = "partials missing from the sum";
        ev.push_back("(o−o_ref)·o_ref / ‖o−o_ref‖² = " + fmt_num(k, 3) + " (−1: o is the sum minus some partials); o keeps " +
                     percent(keep) + " of the reference's energy" +
                     (tp > 1 ? " (about " + fmt_num(keep * tp, 2) + " of " + std::to_string(tp) + " ranks' partials)" : ""));
      } else if (std::fabs(k - 1) < 0.2) {
        what = "a partial counted twice";
        ev.push_back("(o−o_ref)·o_ref / ‖o−o_ref‖² = " + fmt_num(k, 3) + " (+1: o is the sum plus a part of itself)");
      }
      return Finding{"o_partial agrees on every rank, o does not: the all-reduce (" + what + ")", "high", ev};
    }
  return std::nullopt;
}

// DSA's idx_scores wrong while the three tensors it is made of agree: how they are combined is wrong.
Found rule_index_combine(const Ctx& c) {
  if (c.r.name != "idx_scores") return std::nullopt;
  int agree = 0;
  for (const auto& p : c.all.results)
    if (p.layer == c.r.layer && (p.name == "idx_q" || p.name == "idx_k" || p.name == "idx_weights"))
      agree += p.verdict == Verdict::Verdict_pass;
  if (agree != 3) return std::nullopt;
  return Finding{"idx_q, idx_k and idx_weights agree, the scores made of them do not: the combination is wrong (the "
                 "per-head weights, the ReLU, the Di^-1/2 scale or the sum over heads)",
                 "medium", {"idx_q, idx_k and idx_weights within tolerance in this layer"}};
}

// The candidate itself equal to one neighbour and the error to another: the sum is missing the error's neighbour,
// the candidate is the other term (h_out = o: h never added).
Found rule_neighbour_equal(const Ctx& c) {
  if (!c.channel_factors) return std::nullopt;
  const Metrics& m = c.m;
  const double err = std::accumulate(m.channel_err2.begin(), m.channel_err2.end(), 0.0);
  if (!(err > 0)) return std::nullopt;
  const NeighbourMatch e = match_neighbour(c, m.channel_err2);
  if (!clear_match(e)) return std::nullopt;
  const NeighbourMatch a = match_neighbour(c, m.channel_cand2);
  if (!clear_match(a) || a.p == e.p || a.p->name == e.p->name) return std::nullopt;
  const double k = part_index(m.norm_ratio, m.rel_l2);
  std::vector<std::string> ev{match_line("per-channel error energy", e, c.C),
                              "(a−b)·b / ‖a−b‖² = " + fmt_num(k, 3) + " (−1: the reference minus a part; +1: plus a part)",
                              match_line("the candidate's per-channel energy", a, c.C)};
  const std::string what = c.r.stage == "residual" ? "residual add dropped: " : "a term of the sum dropped: ";
  return Finding{what + c.r.name + " equals " + a.p->name + " (" + e.p->name + " never added; the error is minus " +
                     e.p->name + ")", "high", ev};
}

Found rule_neighbour_part(const Ctx& c) {
  if (!c.channels) return std::nullopt;
  const Metrics& m = c.m;
  const double err = std::accumulate(m.channel_err2.begin(), m.channel_err2.end(), 0.0);
  if (!(err > 0)) return std::nullopt;
  const NeighbourMatch e = match_neighbour(c, m.channel_err2);
  if (!clear_match(e)) return std::nullopt;
  const double k = part_index(m.norm_ratio, m.rel_l2);
  std::vector<std::string> ev{match_line("per-channel error energy", e, c.C),
                              "(a−b)·b / ‖a−b‖² = " + fmt_num(k, 3) + " (−1: the reference minus a part; +1: plus a part)"};
  if (Found f = rule_neighbour_equal(c)) return f;
  // Only the error matched: its sign from how it lies against the reference.
  if (std::fabs(k + 1) < 0.5)
    return Finding{"candidate = reference minus " + e.p->name + ": " + e.p->name +
                       " missing from the sum (a residual or accumulation dropped)", "medium", ev};
  if (std::fabs(k - 1) < 0.5)
    return Finding{"candidate = reference plus " + e.p->name + ": " + e.p->name +
                       " added twice (a residual or accumulation doubled)", "medium", ev};
  return std::nullopt;
}

// The candidate is the reference minus (or plus) a part of itself: a sum over a subset of its terms (heads, ranks,
// splits) or with a term twice.
Found rule_sum_part(const Ctx& c) {
  const Metrics& m = c.m;
  if (!(m.rel_l2 > 0.05) || !(m.cosine < 1 - 1e-3)) return std::nullopt;
  const double k = part_index(m.norm_ratio, m.rel_l2);
  const bool missing = std::fabs(k + 1) < 0.2, twice = std::fabs(k - 1) < 0.2;
  if (!missing && !twice) return std::nullopt;
  // Token by token as well.
  int64_t agree = 0, n = 0;
  if (c.per_token)
    for (int64_t t = 0; t < c.T; ++t) {
      if (!(m.token_rel[t] > 0.05)) continue;
      ++n;
      agree += std::fabs(part_index(m.token_norm_ratio[t], m.token_rel[t]) - (missing ? -1 : 1)) < 0.3;
    }
  std::vector<std::string> ev{"(a−b)·b / ‖a−b‖² = " + fmt_num(k, 3) + " from norm ratio " + fmt_num(m.norm_ratio, 4) +
                              " and rel_l2 " + fmt_num(m.rel_l2, 4) +
                              (missing ? " (−1: the error is orthogonal to the candidate, which is the reference minus a part)"
                                       : " (+1: the error is a part of the reference, counted again)")};
  if (n > 0) ev.push_back("the same on " + std::to_string(agree) + " of " + std::to_string(n) + " tokens");
  if (missing) {
    const double keep = m.norm_ratio * m.norm_ratio;
    const std::string frac = simple_fraction(keep);
    ev.push_back("the candidate keeps " + percent(keep) + " of the reference's energy (norm ratio " +
                 fmt_num(m.norm_ratio, 4) + " ~ sqrt(" + fmt_num(keep, 3) + "))" +
                 (frac.empty() ? "" : ": about " + frac + " of equal, independent terms"));
    // o_proj sums over heads: with attn_out beside it, in heads.
    if (c.r.stage == "o_proj")
      for (const auto& x : c.all.results)
        if (x.layer == c.r.layer && x.name == "attn_out" && !x.m.head_rel.empty()) {
          const double heads = static_cast<double>(x.m.head_rel.size());
          ev.push_back("attn_out has " + fmt_num(heads, 4) + " heads: the kept energy is about " +
                       fmt_num(std::round(keep * heads), 4) + " of them");
        }
    const std::string what = c.r.stage == "o_proj" ? "o_proj summed over a subset of the heads" : "a sum over a subset of its terms";
    return Finding{"candidate = reference minus a part: " + what + (frac.empty() ? "" : " (about " + frac + " kept)") +
                       " (heads, ranks, splits or tiles missing from the sum)",
                   n == 0 || 10 * agree >= 8 * n ? "high" : "medium", ev};
  }
  ev.push_back("the duplicated part carries " + percent(m.rel_l2 * m.rel_l2) + " of the reference's energy");
  return Finding{"candidate = reference plus a part of itself: a term of a sum counted twice (heads, ranks, splits "
                 "or tiles accumulated again)", n == 0 || 10 * agree >= 8 * n ? "high" : "medium", ev};
}

}  // namespace mla::diagnose_detail
