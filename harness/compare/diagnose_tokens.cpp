// Diagnosis rules that read where along the tokens the error sits: rows never written, whole sequences, RoPE,
// the softmax scale, positions (a mask's start, a band, rows from an index on), scattered tokens, DSA's index
// mask. They read only measured errors and the batch layout, never the name of an injection.
#include "harness/compare/diagnose_internal.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace mla::diagnose_detail {

namespace {

// Spearman rank correlation of x = 0..n-1 with y (how monotone y grows with the index).
double growth(const std::vector<double>& y) {
  const size_t n = y.size();
  if (n < 3) return 0;
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return y[a] < y[b]; });
  std::vector<double> rank(n);
  for (size_t r = 0; r < n; ++r) rank[idx[r]] = static_cast<double>(r);
  const double mean = (n - 1) / 2.0;
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (i - mean) * (rank[i] - mean);
    sxx += (i - mean) * (i - mean);
  }
  return sxy / sxx;
}

}  // namespace

// Rows (tokens), heads or channels where the candidate holds exact zeros and the reference does not.
Found rule_unwritten(const Ctx& c) {
  const Metrics& m = c.m;
  if (c.per_token) {
    std::vector<int64_t> zero;
    for (int64_t t = 0; t < c.T; ++t)
      if (m.token_norm_ratio[t] == 0 && m.token_rel[t] > 0) zero.push_back(t);
    if (!zero.empty()) {
      const int64_t others = c.n_off - static_cast<int64_t>(zero.size());
      std::vector<std::string> ev{std::to_string(zero.size()) + " of " + std::to_string(c.T) +
                                  " token rows are exact zeros in the candidate (norm ratio 0, rel_l2 1): tokens " +
                                  ranges(zero)};
      ev.push_back(others > 0 ? std::to_string(others) + " other tokens off as well"
                              : "every other token within the per-token tolerance");
      const std::string conf = others == 0 ? "high" : "medium";
      const bool suffix = zero.back() == c.T - 1 && zero.back() - zero.front() + 1 == static_cast<int64_t>(zero.size());
      if (suffix && zero.front() > 0)
        return Finding{"truncated output: rows from token " + std::to_string(zero.front()) +
                           " on never written (exact zeros): a row count, a grid or a length that stops short",
                       conf, ev};
      // The same count at the end (or start) of every sequence.
      if (c.positions) {
        int tail = -1, head = -1;
        bool tails = true, heads = true;
        for (int b = 0; b < c.batch.num_seqs(); ++b) {
          const int t0 = c.batch.first_token(b), n = c.batch.new_lens[b];
          int zt = 0, zh = 0, zs = 0;
          for (int i = 0; i < n; ++i) zs += m.token_norm_ratio[t0 + i] == 0;
          while (zt < n && m.token_norm_ratio[t0 + n - 1 - zt] == 0) ++zt;
          while (zh < n && m.token_norm_ratio[t0 + zh] == 0) ++zh;
          tails &= zt == zs && zt > 0 && (tail < 0 || tail == zt) && zt < n;
          heads &= zh == zs && zh > 0 && (head < 0 || head == zh) && zh < n;
          tail = zt;
          head = zh;
        }
        if (c.batch.num_seqs() > 1 && tails)
          return Finding{"the last " + std::to_string(tail) + " token rows of each sequence never written (exact "
                         "zeros): a per-sequence length or end offset short by " + std::to_string(tail),
                         conf, ev};
        if (heads)
          return Finding{"the first " + std::to_string(head) + " token rows of " +
                             (c.batch.num_seqs() > 1 ? "each sequence" : "the sequence") +
                             " never written (exact zeros): a start offset or a skipped first tile",
                         conf, ev};
      }
      return Finding{"token rows " + ranges(zero) + " never written (exact zeros): a missed write (a grid or row "
                     "index that skips them)", conf, ev};
    }
  }
  if (c.channel_factors) {
    std::vector<int64_t> zero;
    double zero_err = 0, err = 0;
    for (int64_t ch = 0; ch < c.C; ++ch) {
      err += m.channel_err2[ch];
      if (m.channel_cand2[ch] == 0 && m.channel_ref2[ch] > 0) {
        zero.push_back(ch);
        zero_err += m.channel_err2[ch];
      }
    }
    if (zero.empty() || !(zero_err >= 0.9 * err)) return std::nullopt;
    std::vector<std::string> ev{std::to_string(zero.size()) + " of " + std::to_string(c.C) +
                                    " channels are exact zeros in the candidate over every token: " + channel_names(c, zero),
                                "they hold " + percent(zero_err / err) + " of the error energy"};
    const std::string conf = zero_err >= 0.99 * err ? "high" : "medium";
    if (c.N > 0 && c.X > 0 && static_cast<int64_t>(zero.size()) % c.X == 0) {
      std::vector<int64_t> heads;
      bool whole = true;
      for (size_t i = 0; i < zero.size(); i += c.X) {
        whole &= zero[i] % c.X == 0 && zero[i + c.X - 1] == zero[i] + c.X - 1;
        heads.push_back(zero[i] / c.X);
      }
      if (whole)
        return Finding{std::string(heads.size() == 1 ? "head " : "heads ") + ranges(heads) +
                           " never written (exact zeros): a head range or grid that stops short",
                       conf, ev};
    }
    return Finding{channel_names(c, zero) + " never written (exact zeros): a column range or width that stops "
                   "short", conf, ev};
  }
  return std::nullopt;
}

// Per sequence: only the sequences longer than a page, or only those with cached context. A group "carries" the
// error when its tokens are off and the other group's are not, or, when no single token crosses its tolerance (the
// probe diverges on the whole), when its tokens' median error is 4x the other group's and none of those is off.
struct GroupSplit {
  int64_t n_in = 0, n_out = 0, off_in = 0, off_out = 0;
  double med_in = 0, med_out = 0;
  bool carries() const {
    if (!n_in || !n_out || off_out) return false;
    return off_in > 0 || med_in >= 4 * med_out;
  }
  std::string line(const std::string& in, const std::string& out) const {
    return "tokens " + in + ": " + std::to_string(off_in) + " of " + std::to_string(n_in) + " off (median rel_l2 " +
           fmt_num(med_in) + "); " + out + ": " + std::to_string(off_out) + " of " + std::to_string(n_out) +
           " (median " + fmt_num(med_out) + ")";
  }
};

Found rule_sequences(const Ctx& c) {
  if (!c.positions || c.T < 2 || c.n_off == c.T || c.batch.num_seqs() < 2) return std::nullopt;
  std::vector<double> rel_long, rel_short, rel_ctx, rel_noctx;
  GroupSplit page, ctx;
  for (int b = 0; b < c.batch.num_seqs(); ++b) {
    const int t0 = c.batch.first_token(b), n = c.batch.new_lens[b];
    const bool is_long = c.batch.context_lens[b] + n > kPageSize, has_c = c.batch.context_lens[b] > 0;
    for (int i = 0; i < n; ++i) {
      const bool o = c.off[t0 + i];
      const double r = c.m.token_rel[t0 + i];
      (is_long ? page.n_in : page.n_out) += 1;
      (is_long ? page.off_in : page.off_out) += o;
      (is_long ? rel_long : rel_short).push_back(r);
      (has_c ? ctx.n_in : ctx.n_out) += 1;
      (has_c ? ctx.off_in : ctx.off_out) += o;
      (has_c ? rel_ctx : rel_noctx).push_back(r);
    }
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  page.med_in = median(rel_long);
  page.med_out = median(rel_short);
  ctx.med_in = median(rel_ctx);
  ctx.med_out = median(rel_noctx);
  const bool paging = page.carries(), context = ctx.carries();
  const std::string page_ev = page.line("of sequences longer than one page (" + std::to_string(kPageSize) + " rows)",
                                        "of shorter ones");
  const std::string ctx_ev = ctx.line("with cached context", "without");
  if (paging && context)
    return Finding{"only sequences with cached context are off, and they are also the ones longer than one page: "
                   "the context merge (LSE base) or paging; a run with a short context would tell them apart",
                   "medium", {page_ev, ctx_ev}};
  if (paging)
    return Finding{"only sequences longer than one page (64 rows) are off: paging (block table or page offset)",
                   page.off_in > 0 ? "high" : "medium", {page_ev}};
  if (context)
    return Finding{"only tokens with cached context are off: the merge of context and new-token attention "
                   "(LSE base or merge weights)", ctx.off_in > 0 ? "high" : "medium", {ctx_ev}};
  return std::nullopt;
}

// The rope stage: position 0 exact and error growing with position (the pairing or the frequencies), or every
// position off by the same rotation with norms kept (the positions themselves).
Found rule_rope(const Ctx& c) {
  if (!c.rope_stage) return std::nullopt;
  const Metrics& m = c.m;
  if (c.positions && c.n_off > 0 && c.n_off < c.T) {
    bool zero_exact = true, zero_seen = false, later_off = true;
    int64_t later = 0, later_off_n = 0;
    for (int64_t t = 0; t < c.T; ++t)
      if (c.batch.positions[t] == 0) {
        zero_seen = true;
        zero_exact &= !c.off[t];
      } else {
        ++later;
        later_off_n += c.off[t];
      }
    later_off = 10 * later_off_n >= 9 * later;
    if (zero_seen && zero_exact && later_off_n > 0) {
      const double g = growth(m.token_rel);
      std::vector<std::string> ev{"tokens at position 0 within tolerance; " + std::to_string(later_off_n) + " of " +
                                      std::to_string(later) + " later tokens off",
                                  "growth of error with position (rank correlation) " + fmt_num(g, 2)};
      if (m.rope_rel >= 0) ev.push_back("rel_l2 in the rope lanes " + fmt_num(m.rope_rel));
      return Finding{"position 0 exact, error grows with position, at the rope stage: RoPE layout or frequency "
                     "(rotate-half vs interleaved pairs, or inv_freq/YaRN)",
                     g > 0.3 && later_off ? "high" : "medium", ev};
    }
  }
  const double ratio_off = std::fabs(m.norm_ratio - 1.0);
  if (c.n_off == c.T && ratio_off < 1e-2) {
    std::vector<std::string> ev{"every token off, position 0 included; norm ratio " + fmt_num(m.norm_ratio, 5) +
                                " (a rotation keeps norms)"};
    if (c.per_token) {
      const auto [lo, hi] = std::minmax_element(m.token_norm_ratio.begin(), m.token_norm_ratio.end());
      ev.push_back("per-token norm ratios " + fmt_num(*lo, 5) + " to " + fmt_num(*hi, 5));
    }
    return Finding{"every token off, position 0 too, norms kept: the rotation angles are wrong for every position "
                   "(positions offset)", "high", ev};
  }
  return std::nullopt;
}

// Position 0 exact and error at every later position: position 0 attends to itself only, so any softmax scale
// leaves it exact, while every later token sees a sharper or flatter distribution, in (nearly) every head. How far
// each token moves depends on how peaked its scores are, so some tokens and heads may stay under the tolerance (the
// probe may even diverge on the whole only); what they do not do is stay at the rounding level of position 0, as
// under a mask that starts later.
Found rule_softmax(const Ctx& c) {
  if (!c.attention || !c.positions || c.T < 2) return std::nullopt;
  const Metrics& m = c.m;
  const auto& pos = c.batch.positions;
  int max_pos = 0;
  for (int64_t t = 0; t < c.T; ++t) max_pos = std::max(max_pos, pos[t]);
  double rel0 = 0, later_min = 1e300, later_max = 0;
  int64_t n0 = 0, later = 0, later_off = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    if (pos[t] == 0) {
      n0 += 1;
      rel0 = std::max(rel0, m.token_rel[t]);
    } else {
      later += 1;
      later_off += c.off[t];
      later_min = std::min(later_min, m.token_rel[t]);
      later_max = std::max(later_max, m.token_rel[t]);
    }
  }
  if (n0 == 0 || rel0 > c.tol.token_rel || later < 2) return std::nullopt;
  // Later tokens at position 0's rounding level: a few by chance (a token whose scores are nearly equal or very
  // peaked), but not most, and not a run from position 1 on (a mask that starts later).
  int64_t quiet = 0, run = 0;
  for (int b = 0; b < c.batch.num_seqs(); ++b) {
    const int t0 = c.batch.first_token(b), n = c.batch.new_lens[b];
    bool leading = true;
    for (int i = 0; i < n; ++i) {
      if (pos[t0 + i] == 0) continue;
      const bool q = m.token_rel[t0 + i] <= 3 * rel0;
      quiet += q;
      leading &= q;
      run += leading;
    }
  }
  if (5 * quiet > later || run >= 2) return std::nullopt;
  std::vector<std::pair<int, double>> by_pos;
  for (int64_t t = 0; t < c.T; ++t)
    if (pos[t] > 0) by_pos.push_back({c.batch.token_seq[t] * (max_pos + 1) + pos[t], m.token_rel[t]});
  std::sort(by_pos.begin(), by_pos.end());
  std::vector<double> steps;
  double zmin = 1e300, zmax = -1e300;
  for (size_t i = 0; i < by_pos.size(); ++i) {
    const double z = std::log(by_pos[i].second);
    zmin = std::min(zmin, z);
    zmax = std::max(zmax, z);
    if (i > 0 && by_pos[i].first == by_pos[i - 1].first + 1) steps.push_back(std::fabs(z - std::log(by_pos[i - 1].second)));
  }
  double rough = 0;
  if (!steps.empty()) {
    std::nth_element(steps.begin(), steps.begin() + steps.size() / 2, steps.end());
    rough = steps[steps.size() / 2];
  }
  double min_cos = 1;
  for (double x : m.token_cos) min_cos = std::min(min_cos, x);
  // Heads left at position 0's rounding level over every later token: the bug is in those heads only.
  int64_t heads_quiet = 0;
  if (c.N > 1 && static_cast<int64_t>(m.token_head_rel.size()) == c.T * c.N) {
    for (int64_t h = 0; h < c.N; ++h) {
      double noise = 0, head_max = 0;
      for (int64_t t = 0; t < c.T; ++t) {
        double& v = pos[t] == 0 ? noise : head_max;
        v = std::max(v, m.token_head_rel[t * c.N + h]);
      }
      heads_quiet += head_max <= 3 * std::max(noise, rel0);
    }
  } else if (c.N > 1) {
    heads_quiet = c.N - static_cast<int64_t>(c.heads_off.size());
  }
  // A temperature moves each output along itself (flatter: toward the mean of v, shrinking; sharper: away from
  // it), so the error lies along the reference; error from elsewhere lies across it (cosine ~0).
  const double along = part_index(m.norm_ratio, m.rel_l2) * m.rel_l2;  // cosine of a−b and b
  std::vector<std::string> ev{
      "tokens at position 0 within tolerance (max rel_l2 " + fmt_num(rel0) + "); " + std::to_string(later_off) +
          " of " + std::to_string(later) + " later tokens off, " + std::to_string(later - quiet) +
          " of them above 3x position 0's error (rel_l2 " + fmt_num(later_min) + " to " + fmt_num(later_max) + ")",
      "cosine of the error a−b with the reference " + fmt_num(along, 3) + " (beyond ±0.25: the error lies along "
          "the outputs, as a softmax temperature moves them; about 0: across them)",
      "per-token error profile: median change between neighbouring positions x" + fmt_num(std::exp(rough), 3) +
          ", spread x" + fmt_num(std::exp(zmax - zmin), 3),
      "cosine " + fmt_num(m.cosine, 5) + (c.per_token ? ", lowest per token " + fmt_num(min_cos, 4) : "")};
  if (c.N > 1)
    ev.push_back(std::to_string(c.heads_off.size()) + " of " + std::to_string(c.N) + " heads above the tolerance, " +
                 std::to_string(heads_quiet) + " at position 0's rounding level");
  if (4 * heads_quiet > c.N) return std::nullopt;  // a few heads: the head rule names them
  if (std::fabs(along) > 0.25 && rough < std::log(3.0) && zmax - zmin < std::log(100.0) && m.cosine > 0.9 &&
      min_cos > 0.5)
    return Finding{"token 0 exact at attention (it attends only to itself), error at every later token, along the "
                   "outputs, in every head: the softmax scale",
                   2 * later_off >= later && std::fabs(along) > 0.35 ? "high" : "medium", ev};
  return Finding{"position 0 exact, error at every later position, but not as a wrong scale moves the outputs "
                 "(along themselves): something position-dependent in attention (a mask, a per-position term)",
                 "medium", ev};
}

// Token structure over positions: where in a sequence the error starts (a mask offset or sliding window), a band
// of positions, the last token exact (no causal mask), position 0 exact with every later token smoothly off (the
// softmax scale), rows from an index on.
Found rule_positions(const Ctx& c) {
  if (!c.positions || c.T < 2 || c.n_off == 0 || c.n_off == c.T) return std::nullopt;
  const Metrics& m = c.m;
  // Error in at least half the heads: one head's mask or scale is the head rule's.
  if (c.N > 1 && 2 * static_cast<int64_t>(c.heads_off.size()) < c.N) return std::nullopt;
  const auto& pos = c.batch.positions;
  int max_pos = 0;
  for (int64_t t = 0; t < c.T; ++t) max_pos = std::max(max_pos, pos[t]);
  auto max_rel_where = [&](auto pred) {
    double v = 0;
    for (int64_t t = 0; t < c.T; ++t)
      if (pred(t)) v = std::max(v, m.token_rel[t]);
    return v;
  };
  auto min_rel_where = [&](auto pred) {
    double v = 1e300;
    for (int64_t t = 0; t < c.T; ++t)
      if (pred(t)) v = std::min(v, m.token_rel[t]);
    return v;
  };
  const std::string heads_ev =
      c.N > 1 ? std::to_string(c.heads_off.size()) + " of " + std::to_string(c.N) + " heads off" : "";
  auto with_heads = [&](std::vector<std::string> ev) {
    if (!heads_ev.empty()) ev.push_back(heads_ev);
    return ev;
  };

  // The last token of every sequence exact, the first ones off: without a causal mask the last token sees the same
  // keys, the first sees every key instead of itself.
  {
    bool last_exact = true, first_off = true;
    int64_t earlier = 0, earlier_off = 0;
    for (int b = 0; b < c.batch.num_seqs(); ++b) {
      const int t0 = c.batch.first_token(b), n = c.batch.new_lens[b];
      last_exact &= !c.off[t0 + n - 1];
      if (n > 1) first_off &= static_cast<bool>(c.off[t0]);
      for (int i = 0; i + 1 < n; ++i) {
        ++earlier;
        earlier_off += c.off[t0 + i];
      }
    }
    if (c.attention && last_exact && first_off && earlier > 0 && 2 * earlier_off >= earlier)
      return Finding{"last token exact, earlier tokens off: the causal mask is missing (the last token sees every "
                     "key either way)", 10 * earlier_off >= 9 * earlier ? "high" : "medium",
                     with_heads({"the last token of each sequence within tolerance, the first off; " +
                                 std::to_string(earlier_off) + " of " + std::to_string(earlier) + " earlier tokens off"})};
  }

  // A threshold position W: every token before it within tolerance, every token at or after it off.
  int W = -1;
  {
    int first = max_pos + 1;
    for (int64_t t = 0; t < c.T; ++t)
      if (c.off[t]) first = std::min(first, pos[t]);
    bool clean_split = true;
    for (int64_t t = 0; t < c.T; ++t) clean_split &= (pos[t] >= first) == static_cast<bool>(c.off[t]);
    if (clean_split) W = first;
    // A mask that hides one key of many moves the first tokens past it less than the per-token tolerance: W is
    // still where the error profile splits, when every token from there on has more error than any token before
    // (all of those within tolerance), three quarters of them are off, and their median is 3x the error before.
    for (int p = 2; W < 0 && p <= first && p <= max_pos; ++p) {
      const double before = max_rel_where([&](int64_t t) { return pos[t] < p; }),
                   after = min_rel_where([&](int64_t t) { return pos[t] >= p; });
      std::vector<double> rel_after;
      int64_t off_after = 0;
      for (int64_t t = 0; t < c.T; ++t)
        if (pos[t] >= p) rel_after.push_back(m.token_rel[t]), off_after += c.off[t];
      const auto n_after = static_cast<int64_t>(rel_after.size());
      std::nth_element(rel_after.begin(), rel_after.begin() + n_after / 2, rel_after.end());
      if (after > before && 4 * off_after >= 3 * n_after && rel_after[n_after / 2] >= 3 * before) W = p;
    }
  }
  if (W >= 2) {
    const double before = max_rel_where([&](int64_t t) { return pos[t] < W; }),
                 after = min_rel_where([&](int64_t t) { return pos[t] >= W; });
    int64_t n_after = 0, off_after = 0;
    for (int64_t t = 0; t < c.T; ++t)
      if (pos[t] >= W) n_after += 1, off_after += c.off[t];
    std::vector<std::string> ev{"tokens at positions < " + std::to_string(W) + " within tolerance (max rel_l2 " +
                                    fmt_num(before) + "), " +
                                    (off_after == n_after ? "every token at position >= " + std::to_string(W) + " off"
                                                          : std::to_string(off_after) + " of " + std::to_string(n_after) +
                                                                " tokens at position >= " + std::to_string(W) + " off") +
                                    " (min rel_l2 " + fmt_num(after) + ")"};
    if (c.attention)
      return Finding{"error starts at position " + std::to_string(W) + ": a mask that begins there, e.g. a sliding "
                     "window of " + std::to_string(W) + " keys (tokens before it see every key either way) or a "
                     "mask offset", after >= 2 * before ? "high" : "medium", with_heads(ev)};
    return Finding{"error starts at position " + std::to_string(W) + " and covers every later position: something "
                   "position-dependent beyond a length (a table or cache read past it)", "medium", with_heads(ev)};
  }
  if (W == 1)
    return Finding{"position 0 exact, later positions off: something position-dependent", "medium",
                   with_heads({"tokens at position 0 within tolerance, every later token off"})};

  // A band of positions: off inside [p0, p1], within tolerance before and after.
  {
    int p0 = max_pos + 1, p1 = -1;
    for (int64_t t = 0; t < c.T; ++t)
      if (c.off[t]) p0 = std::min(p0, pos[t]), p1 = std::max(p1, pos[t]);
    int min_pos = max_pos;
    for (int64_t t = 0; t < c.T; ++t) min_pos = std::min(min_pos, pos[t]);
    bool band = p0 > min_pos && p1 < max_pos;
    for (int64_t t = 0; t < c.T; ++t) band &= (pos[t] >= p0 && pos[t] <= p1) == static_cast<bool>(c.off[t]);
    if (band && p1 > p0)
      return Finding{"a band of positions off (" + std::to_string(p0) + "-" + std::to_string(p1) +
                         "), exact before and after: a mask band or a window, or one tile of rows",
                     c.attention ? "high" : "medium",
                     with_heads({"every token at positions " + std::to_string(p0) + "-" + std::to_string(p1) +
                                 " off, every other within tolerance"})};
  }
  // Rows from one token index on (across sequences: not a position).
  {
    int64_t first = c.T;
    for (int64_t t = 0; t < c.T; ++t)
      if (c.off[t]) first = std::min(first, t);
    if (first > 0 && c.T - first == c.n_off)
      return Finding{"rows from token " + std::to_string(first) + " on off (every earlier token within tolerance): a "
                     "row count, a grid or a tile boundary", "medium",
                     with_heads({"tokens " + std::to_string(first) + "-" + std::to_string(c.T - 1) + " off"})};
  }
  return std::nullopt;
}

// A few tokens off at no position structure, the others within tolerance.
Found rule_scattered(const Ctx& c) {
  if (c.n_off == 0 || 2 * c.n_off > c.T || c.T < 4) return std::nullopt;
  std::vector<int64_t> bad;
  std::vector<double> rel;
  for (int64_t t = 0; t < c.T; ++t)
    if (c.off[t]) bad.push_back(t), rel.push_back(c.m.token_rel[t]);
  const bool contiguous = bad.back() - bad.front() + 1 == static_cast<int64_t>(bad.size());
  if (contiguous && bad.size() > 1) return std::nullopt;
  // The others at the rounding level, well below the ones off (not a spread of errors cut by the tolerance).
  double quiet = 0;
  for (int64_t t = 0; t < c.T; ++t)
    if (!c.off[t]) quiet = std::max(quiet, c.m.token_rel[t]);
  if (quiet * 3 > *std::min_element(rel.begin(), rel.end())) return std::nullopt;
  std::vector<std::string> ev{std::to_string(c.n_off) + " of " + std::to_string(c.T) + " tokens off (" + ranges(bad) +
                                  "), rel_l2 " + values(rel) + "; the others at most " + fmt_num(quiet),
                              "no position structure: not a prefix, suffix or band of positions, not whole sequences"};
  return Finding{"scattered tokens off (" + ranges(bad) + "), each with its own error: a race, a stale or "
                 "uninitialized read, or a per-token index", c.n_off * 4 <= c.T ? "medium" : "low", ev};
}

// DSA's idx_scores: the candidate scores keys its token does not see (the reference holds 0 there), and the largest
// errors all sit there: the scores' causal mask is missing or offset.
Found rule_index_mask(const Ctx& c) {
  if (c.r.name != "idx_scores" || !c.positions || c.m.worst.empty()) return std::nullopt;
  int64_t unseen = 0;
  for (const auto& w : c.m.worst)
    if (w.at.token >= 0 && w.at.channel >= c.batch.keys_seen(static_cast<int>(w.at.token)) && w.b == 0) ++unseen;
  if (unseen != static_cast<int64_t>(c.m.worst.size())) return std::nullopt;
  const auto& w = c.m.worst.front();
  return Finding{"scores for keys the token cannot see: the causal mask of the index scores is missing or offset",
                 "high",
                 {"the " + std::to_string(unseen) + " largest differences are all at keys past what their token sees, "
                  "where the reference holds 0 (e.g. token " + std::to_string(w.at.token) + ", key " +
                  std::to_string(w.at.channel) + ": " + fmt_num(w.a) + ")"}};
}

}  // namespace mla::diagnose_detail
