// Diagnosis rules that read the candidate as the reference transformed: one factor for the whole tensor (a
// scale, a unit mix-up), a factor per channel or per token, a normalization missing, the data moved.
#include "harness/compare/diagnose_internal.h"

#include <algorithm>
#include <cmath>

namespace mla::diagnose_detail {

namespace {

// Known constants a wrong factor tends to be: unit mix-ups first.
struct NamedFactor {
  double value;
  const char* name;
  bool units;
};
const NamedFactor* named_factor(double f, double rel_tol) {
  static const NamedFactor known[] = {
      {1.0 / std::log(2.0), "1/ln 2 = log2(e): a value in log2 units where natural-log units are meant", true},
      {std::log(2.0), "ln 2: a value in natural-log units where log2 units are meant", true},
      {2.0, "2: counted twice", false},
      {0.5, "1/2: half", false},
      {std::sqrt(2.0), "sqrt 2", false},
      {1.0 / std::sqrt(2.0), "1/sqrt 2", false},
  };
  for (const auto& k : known)
    if (std::fabs(f / k.value - 1.0) < rel_tol) return &k;
  return nullptr;
}

}  // namespace

// One factor for the whole tensor (cosine ~1): a scale, or a unit mix-up when the factor is ln 2 or 1/ln 2.
Found rule_scale(const Ctx& c) {
  const Metrics& m = c.m;
  if (!(m.cosine > 1.0 - 1e-4) || !(std::fabs(m.norm_ratio - 1.0) > c.tol.rel_l2)) return std::nullopt;
  std::vector<std::string> ev{"cosine " + fmt_num(m.cosine, 6) + " (direction kept), norm ratio " + fmt_num(m.norm_ratio, 5)};
  if (c.per_token) {
    const auto [lo, hi] = std::minmax_element(m.token_norm_ratio.begin(), m.token_norm_ratio.end());
    // Tokens' factors apart by more than a token's tolerance: each token its own factor (the token-scale rule's),
    // however close to 1 the overall cosine stays.
    if (!(*hi <= *lo * (1 + 2 * c.tol.token_rel))) return std::nullopt;
    ev.push_back("per-token norm ratios " + fmt_num(*lo, 5) + " to " + fmt_num(*hi, 5) + " (the same factor for every token)");
  }
  if (const NamedFactor* f = named_factor(m.norm_ratio, 2e-3)) {
    ev.push_back("norm ratio " + fmt_num(m.norm_ratio, 5) + " matches " + f->name + " (within " +
                 fmt_num(std::fabs(m.norm_ratio / f->value - 1) * 100, 2) + "%)");
    if (f->units)
      return Finding{std::string("units mix-up: the candidate is the reference times ") + fmt_num(f->value, 5) + " = " +
                         f->name, "high", ev};
  }
  // lse = log Σ exp(scale · q·k) follows the scale itself where one key dominates each row.
  const std::string lse = c.r.name == "lse" ? "; at lse: the softmax scale, or the scores' scale" : "";
  return Finding{"pure scale: cosine " + fmt_num(m.cosine, 6) + ", norm ratio " + fmt_num(m.norm_ratio, 5) +
                     " (a constant factor: an mscale, a global scale, a reciprocal" + lse + ")", "high", ev};
}

// Each channel the reference times its own factor, the same for every token: a per-channel weight missing or wrong.
Found rule_channel_scale(const Ctx& c) {
  if (!c.channel_factors) return std::nullopt;
  const Metrics& m = c.m;
  std::vector<double> f;
  double min_cos = 1;
  for (int64_t ch = 0; ch < c.C; ++ch) {
    if (!(m.channel_ref2[ch] > 0)) continue;
    f.push_back(channel_factor(m, ch));
    min_cos = std::min(min_cos, channel_cos(m, ch));
  }
  if (f.size() < 4 || !(min_cos > 1 - 1e-4)) return std::nullopt;
  std::vector<double> sorted = f;
  std::sort(sorted.begin(), sorted.end());
  const double lo = sorted.front(), hi = sorted.back(), med = sorted[sorted.size() / 2];
  if (!(hi - lo > 10 * c.tol.rel_l2 * std::max(std::fabs(med), 1e-30))) return std::nullopt;  // one factor: a scale
  int64_t unit = 0;
  for (double x : f) unit += std::fabs(x - 1) <= c.tol.rel_l2;
  // Most channels off: a few channels or a head's are the channel and head rules'.
  if (2 * unit > static_cast<int64_t>(f.size())) return std::nullopt;
  std::vector<std::string> ev{"per-channel factors (candidate / reference, over tokens) " + fmt_num(lo, 4) + " to " +
                                  fmt_num(hi, 4) + ", median " + fmt_num(med, 4) + "; " + std::to_string(unit) + " of " +
                                  std::to_string(f.size()) + " channels at 1",
                              "every channel the same factor for every token: lowest per-channel cosine over tokens " +
                                  fmt_num(min_cos, 7),
                              "first channels' factors: " + values(f, 4, 8)};
  if (c.norm_stage)
    return Finding{"per-channel scale at a norm, constant over tokens: the norm without its weight (the factors are "
                   "1/weight) or with the wrong weight", "high", ev};
  return Finding{"per-channel scale, constant over tokens: a per-channel weight or scale missing, applied twice or "
                 "misindexed", "high", ev};
}

// A normalizing stage whose tokens are each off by a factor of their own, far beyond a norm's weight, with the
// direction only roughly kept: the normalization was not applied (a LayerNorm also subtracts the mean and adds a
// bias, so the direction moves too; rule_token_scale covers the RMSNorm case, direction kept).
Found rule_norm_missing(const Ctx& c) {
  const Metrics& m = c.m;
  if (!c.norm_stage || !c.per_token || c.T < 2) return std::nullopt;
  double min_cos = 1, rmin = 1e300, rmax = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    min_cos = std::min(min_cos, m.token_cos[t]);
    rmin = std::min(rmin, m.token_norm_ratio[t]);
    rmax = std::max(rmax, m.token_norm_ratio[t]);
  }
  if (!(min_cos > 0.5 && rmax / rmin > 2 && (rmin > 2 || rmax < 0.5))) return std::nullopt;
  return Finding{"every token off by its own factor (norm ratio " + fmt_num(rmin, 3) + " to " + fmt_num(rmax, 3) +
                     "), its direction roughly kept: the normalization missing (mean and variance per token not "
                     "applied)",
                 "medium",
                 {"per-token norm ratios " + fmt_num(rmin, 4) + " to " + fmt_num(rmax, 4) +
                  " (a missing norm: the unnormalized rows' own scale); lowest per-token cosine " +
                  fmt_num(min_cos, 4)}};
}

// Each token the reference times its own factor (direction kept per token): a normalization.
Found rule_token_scale(const Ctx& c) {
  const Metrics& m = c.m;
  if (!c.per_token || c.T < 2) return std::nullopt;
  double min_cos = 1, rmin = 1e300, rmax = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    min_cos = std::min(min_cos, m.token_cos[t]);
    rmin = std::min(rmin, m.token_norm_ratio[t]);
    rmax = std::max(rmax, m.token_norm_ratio[t]);
  }
  if (!(min_cos > 0.98)) return std::nullopt;
  // How much of each token's error the scale explains: the rest, orthogonal to the reference, is ‖a_t‖²(1 − cos²).
  std::vector<double> orth;
  for (int64_t t = 0; t < c.T; ++t)
    if (m.token_rel[t] > 0)
      orth.push_back(m.token_norm_ratio[t] * m.token_norm_ratio[t] * (1 - m.token_cos[t] * m.token_cos[t]) /
                     (m.token_rel[t] * m.token_rel[t]));
  if (orth.empty()) return std::nullopt;
  std::nth_element(orth.begin(), orth.begin() + orth.size() / 2, orth.end());
  const double orth_med = orth[orth.size() / 2];
  std::vector<std::string> ev{"every token's direction agrees (lowest per-token cosine " + fmt_num(min_cos, 6) +
                                  "); per-token norm ratios " + fmt_num(rmin, 4) + " to " + fmt_num(rmax, 4),
                              "the scale explains " + percent(std::max(0.0, 1 - orth_med)) +
                                  " of a token's error energy (median over tokens)"};
  // The factors differ by more than a token's tolerance (a pure scale's agree to rounding).
  if (rmax / rmin > 1.0 + 2 * c.tol.token_rel && orth_med < 0.3) {
    const bool exact = min_cos > 1 - 1e-4;
    return Finding{std::string(exact ? "a per-token scale: " : "") + "content kept, scale per token off: a "
                   "normalization missing or wrong (RMSNorm skipped, over the wrong width, eps)" +
                   (exact ? "" : ", and per-channel factors as well (a norm's weight)"),
                   min_cos > 0.999 ? "high" : "medium", ev};
  }
  // The same factor for every token, yet not one direction overall: the off tokens scaled by a named constant.
  return std::nullopt;
}

// Norms kept, content different: the data moved (a permutation, a layout, a transpose).
Found rule_layout(const Ctx& c) {
  const Metrics& m = c.m;
  const double ratio_off = std::fabs(m.norm_ratio - 1.0);
  if (!(ratio_off < 0.25) || !(m.cosine < 0.9)) return std::nullopt;
  std::vector<std::string> ev{"norm ratio " + fmt_num(m.norm_ratio, 4) + " (norms kept) but cosine " + fmt_num(m.cosine, 3) +
                              " (content differs)" + (m.basis == "full" ? "" : ", from " + m.basis)};
  std::string heads;
  if (!m.head_rel.empty()) {
    const bool every = c.heads_off.size() == m.head_rel.size();
    ev.push_back(std::to_string(c.heads_off.size()) + " of " + std::to_string(m.head_rel.size()) + " heads off");
    heads = every ? "every head off; " : "";
  }
  bool reordered = false;
  if (c.channel_factors) {
    // A permutation of channels keeps each channel's energy, only elsewhere.
    std::vector<double> ea = m.channel_cand2, eb = m.channel_ref2;
    std::sort(ea.begin(), ea.end());
    std::sort(eb.begin(), eb.end());
    double d = 0, n = 0, direct = 0;
    for (int64_t ch = 0; ch < c.C; ++ch) {
      d += std::fabs(ea[ch] - eb[ch]);
      n += eb[ch];
      direct += std::fabs(m.channel_cand2[ch] - m.channel_ref2[ch]);
    }
    if (n > 0) {
      reordered = d / n < 0.02 && direct / n > 5 * (d / n);
      ev.push_back("sorted per-channel energies of candidate and reference differ by " + percent(d / n) +
                   ", channel by channel by " + percent(direct / n) +
                   (reordered ? " (the channels' energies are the reference's, in another order)" : ""));
    }
  }
  return Finding{heads + "norms plausible (ratio " + fmt_num(m.norm_ratio, 4) + ") but content differs (cosine " +
                     fmt_num(m.cosine, 3) + "): a permutation or layout (split order, transpose, stride)",
                 ratio_off < 0.05 || reordered ? "high" : "medium", ev};
}

}  // namespace mla::diagnose_detail
