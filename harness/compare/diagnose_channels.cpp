// Diagnosis rules that read where across the tensor the error sits: ranks, block-shaped error over a
// projection's output channels, a few channels, a few heads.
#include "harness/compare/diagnose_internal.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

namespace mla::diagnose_detail {

namespace {

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

// Some ranks' shards off, every head of those ranks: a rank holds or reads the wrong slice.
Found rule_ranks(const Ctx& c) {
  const Metrics& m = c.m;
  if (m.rank_rel.size() < 2) return std::nullopt;
  std::vector<int64_t> bad;
  for (size_t k = 0; k < m.rank_rel.size(); ++k)
    if (m.rank_rel[k] > c.tol.rel_l2) bad.push_back(static_cast<int64_t>(k));
  if (bad.empty() || bad.size() == m.rank_rel.size()) return std::nullopt;
  std::vector<std::string> ev{"rank rel_l2: " + values(m.rank_rel)};
  const int64_t tp = static_cast<int64_t>(m.rank_rel.size());
  if (static_cast<int64_t>(m.head_rel.size()) == c.N && c.N > 0 && c.N % tp == 0) {
    // A bad head inside an otherwise good rank is one head's bug, not the rank's slice.
    const int64_t per = c.N / tp;
    int64_t heads_bad = 0;
    for (int64_t k : bad)
      for (int64_t h = k * per; h < (k + 1) * per; ++h) heads_bad += m.head_rel[h] > c.tol.rel_l2;
    ev.push_back(std::to_string(heads_bad) + " of the " + std::to_string(per * static_cast<int64_t>(bad.size())) +
                 " heads of those ranks off");
    if (4 * heads_bad < 3 * per * static_cast<int64_t>(bad.size())) return std::nullopt;
  }
  return Finding{"only ranks " + ranges(bad) + " off: sharding (a rank holds or reads the wrong slice)", "high", ev};
}

Found rule_blocks(const Ctx& c) {
  if (!c.projection || !c.channels) return std::nullopt;
  const ChannelMap cm = projection_channels(c.r, c.m, c.all);
  const auto bs = find_block_shape(cm, c.tol.rel_l2);
  if (!bs) return std::nullopt;
  const auto [lo, hi] = std::minmax_element(bs->rel.begin(), bs->rel.end());
  return Finding{"block-shaped error: uniform within aligned blocks of " + std::to_string(bs->block) +
                     " output channels of the " + cm.what + ", different from block to block: a block-scaled "
                     "weight read with the wrong block scales (FP8 scale_inv transposed or misindexed, block size)",
                 bs->f_blocks >= 30 && bs->f_inside <= 2 ? "high" : "medium",
                 {"per-" + std::to_string(bs->block) + "-channel block rel_l2 of the " + cm.what + ": " +
                  fmt_num(*lo, 3) + " to " + fmt_num(*hi, 3) + " over " + std::to_string(bs->rel.size()) +
                  " blocks; between-block variation " + fmt_num(bs->f_blocks, 3) + "x the noise inside blocks, " +
                  "neighbouring blocks differ in " + std::to_string(bs->pairs_differ) + " of " +
                  std::to_string(bs->pairs) + " pairs, halves of a block agree (" + fmt_num(bs->f_inside, 2) +
                  "x the noise)"}};
}

// Error energy in a few channels, the rest within tolerance: name them, with each one's factor.
Found rule_channels(const Ctx& c) {
  if (!c.channels || c.C < 4) return std::nullopt;
  const Metrics& m = c.m;
  const double err = std::accumulate(m.channel_err2.begin(), m.channel_err2.end(), 0.0);
  const double ref = std::accumulate(m.channel_ref2.begin(), m.channel_ref2.end(), 0.0);
  if (!(err > 0) || !(ref > 0)) return std::nullopt;
  // Named: channels above the tolerance on their own that carry a share of the error (a clean channel's rounding
  // may cross the tolerance by chance, but carries next to none of it). They must hold 90% of the error, be at most
  // a quarter of the channels, or lie in one contiguous range of at most half of them (the upper half's weights
  // misindexed), and leave the rest within the tolerance. A channel above the tolerance inside the range the named
  // ones span belongs to them even with a small share (a weight factor near 1 in a misindexed range).
  std::vector<char> above(c.C), share(c.C);
  int64_t lo = c.C, hi = -1;
  for (int64_t ch = 0; ch < c.C; ++ch) {
    above[ch] = m.channel_ref2[ch] > 0 ? m.channel_err2[ch] > c.tol.rel_l2 * c.tol.rel_l2 * m.channel_ref2[ch]
                                       : m.channel_err2[ch] > 0;
    share[ch] = above[ch] && m.channel_err2[ch] >= 1e-3 * err;
    if (share[ch]) lo = std::min(lo, ch), hi = std::max(hi, ch);
  }
  std::vector<int64_t> named;
  double acc = 0, rest_err = 0, rest_ref = 0;
  for (int64_t ch = 0; ch < c.C; ++ch) {
    if (share[ch] || (above[ch] && ch > lo && ch < hi && 2 * (hi - lo + 1) <= c.C)) {
      named.push_back(ch);
      acc += m.channel_err2[ch];
    } else {
      rest_err += m.channel_err2[ch];
      rest_ref += m.channel_ref2[ch];
    }
  }
  const double rest_rel = rest_ref > 0 ? std::sqrt(rest_err / rest_ref) : 0;
  const bool few = 4 * static_cast<int64_t>(named.size()) <= c.C;
  const bool one_range = !named.empty() && 2 * (named.back() - named.front() + 1) <= c.C;
  if (named.empty() || !(few || one_range) || acc < 0.9 * err || rest_rel > c.tol.rel_l2) return std::nullopt;
  // Most of a head's lanes are the head rule's.
  if (c.N > 1 && c.X > 0) {
    std::vector<int64_t> per_head(c.N);
    for (int64_t ch : named)
      if (2 * ++per_head[ch / c.X] > c.X) return std::nullopt;
  }
  std::vector<std::string> ev{std::to_string(named.size()) + " of " + std::to_string(c.C) + " channels hold " +
                                  percent(acc / err) + " of the error energy: " + channel_names(c, named),
                              "the other channels together rel_l2 " + fmt_num(rest_rel) + " (within the tolerance " +
                                  fmt_num(c.tol.rel_l2) + ")"};
  // Each named channel: the reference times a factor over every token?
  bool scaled = c.channel_factors;
  std::vector<double> factors;
  if (c.channel_factors) {
    std::string line;
    for (size_t i = 0; i < named.size(); ++i) {
      const double f = channel_factor(m, named[i]), cs = channel_cos(m, named[i]);
      factors.push_back(f);
      scaled &= std::fabs(cs) > 1 - 1e-4;  // a negated channel has cosine -1
      if (i < 8)
        line += (i ? "; " : "") + channel_names(c, {named[i]}) + ": candidate = " + fmt_num(f, 4) +
                " x reference (cosine over tokens " + fmt_num(cs, 6) + ")";
    }
    ev.push_back(line + (named.size() > 8 ? "; ..." : ""));
  }
  // The same lanes in every head (a pattern of a head's layout), a contiguous group, or one channel.
  std::string where = channel_names(c, named);
  if (c.N > 1 && c.X > 0 && static_cast<int64_t>(named.size()) % c.N == 0) {
    std::vector<int64_t> lanes;
    for (int64_t ch : named)
      if (ch / c.X == 0) lanes.push_back(ch);
    bool every = static_cast<int64_t>(lanes.size()) * c.N == static_cast<int64_t>(named.size());
    for (int64_t ch : named) every &= std::binary_search(lanes.begin(), lanes.end(), ch % c.X);
    if (every && !lanes.empty()) where = std::string(lanes.size() == 1 ? "lane " : "lanes ") + ranges(lanes) + " of every head";
  }
  std::string what = named.size() == 1 ? "a single channel off (" + where + ")"
                                       : "a channel group off (" + where + ")";
  if (scaled) {
    const auto [lo, hi] = std::minmax_element(factors.begin(), factors.end());
    what += ", scaled: the reference times " +
            (*hi - *lo < 1e-2 * std::fabs(*hi) ? fmt_num(*lo, 3) : fmt_num(*lo, 3) + " to " + fmt_num(*hi, 3)) +
            " over every token";
  }
  return Finding{what + "; every other channel within tolerance: " +
                     (named.size() == 1 ? "that channel's weight row, scale or index" : "those channels' weight rows, scales or indices"),
                 scaled || named.size() == 1 ? "high" : "medium", ev};
}

// Error in a few heads, the others within tolerance: name them.
Found rule_heads(const Ctx& c) {
  const Metrics& m = c.m;
  if (c.N < 2 || static_cast<int64_t>(m.head_rel.size()) != c.N) return std::nullopt;
  const auto& bad = c.heads_off;
  if (bad.empty() || static_cast<int64_t>(bad.size()) == c.N) return std::nullopt;
  // The other heads well below the ones off (not a spread of errors cut by the tolerance).
  double quiet = 0, loud = 1e300;
  for (int64_t h = 0; h < c.N; ++h) {
    if (std::binary_search(bad.begin(), bad.end(), h)) loud = std::min(loud, m.head_rel[h]);
    else quiet = std::max(quiet, m.head_rel[h]);
  }
  if (quiet * 3 > loud) return std::nullopt;
  std::vector<std::string> ev{"head rel_l2: " + values(m.head_rel, 3, 32)};
  if (c.channels && c.X > 0) {
    double in = 0, err = 0;
    for (int64_t ch = 0; ch < c.C; ++ch) {
      err += m.channel_err2[ch];
      if (std::binary_search(bad.begin(), bad.end(), ch / c.X)) in += m.channel_err2[ch];
    }
    if (err > 0)
      ev.push_back((bad.size() == 1 ? "head " : "heads ") + ranges(bad) + (bad.size() == 1 ? " holds " : " hold ") +
                   percent(in / err) + " of the error energy");
  }
  ev.push_back(std::to_string(c.n_off) + " of " + std::to_string(c.T) + " tokens off");
  // Inside the heads that are off: the same norms with other content (wrong data read: an offset, a split order, a
  // stride, or another head's weights), or the content kept at another scale.
  std::string cause = bad.size() == 1 ? "that head's weights or slice (a head index, a per-head offset or stride)"
                                      : "those heads' weights or slice (a head offset or a slice boundary: the heads "
                                        "of one tile or range)";
  if (c.channel_factors && c.X > 0) {
    double aa = 0, bb = 0, ab = 0;
    for (int64_t ch = 0; ch < c.C; ++ch)
      if (std::binary_search(bad.begin(), bad.end(), ch / c.X)) {
        aa += m.channel_cand2[ch];
        bb += m.channel_ref2[ch];
        ab += m.channel_dot[ch];
      }
    if (aa > 0 && bb > 0) {
      const double nr = std::sqrt(aa / bb), cs = ab / std::sqrt(aa * bb);
      ev.push_back("inside " + std::string(bad.size() == 1 ? "that head" : "those heads") + ": norm ratio " +
                   fmt_num(nr, 4) + ", cosine " + fmt_num(cs, 4));
      if (std::fabs(nr - 1) < 0.25 && cs < 0.5)
        cause = "norms kept, content replaced: the wrong data read there (a layout, offset or stride such as a split "
                "order, or another head's weights)";
      else if (cs > 1 - 1e-3)
        cause = "content kept at another scale (x" + fmt_num(nr, 4) + "): a per-head scale";
    }
  }
  const bool block = bad.back() - bad.front() + 1 == static_cast<int64_t>(bad.size());
  const std::string others = "; the other " + std::to_string(c.N - static_cast<int64_t>(bad.size())) + " within tolerance): ";
  if (bad.size() == 1)
    return Finding{"a single head off (head " + std::to_string(bad[0]) + others + cause, "high", ev};
  if (block)
    return Finding{"a head block off (heads " + ranges(bad) + " of " + std::to_string(c.N) + ", contiguous" + others + cause,
                   "high", ev};
  return Finding{"some heads off (heads " + ranges(bad) + " of " + std::to_string(c.N) + others + cause, "medium", ev};
}

}  // namespace mla::diagnose_detail
