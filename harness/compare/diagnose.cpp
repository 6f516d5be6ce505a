// Drill-down maps and pattern rules. The rules read only measured errors and the batch layout, never the
// name of an injection: the zoo scores them on bugs they were not told about.
#include "harness/compare/diagnose.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "harness/report/compare_report.h"

namespace mla {

std::string ranges(const std::vector<int64_t>& v, size_t max_items) {
  std::ostringstream os;
  size_t items = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (items++ == max_items) {
      os << ", ...";
      break;
    }
    if (i) os << ", ";
    os << v[i];
    if (j > i) os << "-" << v[j];
    i = j;
  }
  return os.str();
}

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

std::string pct(double v) { return fmt_num(100 * v, 3) + "%"; }

}  // namespace

DrillDown drill_down(const ProbeResult& r, const Metrics& m, const Tolerance& tol) {
  DrillDown d;
  d.tokens = static_cast<int64_t>(m.token_rel.size());
  for (int64_t t = 0; t < d.tokens; ++t)
    if (m.token_rel[t] > tol.token_rel) d.tokens_off.push_back(t);
  d.heads = static_cast<int64_t>(m.head_rel.size());
  for (int64_t h = 0; h < d.heads; ++h)
    if (m.head_rel[h] > tol.rel_l2) d.heads_off.push_back(h);
  for (size_t k = 0; k < m.rank_rel.size(); ++k)
    if (m.rank_rel[k] > tol.rel_l2) d.ranks_off.push_back(static_cast<int>(k));
  if (m.rope_rel >= 0 && m.nope_rel >= 0) {
    if (m.rope_rel > tol.rel_l2 && m.nope_rel <= tol.rel_l2) d.channels = "rope lanes only";
    else if (m.nope_rel > tol.rel_l2 && m.rope_rel <= tol.rel_l2) d.channels = "latent (non-rope) lanes only";
    else d.channels = "rope and latent lanes";
  } else if (m.first_half_rel >= 0) {
    if (m.first_half_rel > tol.rel_l2 && m.second_half_rel <= tol.rel_l2) d.channels = "first half of the channels only";
    else if (m.second_half_rel > tol.rel_l2 && m.first_half_rel <= tol.rel_l2) d.channels = "second half of the channels only";
    else d.channels = "all channels";
  }
  auto count = [](size_t k, int64_t n, const char* what) {
    return std::to_string(k) + " of " + std::to_string(n) + " " + what;
  };
  if (!m.rank_rel.empty()) {
    std::vector<int64_t> rk(d.ranks_off.begin(), d.ranks_off.end());
    d.lines.push_back("ranks:    " + count(rk.size(), static_cast<int64_t>(m.rank_rel.size()), "off") +
                      (rk.empty() ? "" : " (" + ranges(rk) + ")"));
  }
  if (d.heads) d.lines.push_back("heads:    " + count(d.heads_off.size(), d.heads, "off") +
                                 (d.heads_off.empty() ? "" : " (" + ranges(d.heads_off) + ")"));
  if (d.tokens) d.lines.push_back("tokens:   " + count(d.tokens_off.size(), d.tokens, "off") +
                                  (d.tokens_off.empty() ? "" : " (" + ranges(d.tokens_off) + ")"));
  if (!d.channels.empty()) d.lines.push_back("channels: " + d.channels);
  if (r.contract == "partial" && !m.rank_rel.empty()) d.lines.back() += " (per-rank partial sums compared)";
  for (size_t i = 0; i < m.worst.size() && i < 5; ++i)
    d.lines.push_back("worst:    " + fmt_num(m.worst[i].a, 6) + " vs " + fmt_num(m.worst[i].b, 6) + " at " +
                      m.worst[i].at.to_string());
  return d;
}

Diagnosis diagnose(const ProbeResult& r, const Metrics& m, const Tolerance& tol, const Batch& batch,
                   const CompareReport& all) {
  Diagnosis dg;
  auto say = [&](std::string pattern, std::string confidence) {
    dg.pattern = std::move(pattern);
    dg.confidence = std::move(confidence);
    return dg;
  };
  auto& ev = dg.evidence;
  if (!m.nonfinite_agree)
    return ev.push_back(m.first_nonfinite),
           say("NaN/Inf originates here (" + m.first_nonfinite + "); everything downstream inherits it", "high");

  const int64_t T = static_cast<int64_t>(m.token_rel.size());
  const double tok_tol = tol.token_rel;
  auto off = [&](int64_t t) { return m.token_rel[t] > tok_tol; };
  int64_t n_off = 0;
  for (int64_t t = 0; t < T; ++t) n_off += off(t);
  ev.push_back("rel_l2 " + fmt_num(m.rel_l2) + " (tolerance " + fmt_num(tol.rel_l2) + "), cosine " +
               fmt_num(m.cosine, 6) + ", norm ratio " + fmt_num(m.norm_ratio, 5));
  ev.push_back(std::to_string(n_off) + " of " + std::to_string(T) + " tokens above the per-token tolerance " +
               fmt_num(tok_tol));

  if (m.norm_ratio < 0.05)
    return say("the candidate's tensor is (nearly) all zeros: a write that never happened (an empty cache row, "
               "a kernel that did not run)", "high");

  // An all-reduce: every rank's partial agrees, their sum does not.
  if (r.name == "o")
    for (const auto& other : all.results)
      if (other.layer == r.layer && other.name == "o_partial" && other.verdict == Verdict::Verdict_pass) {
        ev.push_back("o_partial passes on every rank (rel_l2 " + fmt_num(other.m.rel_l2) + ")");
        return say("o_partial agrees on every rank, o does not: the all-reduce (a missing or doubled partial)", "high");
      }

  // Some ranks only.
  if (m.rank_rel.size() > 1) {
    std::vector<int64_t> bad;
    for (size_t k = 0; k < m.rank_rel.size(); ++k)
      if (m.rank_rel[k] > tol.rel_l2) bad.push_back(static_cast<int64_t>(k));
    if (!bad.empty() && bad.size() < m.rank_rel.size()) {
      ev.push_back("rank rel_l2: " + [&] {
        std::string s;
        for (size_t k = 0; k < m.rank_rel.size(); ++k) s += (k ? ", " : "") + fmt_num(m.rank_rel[k]);
        return s;
      }());
      return say("only ranks " + ranges(bad) + " off: sharding (a rank holds or reads the wrong slice)", "high");
    }
  }

  if (T == batch.tokens() && T > 1 && n_off > 0 && n_off < T) {
    // Per sequence: by page span, by cached context, by first/last token.
    bool long_off = false, short_off = false, has_long = false, has_short = false;
    bool ctx_off = false, noctx_off = false, has_ctx = false, has_noctx = false;
    bool first_exact = true, first_off_any = false, others_off = false, last_exact = true, earlier_off = false;
    for (int b = 0; b < batch.num_seqs(); ++b) {
      const int t0 = batch.first_token(b), n = batch.new_lens[b];
      const bool is_long = batch.context_lens[b] + n > kPageSize, has_c = batch.context_lens[b] > 0;
      (is_long ? has_long : has_short) = true;
      (has_c ? has_ctx : has_noctx) = true;
      for (int i = 0; i < n; ++i) {
        const bool o = off(t0 + i);
        if (o) (is_long ? long_off : short_off) = true;
        if (o) (has_c ? ctx_off : noctx_off) = true;
        if (batch.positions[t0 + i] == 0) {
          first_exact &= !o;
          first_off_any |= o;
        } else if (o) {
          others_off = true;
        }
        if (i == n - 1) last_exact &= !o;
        else if (o) earlier_off = true;
      }
    }
    const bool paging = has_long && has_short && long_off && !short_off;
    const bool context = has_ctx && has_noctx && ctx_off && !noctx_off;
    if (paging && context)
      return say("only sequences with cached context are off, and they are also the ones longer than one page: "
                 "the context merge (LSE base) or paging; a run with a short context would tell them apart", "medium");
    if (paging)
      return say("only sequences longer than one page (64 rows) are off: paging (block table or page offset)", "high");
    if (context)
      return say("only tokens with cached context are off: the merge of context and new-token attention "
                 "(LSE base or merge weights)", "high");
    const bool rope_stage = r.stage == "rope";
    const bool attention = r.stage.rfind("attention", 0) == 0 || r.name == "lse" || r.name == "attn_latent";
    if (first_exact && others_off && !first_off_any) {
      const double g = growth(std::vector<double>(m.token_rel.begin(), m.token_rel.end()));
      ev.push_back("position 0 exact; growth of error with position (rank correlation) " + fmt_num(g, 2));
      if (rope_stage)
        return say("position 0 exact, error grows with position, at the rope stage: RoPE layout or frequency "
                   "(rotate-half vs interleaved pairs, or inv_freq/YaRN)", g > 0.3 ? "high" : "medium");
      if (attention)
        return say("token 0 exact at attention (it attends only to itself), later tokens off: the softmax scale", "high");
      return say("position 0 exact, later positions off: something position-dependent", "medium");
    }
    if (last_exact && earlier_off && attention)
      return say("last token exact, earlier tokens off: the causal mask is missing (the last token sees every key "
                 "either way)", "high");
  }

  // Scale patterns.
  const double ratio_off = std::fabs(m.norm_ratio - 1.0);
  if (m.cosine > 1.0 - 1e-4 && ratio_off > tol.rel_l2)
    return say("pure scale: cosine " + fmt_num(m.cosine, 6) + ", norm ratio " + fmt_num(m.norm_ratio, 5) +
               " (a constant factor: an mscale, a global scale, a reciprocal)", "high");
  if (!m.token_cos.empty()) {
    double min_cos = 1, rmin = 1e300, rmax = 0;
    for (size_t t = 0; t < m.token_cos.size(); ++t) {
      min_cos = std::min(min_cos, m.token_cos[t]);
      rmin = std::min(rmin, m.token_norm_ratio[t]);
      rmax = std::max(rmax, m.token_norm_ratio[t]);
    }
    // Directions kept (per token, up to a per-channel weight) while norms vary from token to token.
    if (min_cos > 0.98 && rmax / rmin > 1.0 + 10 * tol.rel_l2) {
      ev.push_back("every token's direction agrees (min cosine " + fmt_num(min_cos, 6) + "); norm ratios " +
                   fmt_num(rmin, 4) + " to " + fmt_num(rmax, 4));
      return say("content kept, scale per token off: a normalization missing or wrong (RMSNorm skipped, eps)",
                 min_cos > 0.999 ? "high" : "medium");
    }
  }
  if (r.stage == "rope" && n_off == T && ratio_off < 1e-2)
    return say("every token off, position 0 too, norms kept: the rotation angles are wrong for every position "
               "(positions offset)", "high");
  if (ratio_off < 0.25 && m.cosine < 0.9) {
    std::string heads;
    if (!m.head_rel.empty()) {
      int64_t bad = 0;
      for (double h : m.head_rel) bad += h > tol.rel_l2;
      heads = bad == static_cast<int64_t>(m.head_rel.size()) ? "every head off; " : "";
    }
    return say(heads + "norms plausible (ratio " + fmt_num(m.norm_ratio, 4) + ") but content differs (cosine " +
               fmt_num(m.cosine, 3) + "): a permutation or layout (split order, transpose, stride)",
               ratio_off < 0.05 ? "high" : "medium");
  }
  return say("no known pattern", "low");
}

}  // namespace mla
