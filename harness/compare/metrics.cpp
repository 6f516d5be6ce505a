// The metrics of two gathered tensors and their verdict: per-token, per-head, per-rank and channel-group errors
// from full tensors, estimates from sketches or bounds from norms when a side lacks them; a probe's tolerance, and
// judge (the verdict against it).
#include "harness/compare/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>


namespace mla {

std::string Coord::to_string() const {
  std::ostringstream os;
  os << "layer " << layer;
  if (rank >= 0) os << " rank " << rank;
  if (token >= 0) os << " token " << token;
  if (head >= 0) os << " head " << head;
  if (channel >= 0) os << " channel " << channel;
  return os.str();
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Verdict_pass: return "pass";
    case Verdict::Verdict_diverge: return "DIVERGE";
    case Verdict::Verdict_missing: return "missing";
    case Verdict::Verdict_nonfinite: return "NAN/INF";
  }
  return "?";
}

Tolerance ToleranceModel::for_probe(const std::string& name, int layer) const {
  Tolerance t = fallback;
  if (auto it = per_probe.find(std::to_string(layer) + "/" + name); it != per_probe.end()) t = it->second;
  else if (auto it2 = per_probe.find(name); it2 != per_probe.end()) t = it2->second;
  if (auto o = overrides.find(name); o != overrides.end()) {
    // The worst token keeps the calibrated ratio of token to whole (a single token is noisier than the whole).
    const double token_factor = t.rel_l2 > 0 ? std::max(1.0, t.token_rel / t.rel_l2) : 4.0;
    t.rel_l2 = o->second;
    t.token_rel = o->second * token_factor;
    t.origin = "--tol " + name + "=" + std::to_string(o->second) + " (override)";
  }
  return t;
}

namespace {

// Per-token, per-head, per-rank and channel-group relative errors of two global tensors.
Metrics full_metrics(const Tensor& a, const Tensor& b, const DumpProbe& p, int layer, int tp_a, const CompareOptions& opt) {
  Metrics m;
  m.basis = "full";
  const int64_t T = p.shape.empty() ? 1 : p.shape[0];
  const int64_t row = a.numel() / std::max<int64_t>(T, 1);
  const int64_t N = p.heads_axis >= 0 ? p.shape[p.heads_axis] : 0;
  const int64_t X = N > 0 ? row / N : row;  // channels per head (or per row)
  const int64_t last = p.shape.back();
  double dd = 0, bb = 0, aa = 0, ab = 0;
  std::vector<double> tok_d(T), tok_b(T), tok_a(T), tok_ab(T), head_d(N), head_b(N), rank_d(tp_a), rank_b(tp_a);
  std::vector<char> tok_nonfinite(T, 0);
  std::vector<double> th_d(T * N), th_b(T * N);
  m.channel_err2.assign(row, 0.0);
  m.channel_ref2.assign(row, 0.0);
  m.channel_cand2.assign(row, 0.0);
  m.channel_dot.assign(row, 0.0);
  auto coord_of = [&](int64_t t, int64_t c) {
    const int64_t h = N > 0 ? c / X : -1;
    return Coord{layer, N > 0 ? static_cast<int>(h / (N / tp_a)) : -1, t, h, N > 0 ? c % X : c};
  };
  double nope_d = 0, nope_b = 0, rope_d = 0, rope_b = 0, h1_d = 0, h1_b = 0, h2_d = 0, h2_b = 0;
  int64_t mismatches = 0, compared = 0;
  // Element by element, in element order: every sum below is added to in the order of that walk. The sums of the
  // row, the head and the rank an element belongs to are held in locals while their elements go by (the same
  // additions in the same order, without a load and a store through memory for each).
  std::vector<int> rank_of_head(N, 0);
  if (N > 0 && tp_a > 0 && N / tp_a > 0)
    for (int64_t h = 0; h < N; ++h) rank_of_head[h] = static_cast<int>(h / (N / tp_a));
  const int64_t segments = N > 0 ? N : 1, width = N > 0 ? X : row;
  for (int64_t t = 0; t < T; ++t) {
    double td = 0, tb = 0, ta = 0, tab = 0;
    int64_t ch = 0;  // the element's index along the last axis
    for (int64_t seg = 0; seg < segments; ++seg) {
      const int64_t h = N > 0 ? seg : -1;
      const int r = N > 0 ? rank_of_head[seg] : 0;
      double hd = N > 0 ? head_d[h] : 0, hb = N > 0 ? head_b[h] : 0, thd = 0, thb = 0;
      double rd = N > 0 ? rank_d[r] : 0, rb = N > 0 ? rank_b[r] : 0;
      for (int64_t j = 0; j < width; ++j) {
        const int64_t c = seg * width + j, i = t * row + c;
        const int64_t chv = ch;
        if (++ch == last) ch = 0;
        const double x = a.data[i], y = b.data[i];
        const bool fx = std::isfinite(x), fy = std::isfinite(y);
        if (!fx || !fy) {
          m.nan_a += std::isnan(x);
          m.nan_b += std::isnan(y);
          m.inf_a += std::isinf(x);
          m.inf_b += std::isinf(y);
          if (fx != fy || (!fx && !fy && !(std::isnan(x) && std::isnan(y)) && x != y)) {
            if (m.nonfinite_agree) {
              Coord at{layer, N > 0 && tp_a > 0 ? static_cast<int>(h / (N / tp_a)) : -1, t, h, N > 0 ? c % X : c};
              std::ostringstream os;
              os << (std::isnan(x) ? "NaN" : std::isinf(x) ? (x > 0 ? "+inf" : "-inf") : std::to_string(x)) << " vs "
                 << (std::isnan(y) ? "NaN" : std::isinf(y) ? (y > 0 ? "+inf" : "-inf") : std::to_string(y)) << " at "
                 << at.to_string();
              m.first_nonfinite = os.str();
            }
            m.nonfinite_agree = false;
            tok_nonfinite[t] = 1;
          }
          continue;  // both non-finite the same way, or not comparable
        }
        const double d = x - y;
        dd += d * d;
        bb += y * y;
        aa += x * x;
        ab += x * y;
        td += d * d;
        tb += y * y;
        ta += x * x;
        tab += x * y;
        m.channel_err2[c] += d * d;
        m.channel_ref2[c] += y * y;
        m.channel_cand2[c] += x * x;
        m.channel_dot[c] += x * y;
        if (N > 0) {
          hd += d * d;
          hb += y * y;
          thd += d * d;
          thb += y * y;
          rd += d * d;
          rb += y * y;
        }
        if (p.rope_from >= 0) {
          (chv >= p.rope_from ? rope_d : nope_d) += d * d;
          (chv >= p.rope_from ? rope_b : nope_b) += y * y;
        }
        (chv < last / 2 ? h1_d : h2_d) += d * d;
        (chv < last / 2 ? h1_b : h2_b) += y * y;
        ++compared;
        if (std::fabs(d) > opt.atol + opt.rtol * std::fabs(y)) ++mismatches;
        if (std::fabs(d) > m.max_abs) {
          m.max_abs = std::fabs(d);
          m.max_at = coord_of(t, c);
          m.a_at_max = x;
          m.b_at_max = y;
        }
        if (d != 0 && (m.worst.size() < 8 || std::fabs(d) > std::fabs(m.worst.back().a - m.worst.back().b))) {
          Metrics::Element e{coord_of(t, c), x, y};
          auto pos = std::find_if(m.worst.begin(), m.worst.end(),
                                  [&](const Metrics::Element& w) { return std::fabs(w.a - w.b) < std::fabs(d); });
          m.worst.insert(pos, e);
          if (m.worst.size() > 8) m.worst.pop_back();
        }
      }
      if (N > 0) {
        head_d[h] = hd;
        head_b[h] = hb;
        th_d[t * N + h] = thd;
        th_b[t * N + h] = thb;
        rank_d[r] = rd;
        rank_b[r] = rb;
      }
    }
    tok_d[t] = td;
    tok_b[t] = tb;
    tok_a[t] = ta;
    tok_ab[t] = tab;
  }
  m.rel_l2 = ratio_or_inf(std::sqrt(dd), std::sqrt(bb));
  m.nmse = ratio_or_inf(dd, bb);
  m.cosine = (aa > 0 && bb > 0) ? ab / std::sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
  m.norm_ratio = ratio_or_inf(std::sqrt(aa), std::sqrt(bb));
  m.mismatch = compared ? static_cast<double>(mismatches) / compared : 0.0;
  m.token_rel.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    // A token whose NaN/Inf the reference does not have is off, whatever its finite elements say.
    m.token_rel[t] = tok_nonfinite[t] ? INFINITY : ratio_or_inf(std::sqrt(tok_d[t]), std::sqrt(tok_b[t]));
    m.max_token_rel = std::max(m.max_token_rel, m.token_rel[t]);
    m.token_norm_ratio.push_back(ratio_or_inf(std::sqrt(tok_a[t]), std::sqrt(tok_b[t])));
    m.token_cos.push_back(tok_a[t] > 0 && tok_b[t] > 0 ? tok_ab[t] / std::sqrt(tok_a[t] * tok_b[t]) : 1.0);
  }
  for (int64_t h = 0; h < N; ++h) m.head_rel.push_back(ratio_or_inf(std::sqrt(head_d[h]), std::sqrt(head_b[h])));
  for (int64_t i = 0; i < T * N; ++i) m.token_head_rel.push_back(ratio_or_inf(std::sqrt(th_d[i]), std::sqrt(th_b[i])));
  if (N > 0)
    for (int r = 0; r < tp_a; ++r) m.rank_rel.push_back(ratio_or_inf(std::sqrt(rank_d[r]), std::sqrt(rank_b[r])));
  if (p.rope_from >= 0) {
    m.rope_rel = ratio_or_inf(std::sqrt(rope_d), std::sqrt(rope_b));
    if (p.rope_from > 0) m.nope_rel = ratio_or_inf(std::sqrt(nope_d), std::sqrt(nope_b));
  }
  m.first_half_rel = ratio_or_inf(std::sqrt(h1_d), std::sqrt(h1_b));
  m.second_half_rel = ratio_or_inf(std::sqrt(h2_d), std::sqrt(h2_b));
  return m;
}

// Without full tensors: sketches estimate the error (E‖Sx‖² = ‖x‖²); stats alone bound it from below.
Metrics sketch_metrics(const Gathered& a, const Gathered& b, const DumpProbe& p) {
  Metrics m;
  const int64_t T = p.shape.empty() ? 1 : p.shape[0];
  m.nan_a = a.nan;
  m.nan_b = b.nan;
  m.inf_a = a.inf;
  m.inf_b = b.inf;
  m.nonfinite_agree = a.nan == b.nan && a.inf == b.inf;
  if (!m.nonfinite_agree)
    m.first_nonfinite = "NaN/Inf counts differ: " + std::to_string(a.nan) + "/" + std::to_string(a.inf) + " vs " +
                        std::to_string(b.nan) + "/" + std::to_string(b.inf);
  // Equal counts can still sit at different places: a token whose norm is NaN (or Inf) on one side only.
  const auto kind = [](float v) { return std::isnan(v) ? 1 : std::isinf(v) ? 2 : 0; };
  for (int64_t t = 0; m.nonfinite_agree && t < T && t < static_cast<int64_t>(a.token_l2.size()) &&
                      t < static_cast<int64_t>(b.token_l2.size());
       ++t)
    if (kind(a.token_l2[t]) != kind(b.token_l2[t])) {
      static const char* names[] = {"finite", "NaN", "Inf"};
      m.nonfinite_agree = false;
      m.first_nonfinite = std::string("token ") + std::to_string(t) + " norm is " + names[kind(a.token_l2[t])] +
                          " vs " + names[kind(b.token_l2[t])] + " (NaN/Inf at different positions)";
    }
  if (a.l2 >= 0 && b.l2 >= 0) m.norm_ratio = ratio_or_inf(a.l2, b.l2);
  if (a.sketch && b.sketch && a.sketch_rows.size() == b.sketch_rows.size()) {
    m.basis = "sketch";
    double dd = 0, bb = 0, aa = 0, ab = 0;
    m.token_rel.assign(T, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      double td = 0, tb = 0;
      for (int k = 0; k < kSketchDim; ++k) {
        const double x = a.sketch_rows[t * kSketchDim + k], y = b.sketch_rows[t * kSketchDim + k];
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        td += (x - y) * (x - y);
        tb += y * y;
        aa += x * x;
        ab += x * y;
      }
      dd += td;
      bb += tb;
      m.token_rel[t] = ratio_or_inf(std::sqrt(td), std::sqrt(tb));
      m.max_token_rel = std::max(m.max_token_rel, m.token_rel[t]);
    }
    m.rel_l2 = ratio_or_inf(std::sqrt(dd), std::sqrt(bb));
    m.nmse = m.rel_l2 * m.rel_l2;
    m.cosine = (aa > 0 && bb > 0) ? ab / std::sqrt(aa * bb) : 1.0;
    if (a.l2 < 0 || b.l2 < 0) m.norm_ratio = ratio_or_inf(std::sqrt(aa), std::sqrt(bb));
  } else {
    m.basis = "stats (lower bound)";
    m.rel_l2 = b.l2 > 0 ? std::fabs(a.l2 - b.l2) / b.l2 : 0.0;
    m.token_rel.assign(T, 0.0);
    for (int64_t t = 0; t < T && t < static_cast<int64_t>(a.token_l2.size()) && t < static_cast<int64_t>(b.token_l2.size()); ++t) {
      m.token_rel[t] = ratio_or_inf(std::fabs(a.token_l2[t] - b.token_l2[t]), b.token_l2[t]);
      m.max_token_rel = std::max(m.max_token_rel, m.token_rel[t]);
    }
  }
  // Per-head map from the norms (a lower bound of each head's error).
  if (!a.head_l2.empty() && a.head_l2.size() == b.head_l2.size() && p.heads_axis >= 0) {
    const int64_t N = p.shape[p.heads_axis];
    std::vector<double> na(N), nb(N);
    for (size_t i = 0; i < a.head_l2.size(); ++i) {
      na[i % N] += std::pow(a.head_l2[i] - b.head_l2[i], 2);
      nb[i % N] += std::pow(b.head_l2[i], 2);
    }
    for (int64_t h = 0; h < N; ++h) m.head_rel.push_back(ratio_or_inf(std::sqrt(na[h]), std::sqrt(nb[h])));
  }
  return m;
}

}  // namespace

std::vector<double> channel_block_rel(const std::vector<double>& err2, const std::vector<double>& ref2, int64_t block) {
  std::vector<double> rel;
  if (block <= 0 || err2.size() != ref2.size()) return rel;
  const int64_t C = static_cast<int64_t>(err2.size());
  for (int64_t c0 = 0; c0 < C; c0 += block) {
    double d = 0, n = 0;
    for (int64_t c = c0; c < std::min(C, c0 + block); ++c) {
      d += err2[c];
      n += ref2[c];
    }
    rel.push_back(ratio_or_inf(std::sqrt(d), std::sqrt(n)));
  }
  return rel;
}

Metrics compare_gathered(const Gathered& a, const Gathered& b, const DumpProbe& p, int layer, const CompareOptions& opt) {
  if (a.full && b.full && a.data.numel() == b.data.numel()) return full_metrics(a.data, b.data, p, layer, a.tp, opt);
  return sketch_metrics(a, b, p);
}

void judge(ProbeResult& r, const Gathered& candidate, const char* row) {
  std::ostringstream os;
  if (!r.m.nonfinite_agree) {
    r.verdict = Verdict::Verdict_nonfinite;
    os << "NaN/Inf positions differ: " << r.m.first_nonfinite;
  } else if (!(r.m.rel_l2 <= r.tol.rel_l2)) {
    r.verdict = Verdict::Verdict_diverge;
    os << "rel_l2 " << r.m.rel_l2 << " > " << r.tol.rel_l2;
  } else if (!(r.m.max_token_rel <= r.tol.token_rel)) {
    r.verdict = Verdict::Verdict_diverge;
    os << "worst " << row << " rel_l2 " << r.m.max_token_rel << " > " << r.tol.token_rel;
  } else if (!candidate.problems.empty()) {
    r.verdict = Verdict::Verdict_diverge;
    os << candidate.problems.front();
  } else {
    r.verdict = Verdict::Verdict_pass;
    os << "rel_l2 " << r.m.rel_l2 << " <= " << r.tol.rel_l2;
  }
  r.why = os.str();
}

}  // namespace mla
