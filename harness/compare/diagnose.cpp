// The drill-down maps and the diagnosis: what the pattern rules read (measured once), their order, and the
// diagnosis of a report's first divergence. The rules themselves are in diagnose_<family>.cpp (diagnose_internal.h
// lists them); they read only measured errors and the batch layout, never the name of an injection: the zoo scores
// them on bugs they were not told about.
#include "harness/compare/diagnose.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "harness/compare/diagnose_internal.h"
#include "harness/compare/weight_diff.h"

namespace mla {

DrillDown drill_down(const ProbeResult& r, const Metrics& m, const Tolerance& tol) {
  DrillDown d;
  d.tokens = static_cast<int64_t>(m.token_rel.size());
  for (int64_t t = 0; t < d.tokens; ++t)
    if (m.token_rel[t] > tol.token_rel) d.tokens_off.push_back(t);
  d.heads = static_cast<int64_t>(m.head_rel.size());
  for (int64_t h = 0; h < d.heads; ++h)
    if (!(m.head_rel[h] <= tol.rel_l2)) d.heads_off.push_back(h);  // NaN: off
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
  // Per-head errors: measured on the full basis, or estimated per token and head from sketches (token_head_rel
  // given; the caller labels the estimate). Otherwise head_rel compares the heads' norms only, a lower bound (a
  // rotation inside a head leaves its norm): heads above it are off, the others unknown, so no count of them.
  const bool full = m.basis == "full";
  if (d.heads && (full || !m.token_head_rel.empty()))
    d.lines.push_back("heads:    " + count(d.heads_off.size(), d.heads, "off") +
                      (d.heads_off.empty() ? "" : " (" + ranges(d.heads_off) + ")"));
  else if (d.heads && d.heads_off.empty())
    d.lines.push_back("heads:    not available on the " + m.basis + " basis (the " + std::to_string(d.heads) +
                      " heads' norms agree; their errors need the full tensors: --full-probes)");
  else if (d.heads)
    d.lines.push_back("heads:    at least " + count(d.heads_off.size(), d.heads, "off") + " (" +
                      ranges(d.heads_off) + ", from their norms; the others are not available on the " + m.basis +
                      " basis)");
  // Tokens: the sketch estimates each token's error; stats compare the tokens' norms only (a lower bound).
  const bool token_bound = !full && m.basis != "sketch";
  if (d.tokens && !token_bound)
    d.lines.push_back("tokens:   " + count(d.tokens_off.size(), d.tokens, "off") +
                      (d.tokens_off.empty() ? "" : " (" + ranges(d.tokens_off) + ")"));
  else if (d.tokens && d.tokens_off.empty())
    d.lines.push_back("tokens:   not available on the " + m.basis + " basis (the " + std::to_string(d.tokens) +
                      " tokens' norms agree)");
  else if (d.tokens)
    d.lines.push_back("tokens:   at least " + count(d.tokens_off.size(), d.tokens, "off") + " (" +
                      ranges(d.tokens_off) + ", from their norms)");
  if (!d.channels.empty()) d.lines.push_back("channels: " + d.channels);
  if (r.contract == "partial" && !m.rank_rel.empty()) d.lines.back() += " (per-rank partial sums compared)";
  for (size_t i = 0; i < m.worst.size() && i < 5; ++i)
    d.lines.push_back("worst:    " + fmt_num(m.worst[i].a, 6) + " vs " + fmt_num(m.worst[i].b, 6) + " at " +
                      m.worst[i].at.to_string());
  return d;
}

namespace diagnose_detail {

// The helpers of diagnose_internal.h.
std::string percent(double f) { return fmt_num(100 * f, 3) + "%"; }

std::string values(const std::vector<double>& v, int precision, size_t max_items) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + fmt_num(v[i], precision);
  if (v.size() > max_items) s += ", ...";
  return s;
}

double part_index(double norm_ratio, double rel) {
  return rel > 0 ? (norm_ratio * norm_ratio - 1 - rel * rel) / (2 * rel * rel) : 0.0;
}

std::string channel_names(const Ctx& c, const std::vector<int64_t>& sorted) {
  if (c.N <= 0 || c.X <= 0) return (sorted.size() == 1 ? "channel " : "channels ") + ranges(sorted);
  std::string s;
  size_t i = 0, items = 0;
  while (i < sorted.size()) {
    const int64_t h = sorted[i] / c.X;
    std::vector<int64_t> lanes;
    for (; i < sorted.size() && sorted[i] / c.X == h; ++i) lanes.push_back(sorted[i] % c.X);
    if (items++ == 6) return s + "; ...";
    s += (s.empty() ? "" : "; ") + std::string("head ") + std::to_string(h) + (lanes.size() == 1 ? " lane " : " lanes ") +
         ranges(lanes);
  }
  return s;
}

double channel_factor(const Metrics& m, size_t c) { return m.channel_ref2[c] > 0 ? m.channel_dot[c] / m.channel_ref2[c] : 0; }
double channel_cos(const Metrics& m, size_t c) {
  const double n = std::sqrt(m.channel_cand2[c] * m.channel_ref2[c]);
  return n > 0 ? m.channel_dot[c] / n : (m.channel_cand2[c] == m.channel_ref2[c] ? 1.0 : 0.0);
}

namespace {

// Nothing fits: say where the error sits.
std::vector<std::string> where_it_sits(const Ctx& c) {
  const Metrics& m = c.m;
  std::vector<std::string> ev;
  if (c.n_off > 0) {
    std::vector<int64_t> bad;
    for (int64_t t = 0; t < c.T; ++t)
      if (c.off[t]) bad.push_back(t);
    ev.push_back("tokens off: " + ranges(bad) + (c.n_off == c.T ? " (all)" : ""));
  }
  if (c.N > 0) ev.push_back("heads off: " + (c.heads_off.empty() ? std::string("none above tolerance") : ranges(c.heads_off)) +
                            " of " + std::to_string(c.N));
  if (c.channels) {
    std::vector<double> e = m.channel_err2;
    std::sort(e.rbegin(), e.rend());
    const double err = std::accumulate(e.begin(), e.end(), 0.0);
    double acc = 0;
    int64_t k = 0;
    while (k < c.C && acc < 0.5 * err) acc += e[k++];
    if (err > 0)
      ev.push_back("half of the error energy in " + std::to_string(k) + " of " + std::to_string(c.C) + " channels");
  }
  if (c.per_token) {
    const auto [clo, chi] = std::minmax_element(m.token_cos.begin(), m.token_cos.end());
    const auto [rlo, rhi] = std::minmax_element(m.token_norm_ratio.begin(), m.token_norm_ratio.end());
    ev.push_back("per-token cosine " + fmt_num(*clo, 4) + " to " + fmt_num(*chi, 4) + ", norm ratio " + fmt_num(*rlo, 4) +
                 " to " + fmt_num(*rhi, 4));
  }
  ev.push_back("(a−b)·b / ‖a−b‖² = " + fmt_num(part_index(m.norm_ratio, m.rel_l2), 3) +
               " (−1 a part missing, +1 a part twice, 0 unrelated error)");
  return ev;
}

Diagnosis diagnose_pattern(const ProbeResult& r, const Metrics& m, const Tolerance& tol, const Batch& batch,
                           const CompareReport& all) {
  Diagnosis dg;
  auto& ev = dg.evidence;
  // A replicated tensor whose ranks disagree: the gathered copy is the majority's, so the maps below may look
  // clean; the ranks' own stats say which copy is off.
  const std::string replica = "candidate: replicated probe differs on rank ";
  for (const auto& p : r.problems)
    if (p.rfind(replica, 0) == 0) {
      ev.push_back(p);
      const bool nonfinite = p.find("; NaN ") != std::string::npos;
      dg.pattern = std::string(nonfinite ? "NaN/Inf originates here, on one rank's copy of a replicated tensor"
                                         : "one rank's copy of a replicated tensor differs from the others") +
                   " (rank " + p.substr(replica.size(), p.find(' ', replica.size()) - replica.size()) +
                   "): replicas must be identical (a rank-local write, a missed broadcast, or a rank reading "
                   "another rank's buffer)";
      dg.confidence = "high";
      return dg;
    }
  if (r.selection) {  // DSA's topk: compared as sets of keys; the pattern is over the tokens that differ
    ev.push_back(r.why);
    if (r.near_tie_swaps > 0)
      ev.push_back(std::to_string(r.near_tie_swaps) + " swaps between near-tied keys besides (not divergences)");
    dg.pattern = "the selection differs: " + selection_pattern_meaning(r.selection_pattern, r.selection_shift);
    dg.confidence = r.selection_pattern == SelectionPattern::SelectionPattern_scattered ? "medium" : "high";
    return dg;
  }
  if (!m.nonfinite_agree) {
    ev.push_back(m.first_nonfinite);
    dg.pattern = "NaN/Inf originates here (" + m.first_nonfinite + "); everything downstream inherits it";
    dg.confidence = "high";
    return dg;
  }

  Ctx c{r, m, tol, batch, all};
  c.T = static_cast<int64_t>(m.token_rel.size());
  c.N = static_cast<int64_t>(m.head_rel.size());
  c.C = static_cast<int64_t>(m.channel_err2.size());
  c.X = c.N > 0 && c.C % c.N == 0 ? c.C / c.N : 0;
  c.off.resize(c.T);
  for (int64_t t = 0; t < c.T; ++t) c.n_off += c.off[t] = m.token_rel[t] > tol.token_rel;
  c.positions = c.T == batch.tokens() && static_cast<int64_t>(batch.token_seq.size()) == c.T && c.T > 0;
  c.per_token = static_cast<int64_t>(m.token_cos.size()) == c.T && static_cast<int64_t>(m.token_norm_ratio.size()) == c.T;
  c.channels = c.C > 0 && m.channel_ref2.size() == m.channel_err2.size();
  c.channel_factors = c.channels && m.channel_cand2.size() == m.channel_err2.size() &&
                      m.channel_dot.size() == m.channel_err2.size();
  c.attention = r.stage.rfind("attention", 0) == 0 || r.name == "lse" || r.name == "attn_latent";
  // DSA's indexer_q and indexer_k rotate their heads' leading lanes, and indexer_k normalizes its rows first.
  c.rope_stage = r.stage == "rope" || r.stage == "indexer_q" || r.stage == "indexer_k";
  c.norm_stage = (r.stage.size() > 5 && r.stage.compare(r.stage.size() - 5, 5, "_norm") == 0) || r.stage == "indexer_k";
  c.projection = r.stage.size() > 5 && r.stage.compare(r.stage.size() - 5, 5, "_proj") == 0;
  for (int64_t h = 0; h < c.N; ++h)
    if (m.head_rel[h] > tol.rel_l2) c.heads_off.push_back(h);

  ev.push_back("rel_l2 " + fmt_num(m.rel_l2) + " (tolerance " + fmt_num(tol.rel_l2) + "), cosine " +
               fmt_num(m.cosine, 6) + ", norm ratio " + fmt_num(m.norm_ratio, 5));
  ev.push_back(std::to_string(c.n_off) + " of " + std::to_string(c.T) + " tokens above the per-token tolerance " +
               fmt_num(tol.token_rel));

  auto take = [&](Finding f) {
    dg.pattern = std::move(f.pattern);
    dg.confidence = std::move(f.confidence);
    ev.insert(ev.end(), f.evidence.begin(), f.evidence.end());
    return dg;
  };
  if (m.norm_ratio < 0.05 && (m.norm_ratio == 0 || m.cosine < 0.99)) {
    // Small beside the reference but another probe of this layer (h_out = o, next to a large h): a term dropped,
    // not a missing write.
    if (m.norm_ratio > 0)
      if (Found f = rule_neighbour_equal(c)) return take(std::move(*f));
    return take({"the candidate's tensor is (nearly) all zeros: a write that never happened (an empty cache row, "
                 "a kernel that did not run)", "high", {"norm ratio ‖a‖/‖b‖ " + fmt_num(m.norm_ratio, 4)}});
  }
  // Most specific first: a rule that names the rows, ranks or channels before one that names a shape of the whole.
  static Found (*const rules[])(const Ctx&) = {
      rule_unwritten, rule_index_mask, rule_index_combine, rule_sequences, rule_ranks, rule_all_reduce, rule_blocks,
      rule_rope,      rule_channels,  rule_scale,         rule_channel_scale, rule_token_scale, rule_norm_missing,
      rule_softmax,   rule_positions, rule_heads,         rule_neighbour_part, rule_scattered,
      rule_sum_part,  rule_layout,
  };
  for (auto rule : rules)
    if (Found f = rule(c)) return take(std::move(*f));
  const auto facts = where_it_sits(c);
  ev.insert(ev.end(), facts.begin(), facts.end());
  dg.pattern = "no known pattern";
  dg.confidence = "low";
  return dg;
}

}  // namespace
}  // namespace diagnose_detail

Diagnosis diagnose(const ProbeResult& r, const Metrics& m, const Tolerance& tol, const Batch& batch,
                   const CompareReport& all) {
  Diagnosis dg = diagnose_detail::diagnose_pattern(r, m, tol, batch, all);
  dg.fit = dg.confidence;
  dg.confidence = "unconfirmed";
  dg.rule_pattern = dg.pattern;
  return dg;
}

std::string diagnosis_label(const Diagnosis& d) {
  if (d.confidence == "confirmed") return "confirmed by re-running the stage";
  if (d.confidence == "measured") return "measured";
  return "unconfirmed pattern" + (d.fit.empty() ? std::string() : ", fits its evidence: " + d.fit);
}

std::optional<Findings> explain_first_divergence(const CompareReport& rep, const Batch& batch) {
  if (rep.first_divergence < 0) return std::nullopt;
  const ProbeResult& r = rep.results[rep.first_divergence];
  Findings f;
  f.drill = drill_down(r, r.m, r.tol);
  f.diagnosis = diagnose(r, r.m, r.tol, batch, rep);
  if (const ProbeResult* w = weight_cause(rep, r)) blame_weight(f.diagnosis, *w);
  return f;
}

Batch batch_of(const Dump& reference, const Dump& candidate) {
  if (reference.has_inputs) return reference.inputs.batch;
  if (candidate.has_inputs) return candidate.inputs.batch;
  for (const Dump* d : {&reference, &candidate}) {
    if (d->meta.run_options.is_null()) continue;
    try {
      return make_batch(d->spec());
    } catch (const std::exception&) {
      // No layout: the diagnoses that read positions say less.
    }
  }
  return {};
}

void blame_weight(Diagnosis& d, const ProbeResult& weight) {
  std::vector<std::string> ev = {weight_sentence(weight)};
  for (const auto& e : weight.evidence) ev.push_back("weight: " + e);
  if (!d.pattern.empty()) ev.push_back("the probe itself shows: " + d.pattern);
  for (auto& e : d.evidence) ev.push_back(e);
  d.pattern = "weight " + weight.name + " differs: " + (weight.pattern.empty() ? weight.why : weight.pattern);
  d.confidence = "measured";
  d.fit = "high";
  d.evidence = std::move(ev);
}

}  // namespace mla
