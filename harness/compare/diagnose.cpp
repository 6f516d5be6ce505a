// Drill-down maps and pattern rules. The rules read only measured errors and the batch layout, never the
// name of an injection: the zoo scores them on bugs they were not told about.
#include "harness/compare/diagnose.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <optional>
#include <sstream>

#include "harness/compare/weight_diff.h"

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

namespace {

// What the rules read, measured once. Each rule looks for its own evidence in these and says which numbers it
// used; none assumes another rule has ruled something out, so that the order below only picks the most specific
// of several that fit.
struct Ctx {
  const ProbeResult& r;
  const Metrics& m;
  const Tolerance& tol;
  const Batch& batch;
  const CompareReport& all;
  int64_t T = 0, N = 0, C = 0, X = 0;  // tokens, heads, channels of a token's row, channels per head
  std::vector<char> off;               // token above the per-token tolerance
  int64_t n_off = 0;
  bool positions = false;        // the batch's layout is the probe's tokens
  bool per_token = false;        // per-token cosines and norm ratios
  bool channels = false;         // per-channel error sums
  bool channel_factors = false;  // per-channel Σa² and Σa·b too
  bool attention = false, rope_stage = false, norm_stage = false, projection = false;
  std::vector<int64_t> heads_off;
};

struct Finding {
  std::string pattern, confidence;
  std::vector<std::string> evidence;
};
using Found = std::optional<Finding>;

std::string percent(double f) { return fmt_num(100 * f, 3) + "%"; }

std::string values(const std::vector<double>& v, int precision = 3, size_t max_items = 16) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + fmt_num(v[i], precision);
  if (v.size() > max_items) s += ", ...";
  return s;
}

// Where the error points relative to the reference, in units of its own energy: (a−b)·b / ‖a−b‖², from the norm
// ratio and rel_l2 alone (‖a‖² = ‖b‖² + 2(a−b)·b + ‖a−b‖²). −1: the error is orthogonal to the candidate, which is
// the reference minus a part (a term of a sum missing); +1: the reference plus a part of itself (a term counted
// twice); 0: error unrelated to the reference (noise, a different tensor of the same size: ‖a‖² = ‖b‖² + ‖a−b‖²).
double part_index(double norm_ratio, double rel) {
  return rel > 0 ? (norm_ratio * norm_ratio - 1 - rel * rel) / (2 * rel * rel) : 0.0;
}

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

// Channels by name: "channels 8-15", or per head "head 2 lanes 0-3; head 5 lane 1".
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

// Per-channel factor of the candidate over the reference (least squares over tokens) and their cosine over tokens:
// a channel that is the reference times a constant has cosine 1.
double channel_factor(const Metrics& m, size_t c) { return m.channel_ref2[c] > 0 ? m.channel_dot[c] / m.channel_ref2[c] : 0; }
double channel_cos(const Metrics& m, size_t c) {
  const double n = std::sqrt(m.channel_cand2[c] * m.channel_ref2[c]);
  return n > 0 ? m.channel_dot[c] / n : (m.channel_cand2[c] == m.channel_ref2[c] ? 1.0 : 0.0);
}

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

// ---------------------------------------------------------------------------------------------------------------
// The rules.
// ---------------------------------------------------------------------------------------------------------------

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

}  // namespace

namespace {
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

Diagnosis diagnose(const ProbeResult& r, const Metrics& m, const Tolerance& tol, const Batch& batch,
                   const CompareReport& all) {
  Diagnosis dg = diagnose_pattern(r, m, tol, batch, all);
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

std::string fmt_num(double v, int precision) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
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

}  // namespace mla
