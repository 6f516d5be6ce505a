// Drill-down maps and pattern rules. The rules read only measured errors and the batch layout, never the
// name of an injection: the zoo scores them on bugs they were not told about.
#include "harness/compare/diagnose.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
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

// Per-channel error sums in the order of the projection that wrote the probe: a projection's output rows are
// what a block-scaled weight groups into blocks, and some projections write two probes, split per head
// ([P | R] of q_b_proj or q_proj, [P | V] of kv_b_proj) or once ([L | R] of kv_a_proj), all of the same stage. Interleaving the two
// probes' maps per head restores the projection's row order; without the sibling, the probe's own row.
struct ChannelMap {
  std::vector<double> err2, ref2;
  int64_t per_head = 0;    // channels of one head in this order (0: no heads)
  int64_t lanes_a = 0, lanes_b = 0;  // the two probes' widths per head when interleaved (0: one probe)
  std::string what;        // "q_proj output (q_nope | q_pe per head)", or the probe's name
};

ChannelMap projection_channels(const ProbeResult& r, const Metrics& m, const CompareReport& all) {
  ChannelMap cm;
  cm.err2 = m.channel_err2;
  cm.ref2 = m.channel_ref2;
  cm.what = r.name;
  const int64_t N = static_cast<int64_t>(m.head_rel.size());
  if (N > 0) cm.per_head = static_cast<int64_t>(m.channel_err2.size()) / N;
  struct Pair {
    const char *first, *second;
  };
  static const Pair pairs[] = {{"q_nope", "q_pe"}, {"k_nope", "v"}, {"kv_c", "k_pe"}};
  for (const auto& p : pairs) {
    if (r.name != p.first && r.name != p.second) continue;
    const std::string other = r.name == p.first ? p.second : p.first;
    const Metrics* o = nullptr;
    for (const auto& x : all.results)
      if (x.layer == r.layer && x.name == other && !x.m.channel_err2.empty()) o = &x.m;
    if (!o || o->head_rel.size() != m.head_rel.size()) return cm;
    const Metrics& a = r.name == p.first ? m : *o;
    const Metrics& b = r.name == p.first ? *o : m;
    const int64_t heads = std::max<int64_t>(N, 1);
    const int64_t xa = static_cast<int64_t>(a.channel_err2.size()) / heads;
    const int64_t xb = static_cast<int64_t>(b.channel_err2.size()) / heads;
    cm.err2.clear();
    cm.ref2.clear();
    for (int64_t h = 0; h < heads; ++h) {
      cm.err2.insert(cm.err2.end(), a.channel_err2.begin() + h * xa, a.channel_err2.begin() + (h + 1) * xa);
      cm.err2.insert(cm.err2.end(), b.channel_err2.begin() + h * xb, b.channel_err2.begin() + (h + 1) * xb);
      cm.ref2.insert(cm.ref2.end(), a.channel_ref2.begin() + h * xa, a.channel_ref2.begin() + (h + 1) * xa);
      cm.ref2.insert(cm.ref2.end(), b.channel_ref2.begin() + h * xb, b.channel_ref2.begin() + (h + 1) * xb);
    }
    cm.per_head = N > 0 ? xa + xb : 0;
    cm.lanes_a = xa;
    cm.lanes_b = xb;
    cm.what = r.stage + " output (" + p.first + " | " + p.second + (N > 0 ? " per head)" : ")");
    return cm;
  }
  return cm;
}

// Error in aligned blocks of B channels: uniform inside a block, different from block to block. Measured on
// z = log rel_l2 of each channel, with variance-ratio (F) statistics, because with few tokens a channel's own
// error is noisy (a factor of ~2 between neighbours) and only many channels together show the blocks. Under
// no structure each F is about 1 (within a few times sqrt(2 / groups)):
//   blocks:   the B-blocks' means differ far more than the noise inside blocks allows;
//   boundary: inside each pair of neighbouring blocks the two differ (the edges are at B, not only at 2B);
//   inside:   a block's two halves do not differ (not at B/2 or finer, and not a smooth trend such as RoPE's
//             error growing with frequency, which halves would follow);
//   pairs:    at least a quarter of the pairs (and three) differ by four standard errors (one step, e.g. "the
//             first half of the channels", is one boundary, not blocks);
//   order:    the block levels jump around (von Neumann ratio of successive differences to the spread >= 1,
//             independent levels give 2): a trend or a step over the channels is not blocks.
// Heads probes: heads with different error levels are not blocks: a B that is a whole number of heads is not
// tried, nor one whose grid holds every edge of two interleaved probes' lanes, and the blocks must explain the
// variation better (a larger F) than these natural groups do: the heads, the two probes' lanes in each head
// (k_nope | v off by different amounts), and the same lane across heads (a pattern repeated in every head).
struct BlockShape {
  int64_t block = 0;
  double f_blocks = 0, f_boundary = 0, f_inside = 0;
  int64_t pairs = 0, pairs_differ = 0;
  double von_neumann = 0;
  std::vector<double> rel;  // rel_l2 per block
};

std::optional<BlockShape> find_block_shape(const ChannelMap& cm, double tol) {
  const int64_t C = static_cast<int64_t>(cm.err2.size());
  if (C == 0) return std::nullopt;
  // Floored at rel_l2 1e-7 (below any format's rounding) so that an exact channel is one low value, not an
  // unbounded outlier.
  std::vector<double> z(C);
  for (int64_t c = 0; c < C; ++c) {
    const double rel2 = cm.ref2[c] > 0 ? cm.err2[c] / cm.ref2[c] : (cm.err2[c] > 0 ? 1.0 : 0.0);
    z[c] = 0.5 * std::log(std::max(rel2, 1e-14));
  }
  // Sum of squares inside consecutive groups of g over the first n channels.
  auto within = [&](int64_t g, int64_t n) {
    double ss = 0;
    for (int64_t c0 = 0; c0 < n; c0 += g) {
      const double mean = std::accumulate(z.begin() + c0, z.begin() + c0 + g, 0.0) / g;
      for (int64_t c = c0; c < c0 + g; ++c) ss += (z[c] - mean) * (z[c] - mean);
    }
    return ss;
  };
  // The same F for other natural groups, of any sizes (group(c) numbers them in order): blocks must explain the
  // error better than the heads, or the lanes of two interleaved probes, do.
  auto f_of = [&](const std::function<int64_t(int64_t)>& group) {
    std::vector<double> sum, cnt;
    for (int64_t c = 0; c < C; ++c) {
      const auto g = static_cast<size_t>(group(c));
      if (g >= sum.size()) sum.resize(g + 1), cnt.resize(g + 1);
      sum[g] += z[c];
      cnt[g] += 1;
    }
    double within_ss = 0;
    for (int64_t c = 0; c < C; ++c) {
      const auto g = static_cast<size_t>(group(c));
      within_ss += std::pow(z[c] - sum[g] / cnt[g], 2);
    }
    const double k = static_cast<double>(sum.size());
    if (k < 2 || !(within_ss > 0)) return 0.0;
    return (within(C, C) - within_ss) / (k - 1) / (within_ss / (C - k));
  };
  double f_natural = 0;
  if (cm.per_head > 0 && C % cm.per_head == 0) {
    f_natural = f_of([&](int64_t c) { return c / cm.per_head; });
    if (cm.lanes_a > 0)
      f_natural = std::max(f_natural,
                           f_of([&](int64_t c) { return 2 * (c / cm.per_head) + (c % cm.per_head >= cm.lanes_a); }));
    // The same lane of every head (a pattern over a head's channels, repeated: RoPE's frequencies).
    f_natural = std::max(f_natural, f_of([&](int64_t c) { return c % cm.per_head; }));
  }
  for (int64_t B : {256, 128, 64, 32, 16, 8}) {
    if (cm.per_head > 0 && B % cm.per_head == 0) continue;
    // Every edge between two interleaved probes' lanes on the block grid: B-blocks are lane groups.
    if (cm.lanes_a > 0 && cm.lanes_a % B == 0 && cm.lanes_b % B == 0) continue;
    const int64_t n = C / (2 * B) * (2 * B), k = n / B;
    if (k < 6) continue;  // three pairs of blocks at least
    const double total = within(n, n), w2 = within(2 * B, n), w1 = within(B, n), wh = within(B / 2, n);
    if (!(w1 > 0) || !(wh > 0)) continue;
    BlockShape s;
    s.block = B;
    const double noise = w1 / static_cast<double>(n - k);  // per-channel variance inside blocks
    s.f_blocks = (total - w1) / (k - 1) / noise;
    s.f_boundary = (w2 - w1) / (k / 2) / noise;
    s.f_inside = (w1 - wh) / k / (wh / static_cast<double>(n - 2 * k));
    const double step = 4 * std::sqrt(noise * 2.0 / B);
    for (int64_t c0 = 0; c0 < n; c0 += 2 * B) {
      const double ma = std::accumulate(z.begin() + c0, z.begin() + c0 + B, 0.0) / B;
      const double mb = std::accumulate(z.begin() + c0 + B, z.begin() + c0 + 2 * B, 0.0) / B;
      ++s.pairs;
      s.pairs_differ += std::fabs(ma - mb) > step;
    }
    // Block levels in order: a weight's wrong block scales are independent from block to block, so successive
    // differences are as large as the spread (von Neumann ratio ~2); a trend or a single step gives ~0.
    std::vector<double> mu(k);
    for (int64_t b = 0; b < k; ++b) mu[b] = std::accumulate(z.begin() + b * B, z.begin() + (b + 1) * B, 0.0) / B;
    const double mu_mean = std::accumulate(mu.begin(), mu.end(), 0.0) / k;
    double succ = 0, spread = 0;
    for (int64_t b = 0; b < k; ++b) {
      spread += (mu[b] - mu_mean) * (mu[b] - mu_mean);
      if (b > 0) succ += (mu[b] - mu[b - 1]) * (mu[b] - mu[b - 1]);
    }
    s.von_neumann = spread > 0 ? succ / spread : 0;
    // Blocks inside a head, with the same levels in every head: a pattern over the head's lanes, not a weight's.
    double f_repeat = 0;
    if (cm.per_head > 0 && cm.per_head % B == 0 && C % cm.per_head == 0)
      f_repeat = f_of([&](int64_t c) { return c % cm.per_head / B; });
    s.rel = channel_block_rel(cm.err2, cm.ref2, B);
    const auto [lo, hi] = std::minmax_element(s.rel.begin(), s.rel.end());
    // The block errors must also differ by a factor: a constant error everywhere (a pure scale) has no blocks.
    if (s.f_blocks >= 10 && s.f_blocks > std::max(f_natural, f_repeat) && s.f_boundary >= 10 && s.f_inside <= 3 &&
        s.pairs_differ >= std::max<int64_t>(3, s.pairs / 4) && s.von_neumann >= 1 && *hi > tol && *hi >= 2 * *lo)
      return s;
  }
  return std::nullopt;
}

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
  // A replicated tensor whose ranks disagree: the gathered copy is the majority's, so the maps below may look
  // clean; the ranks' own stats say which copy is off.
  const std::string replica = "candidate: replicated probe differs on rank ";
  for (const auto& p : r.problems)
    if (p.rfind(replica, 0) == 0) {
      ev.push_back(p);
      const bool nonfinite = p.find("; NaN ") != std::string::npos;
      return say(std::string(nonfinite ? "NaN/Inf originates here, on one rank's copy of a replicated tensor"
                                       : "one rank's copy of a replicated tensor differs from the others") +
                     " (rank " + p.substr(replica.size(), p.find(' ', replica.size()) - replica.size()) +
                     "): replicas must be identical (a rank-local write, a missed broadcast, or a rank reading "
                     "another rank's buffer)",
                 "high");
    }
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

  // Block-shaped error in the output channels of a projection, where a block-scaled weight's error first shows
  // (before the scale rules: a few blocks with wrong scales also leave every token's direction nearly kept).
  const bool projection = r.stage.size() > 5 && r.stage.compare(r.stage.size() - 5, 5, "_proj") == 0;
  if (projection && !m.channel_err2.empty()) {
    const ChannelMap cm = projection_channels(r, m, all);
    if (const auto bs = find_block_shape(cm, tol.rel_l2)) {
      const auto [lo, hi] = std::minmax_element(bs->rel.begin(), bs->rel.end());
      ev.push_back("per-" + std::to_string(bs->block) + "-channel block rel_l2 of the " + cm.what + ": " +
                   fmt_num(*lo, 3) + " to " + fmt_num(*hi, 3) + " over " + std::to_string(bs->rel.size()) +
                   " blocks; between-block variation " + fmt_num(bs->f_blocks, 3) + "x the noise inside blocks, " +
                   "neighbouring blocks differ in " + std::to_string(bs->pairs_differ) + " of " +
                   std::to_string(bs->pairs) + " pairs, halves of a block agree (" + fmt_num(bs->f_inside, 2) +
                   "x the noise)");
      return say("block-shaped error: uniform within aligned blocks of " + std::to_string(bs->block) +
                     " output channels of the " + cm.what + ", different from block to block: a block-scaled "
                     "weight read with the wrong block scales (FP8 scale_inv transposed or misindexed, block size)",
                 bs->f_blocks >= 30 && bs->f_inside <= 2 ? "high" : "medium");
    }
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
