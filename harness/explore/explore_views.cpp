// The explorer's views of one probe: its card of metrics, drill-down and diagnosis (show), bar charts per head,
// token, rank and channel group, the token x head heat map, slices of values and the worst elements. Element-level
// pictures read the gathered full tensors when both dumps hold them and say so when they fall back to norms or
// sketches.
#include "harness/explore/explore.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>

#include "harness/compare/diagnose.h"
#include "core/model/errors.h"
#include "harness/report/heatmap.h"
#include "harness/explore/explore_internal.h"

namespace mla {

namespace {

// A probe's global row layout: T rows of `row` values; with a heads axis, N heads of X channels each.
struct Layout {
  int64_t T = 1, row = 0, N = 0, X = 0;
  int tp = 1;
  Coord coord(int layer, int64_t t, int64_t c) const {
    if (N <= 0) return Coord{layer, -1, t, -1, c};
    const int64_t h = c / X;
    return Coord{layer, static_cast<int>(h / std::max<int64_t>(1, N / tp)), t, h, c % X};
  }
};

Layout layout_of(const DumpProbe& p, int64_t numel, int tp) {
  Layout l;
  l.T = p.shape.empty() ? 1 : std::max<int64_t>(1, p.shape[0]);
  l.row = numel / l.T;
  l.N = p.heads_axis >= 0 ? p.shape[p.heads_axis] : 0;
  l.X = l.N > 0 ? l.row / l.N : l.row;
  l.tp = std::max(1, tp);
  return l;
}

std::string basis_words(const std::string& basis) {
  if (basis == "full") return "full tensors";
  if (basis == "sketch") return "sketches (an estimate, about +-25%)";
  return basis.empty() ? "-" : basis;
}

}  // namespace

void Explorer::cmd_show(int i) {
  const auto& r = rep_.results[i];
  const Metrics& m = metrics(i);
  const bool est = m.basis != "full";
  os_ << "layer " << r.layer << " " << r.name << ": stage " << r.stage << ", contract " << r.contract << ", shape "
      << shape_string(r.shape) << "   " << verdict_name(r.verdict)
      << (i == rep_.first_divergence ? "  (first divergence)" : "") << "\n";
  if (r.verdict == Verdict::Verdict_missing) {
    os_ << "  " << r.why << "\n";
    return;
  }
  const auto w = [](const char* s) { return explore_detail::pad(std::string("  ") + s, 14); };
  os_ << w("basis") << basis_words(m.basis) << "\n";
  const std::string tag = est ? "  [" + basis_label(i) + "]" : "";
  os_ << w("rel_l2") << fmt_num(m.rel_l2) << "   cosine " << fmt_num(m.cosine, 6) << "   norm ratio "
      << fmt_num(m.norm_ratio, 5) << "   nmse " << fmt_num(m.nmse) << tag << "\n";
  if (!m.token_rel.empty()) {
    const auto worst_t = std::max_element(m.token_rel.begin(), m.token_rel.end()) - m.token_rel.begin();
    os_ << w("worst token") << "rel_l2 " << fmt_num(m.max_token_rel) << " at token " << worst_t << tag << "\n";
  }
  if (m.basis == "full") {
    os_ << w("max |a-b|") << fmt_num(m.max_abs) << " at " << m.max_at.to_string() << " (candidate "
        << fmt_num(m.a_at_max, 6) << ", reference " << fmt_num(m.b_at_max, 6) << ")\n";
    os_ << w("mismatch") << fmt_num(100 * m.mismatch, 3) << "% of elements outside allclose(atol 1e-3, rtol 1e-2)\n";
  }
  os_ << w("NaN/Inf") << (m.nonfinite_agree ? "positions agree" : "DIFFER: " + m.first_nonfinite) << " (NaN "
      << m.nan_a << "/" << m.nan_b << ", Inf " << m.inf_a << "/" << m.inf_b << ")\n";
  os_ << w("tolerance") << "rel_l2 " << fmt_num(r.tol.rel_l2) << ", worst token " << fmt_num(r.tol.token_rel) << "\n";
  os_ << w("  origin") << r.tol.origin << "\n";
  os_ << w("verdict") << verdict_name(r.verdict) << ": " << r.why << (est && r.matched() ? tag : "") << "\n";
  for (auto& p : r.problems) os_ << w("problem") << p << "\n";
  const DrillDown dd = drill_down(r, m, r.tol);
  if (!dd.lines.empty()) {
    os_ << "drill-down" << (est ? " (" + basis_label(i) + ")" : "") << "\n";
    for (auto& l : dd.lines) {
      const bool counted = l.rfind("ranks:", 0) == 0 || l.rfind("heads:", 0) == 0 || l.rfind("tokens:", 0) == 0;
      os_ << "  " << l << (est && counted ? "  [" + basis_label(i) + "]" : "") << "\n";
    }
  }
  if (divergent(i)) {
    const Diagnosis dg = diagnose(r, m, r.tol, batch_, rep_);
    os_ << "diagnosis (" << diagnosis_label(dg) << (est ? ", on " + basis_label(i) : "")
        << "): " << dg.pattern << "\n";
    for (auto& e : dg.evidence) os_ << "  - " << e << "\n";
  }
}

void Explorer::cmd_heads(int i) {
  const auto& r = rep_.results[i];
  const auto& m = metrics(i);
  if (m.head_rel.empty()) {
    const DumpProbe* p = sides(i).spec;
    os_ << r.name << (p && p->heads_axis < 0 ? " has no heads axis (" + r.contract + " " + shape_string(r.shape) + ")"
                                             : ": no per-head map (needs full tensors or per-head norms)")
        << "\n";
    return;
  }
  const int64_t N = static_cast<int64_t>(m.head_rel.size());
  const int tp = std::max(1, sides(i).a.tp);
  os_ << "rel_l2 per head, layer " << r.layer << " " << r.name << " (" << basis_label(i);
  if (m.basis == "sketch")
    os_ << ": each head's norm error, plus its share of its " << (tp > 1 ? "rank's" : "token's")
        << " sketched error by ||a_h||*||b_h||; which heads of one " << (tp > 1 ? "rank" : "token")
        << " hold a norm-preserving error cannot be told apart without full tensors";
  os_ << ")\n";
  std::vector<int64_t> starts;
  const auto merged = merge_max(m.head_rel, style_.height, &starts);
  std::vector<Bar> bars;
  for (size_t k = 0; k < merged.size(); ++k) {
    const int64_t h0 = starts[k], h1 = k + 1 < starts.size() ? starts[k + 1] - 1 : N - 1;
    Bar b{h0 == h1 ? "head " + std::to_string(h0) : "heads " + std::to_string(h0) + "-" + std::to_string(h1),
          merged[k], ""};
    if (tp > 1) b.note = "rank " + std::to_string(h0 / std::max<int64_t>(1, N / tp));
    bars.push_back(b);
  }
  os_ << render_bars(bars, r.tol.rel_l2, style_.color, style_.width);
  const auto off = std::count_if(m.head_rel.begin(), m.head_rel.end(), [&](double v) { return !(v <= r.tol.rel_l2); });
  os_ << "  " << off << " of " << N << " heads off" << (m.basis == "full" ? "" : "  [" + basis_label(i) + "]") << "\n";
}

void Explorer::cmd_tokens(int i) {
  const auto& r = rep_.results[i];
  const auto& m = metrics(i);
  if (m.token_rel.empty()) {
    os_ << r.name << ": no per-token map\n";
    return;
  }
  const int64_t T = static_cast<int64_t>(m.token_rel.size());
  os_ << "rel_l2 per token, layer " << r.layer << " " << r.name << " ("
      << (m.basis == "sketch" ? basis_label(i) + ": each token's 32-lane sketch, about +-25%" : basis_label(i))
      << "; tolerance = worst-token tolerance)\n";
  std::vector<int64_t> starts;
  const auto merged = merge_max(m.token_rel, style_.height, &starts);
  const bool batch_ok = batch_.tokens() == T;
  std::vector<Bar> bars;
  for (size_t k = 0; k < merged.size(); ++k) {
    const int64_t t0 = starts[k], t1 = k + 1 < starts.size() ? starts[k + 1] - 1 : T - 1;
    Bar b{t0 == t1 ? "t " + std::to_string(t0) : "t " + std::to_string(t0) + "-" + std::to_string(t1), merged[k], ""};
    if (batch_ok) {
      b.note = "pos " + std::to_string(batch_.positions[t0]) + (t1 > t0 ? "-" + std::to_string(batch_.positions[t1]) : "");
      if (batch_.num_seqs() > 1) b.note += ", seq " + std::to_string(batch_.token_seq[t0]);
    }
    bars.push_back(b);
  }
  if (merged.size() < m.token_rel.size()) os_ << "(rows merged: the worst token of each is shown)\n";
  os_ << render_bars(bars, r.tol.token_rel, style_.color, style_.width);
}

void Explorer::cmd_ranks(int i) {
  const auto& r = rep_.results[i];
  const Sides& s = sides(i);
  std::vector<Bar> bars;
  std::string how;
  if (!r.m.rank_rel.empty()) {
    const int tp = static_cast<int>(r.m.rank_rel.size());
    const int64_t N = r.m.head_rel.size();
    for (int k = 0; k < tp; ++k) {
      Bar b{"rank " + std::to_string(k), r.m.rank_rel[k], ""};
      if (r.contract == "heads" && N > 0)
        b.note = "heads " + std::to_string(k * N / tp) + "-" + std::to_string((k + 1) * N / tp - 1);
      bars.push_back(b);
    }
    how = r.contract == "partial" ? "each rank's partial sum against the reference's" : "each rank's shard of heads";
  } else {
    // From the ranks' own records. Replicated: each candidate replica against the reference's rank 0. Heads and
    // partial sums: rank k against the reference's rank k, which needs the same tp on both sides.
    const DumpProbe* pa = cand_.find(r.layer, r.name);
    const DumpProbe* pb = ref_.find(r.layer, r.name);
    if (!pa || !pb || pb->ranks.empty()) {
      os_ << r.name << ": not in both dumps\n";
      return;
    }
    const bool replicated = r.contract == "replicated";
    if (!replicated && pa->ranks.size() != pb->ranks.size()) {
      os_ << r.name << " is held " << r.contract << " and the dumps ran different tp (" << pa->ranks.size() << " vs "
          << pb->ranks.size() << "): ranks are not comparable one to one; heads shows the per-head map\n";
      return;
    }
    const std::string what = replicated ? "each rank's replica against the reference's rank 0"
                                        : "each rank's " + std::string(r.contract == "heads" ? "shard" : "partial sum") +
                                              " against the reference's";
    for (size_t k = 0; k < pa->ranks.size(); ++k) {
      const ProbeRecord& ra = pa->ranks[k];
      const ProbeRecord& rb = pb->ranks[replicated ? 0 : k];
      double d2 = 0, b2 = 0;
      if (ra.data.numel() && ra.data.numel() == rb.data.numel()) {
        for (int64_t e = 0; e < ra.data.numel(); ++e) {
          d2 += std::pow(static_cast<double>(ra.data.data[e]) - rb.data.data[e], 2);
          b2 += std::pow(static_cast<double>(rb.data.data[e]), 2);
        }
        how = what + ", full tensors";
      } else if (!ra.sketch.empty() && ra.sketch.size() == rb.sketch.size()) {
        for (size_t e = 0; e < ra.sketch.size(); ++e) {
          d2 += std::pow(static_cast<double>(ra.sketch[e]) - rb.sketch[e], 2);
          b2 += std::pow(static_cast<double>(rb.sketch[e]), 2);
        }
        how = what + ", estimate (from sketches)";
      } else {
        d2 = std::pow(ra.l2 - rb.l2, 2);
        b2 = rb.l2 * rb.l2;
        how = what + ", lower bound (from norms)";
      }
      Bar bar{"rank " + std::to_string(k), rel_of_sums(d2, b2), ""};
      if (r.contract == "heads" && pa->heads_axis >= 0) {
        const int64_t N = pa->shape[pa->heads_axis], per = N / static_cast<int64_t>(pa->ranks.size());
        bar.note = "heads " + std::to_string(k * per) + "-" + std::to_string((k + 1) * per - 1);
      }
      bars.push_back(bar);
    }
  }
  os_ << "rel_l2 per rank, layer " << r.layer << " " << r.name << " (" << how << "; candidate tp " << s.a.tp << ")\n";
  os_ << render_bars(bars, r.tol.rel_l2, style_.color, style_.width);
  for (auto& p : r.problems) os_ << "  " << p << "\n";
}

void Explorer::cmd_channels(int i) {
  const auto& r = rep_.results[i];
  const Sides& s = sides(i);
  auto groups = [&] {
    const auto& m = r.m;
    if (m.rope_rel >= 0) os_ << "  rope lanes rel_l2 " << fmt_num(m.rope_rel) << "\n";
    if (m.nope_rel >= 0) os_ << "  latent (non-rope) lanes rel_l2 " << fmt_num(m.nope_rel) << "\n";
    if (m.first_half_rel >= 0)
      os_ << "  first half rel_l2 " << fmt_num(m.first_half_rel) << ", second half " << fmt_num(m.second_half_rel) << "\n";
    const DrillDown dd = drill_down(r, m, r.tol);
    if (!dd.channels.empty()) os_ << "  => " << dd.channels << "\n";
  };
  if (!s.full()) {
    os_ << "channels of layer " << r.layer << " " << r.name << ": a per-channel map needs full tensors in both dumps; "
        << how_to_get_full(i) << "\n";
    if (r.m.rope_rel >= 0 || r.m.first_half_rel >= 0) groups();
    return;
  }
  const Layout L = layout_of(*s.spec, s.b.data.numel(), s.a.tp);
  if (L.X <= 1) {
    os_ << r.name << " holds one value per " << (L.N > 0 ? "(token, head)" : "token") << ": no channel axis\n";
    return;
  }
  const int64_t C = L.X;
  std::vector<double> d2(C), b2(C);
  for (int64_t e = 0; e < s.b.data.numel(); ++e) {
    const double x = s.a.data.data[e], y = s.b.data.data[e];
    const int64_t c = (e % L.row) % C;
    if (std::isfinite(x) && std::isfinite(y)) {
      d2[c] += (x - y) * (x - y);
      b2[c] += y * y;
    } else if (std::isfinite(x) != std::isfinite(y)) {
      d2[c] = INFINITY;
    }
  }
  const int64_t max_rows = std::min<int64_t>(32, style_.height);
  const int64_t g = (C + max_rows - 1) / max_rows;
  std::vector<Bar> bars;
  for (int64_t c0 = 0; c0 < C; c0 += g) {
    const int64_t c1 = std::min(C, c0 + g) - 1;
    double sd = 0, sb = 0;
    for (int64_t c = c0; c <= c1; ++c) {
      sd += d2[c];
      sb += b2[c];
    }
    Bar b{c0 == c1 ? "c " + std::to_string(c0) : "c " + std::to_string(c0) + "-" + std::to_string(c1),
          std::isfinite(sd) ? rel_of_sums(sd, sb) : sd, ""};
    if (s.spec->rope_from > 0) b.note = c0 >= s.spec->rope_from ? "rope" : (c1 >= s.spec->rope_from ? "latent+rope" : "latent");
    bars.push_back(b);
  }
  os_ << "rel_l2 per channel" << (s.spec->rope_from == 0 ? " (all rope lanes)" : "") << (g > 1 ? " group (" + std::to_string(g) + " channels each)" : std::string()) << " of "
      << (L.N > 0 ? "each head" : "the row") << ", layer " << r.layer << " " << r.name << " (full tensors)\n";
  os_ << render_bars(bars, r.tol.rel_l2, style_.color, style_.width);
  groups();
}

void Explorer::cmd_heatmap(int i) {
  const auto& r = rep_.results[i];
  const Sides& s = sides(i);
  HeatGrid g;
  std::string what;
  if (s.full()) {
    const Layout L = layout_of(*s.spec, s.b.data.numel(), s.a.tp);
    g.rows = L.T;
    if (L.N > 0) {
      // Cell (t, h): ‖a−b‖/‖b‖ over the head's channels.
      g.cols = L.N;
      std::vector<double> d2(L.T * L.N), b2(L.T * L.N);
      std::vector<char> bad(L.T * L.N);
      for (int64_t e = 0; e < s.b.data.numel(); ++e) {
        const int64_t cell = (e / L.row) * L.N + (e % L.row) / L.X;
        const double x = s.a.data.data[e], y = s.b.data.data[e];
        if (std::isfinite(x) && std::isfinite(y)) {
          d2[cell] += (x - y) * (x - y);
          b2[cell] += y * y;
        } else if (std::isfinite(x) != std::isfinite(y) || (std::isnan(x) != std::isnan(y))) {
          bad[cell] = 1;
        }
      }
      for (size_t c = 0; c < d2.size(); ++c) g.v.push_back(bad[c] ? NAN : rel_of_sums(d2[c], b2[c]));
      what = "rel error per (token, head) over each head's " + std::to_string(L.X) + " channels, full tensors";
    } else {
      // No heads: token x channel, each element's |a−b| relative to the token's rms (a per-element ratio would
      // blow up wherever the reference happens to be near zero).
      g.cols = L.row;
      g.col_name = "channel";
      for (int64_t t = 0; t < L.T; ++t) {
        double b2 = 0;
        for (int64_t c = 0; c < L.row; ++c) {
          const double y = s.b.data.data[t * L.row + c];
          if (std::isfinite(y)) b2 += y * y;
        }
        const double rms = std::sqrt(b2 / std::max<int64_t>(1, L.row));
        for (int64_t c = 0; c < L.row; ++c) {
          const double x = s.a.data.data[t * L.row + c], y = s.b.data.data[t * L.row + c];
          if (std::isfinite(x) != std::isfinite(y)) g.v.push_back(NAN);
          else if (!std::isfinite(x)) g.v.push_back(0);
          else g.v.push_back(rms > 0 ? std::fabs(x - y) / rms : (x == y ? 0 : INFINITY));
        }
      }
      what = r.name + " has no heads axis: token x channel, |a-b| relative to the token's rms, full tensors";
    }
  } else if (const Metrics& m = metrics(i); s.spec && s.spec->heads_axis >= 0 && !m.token_head_rel.empty()) {
    const int64_t N = s.spec->shape[s.spec->heads_axis];
    g.rows = static_cast<int64_t>(m.token_head_rel.size()) / std::max<int64_t>(1, N);
    g.cols = N;
    g.v = m.token_head_rel;
    what = "rel error per (token, head), " + basis_label(i) +
           (m.basis == "sketch" ? ": each head's norm error plus its share of its shard's sketched error (heads explains)"
                                : ": each head's norm error");
  } else if (!r.m.token_rel.empty()) {
    g.rows = static_cast<int64_t>(r.m.token_rel.size());
    g.cols = 1;
    g.col_name = "all";
    g.v = r.m.token_rel;
    what = "per token only (" + basis_label(i) + "; no full tensors, no per-head norms)";
  } else {
    os_ << r.name << ": nothing to draw\n";
    return;
  }
  os_ << "heatmap of layer " << r.layer << " " << r.name << " " << shape_string(r.shape) << ": " << what
      << "; tolerance = worst-token tolerance " << fmt_num(r.tol.token_rel) << "\n";
  HeatStyle hs;
  hs.color = style_.color;
  hs.width = style_.width;
  hs.height = style_.height;
  hs.threshold = r.tol.token_rel;
  os_ << render_heatmap(g, hs);
}

void Explorer::cmd_slice(int i, const std::vector<std::string>& args) {
  const auto& r = rep_.results[i];
  const Sides& s = sides(i);
  if (!s.full()) {
    os_ << "slice needs full tensors in both dumps: these hold " << basis_words(r.m.basis) << "; " << how_to_get_full(i)
        << "\n";
    return;
  }
  const Layout L = layout_of(*s.spec, s.b.data.numel(), s.a.tp);
  int64_t t = r.m.max_at.token >= 0 ? r.m.max_at.token : 0, h = L.N > 0 ? std::max<int64_t>(0, r.m.max_at.head) : -1;
  int64_t c0 = 0, c1 = -1;
  bool t_given = false, h_given = false;
  for (const auto& a : args) {
    const auto eq = a.find('=');
    if (eq == std::string::npos) throw UsageError("slice: '" + a + "' is not KEY=VALUE (t=, h=, c=)");
    const std::string k = a.substr(0, eq), v = a.substr(eq + 1);
    if (k == "t" || k == "token") {
      t = explore_detail::to_int(v, "t");
      t_given = true;
    } else if (k == "h" || k == "head") {
      if (L.N <= 0) throw UsageError(r.name + " has no heads axis: leave out h=");
      h = explore_detail::to_int(v, "h");
      h_given = true;
    } else if (k == "c" || k == "channel" || k == "channels") {
      const auto colon = v.find(':');
      if (colon == std::string::npos) {
        c0 = explore_detail::to_int(v, "c");
        c1 = c0 + 1;
      } else {
        c0 = colon == 0 ? 0 : explore_detail::to_int(v.substr(0, colon), "c");
        c1 = colon + 1 == v.size() ? L.X : explore_detail::to_int(v.substr(colon + 1), "c");
      }
    } else {
      throw UsageError("slice: unknown key '" + k + "' (t=, h=, c=)");
    }
  }
  if (t < 0 || t >= L.T) throw UsageError("t=" + std::to_string(t) + " is outside 0.." + std::to_string(L.T - 1));
  if (L.N > 0 && (h < 0 || h >= L.N))
    throw UsageError("h=" + std::to_string(h) + " is outside 0.." + std::to_string(L.N - 1));
  const bool c_default = c1 < 0;
  if (c_default) c1 = std::min<int64_t>(L.X, 32);
  c1 = std::min(c1, L.X);
  if (c0 < 0 || c0 >= c1) throw UsageError("c=" + std::to_string(c0) + ":" + std::to_string(c1) + " is empty");
  os_ << "slice of layer " << r.layer << " " << r.name << " at token " << t;
  if (batch_.tokens() == L.T) os_ << " (position " << batch_.positions[t] << ")";
  if (L.N > 0) os_ << ", head " << h << " (rank " << L.coord(r.layer, t, h * L.X).rank << ")";
  os_ << ", channels " << c0 << ":" << c1 << " of " << L.X << (s.spec->rope_from == 0 ? " (all rope lanes)" : "");
  if (!t_given || (L.N > 0 && !h_given)) os_ << "  [defaults: the worst element's token and head]";
  os_ << "\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %7s  %13s  %13s  %13s\n", "channel", "candidate", "reference", "difference");
  os_ << line;
  const CompareOptions opt;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t e = t * L.row + (L.N > 0 ? h * L.X : 0) + c;
    const double x = s.a.data.data[e], y = s.b.data.data[e], d = x - y;
    const bool off = !(std::fabs(d) <= opt.atol + opt.rtol * std::fabs(y)) && !(std::isnan(x) && std::isnan(y));
    std::snprintf(line, sizeof line, "  %7lld  %13.6g  %13.6g  %13.6g%s%s\n", static_cast<long long>(c), x, y, d,
                  off ? "  *" : "", s.spec->rope_from > 0 && c == s.spec->rope_from ? "  <- rope lanes from here" : "");
    os_ << line;
  }
  os_ << "  (* outside allclose(atol " << fmt_num(opt.atol) << ", rtol " << fmt_num(opt.rtol) << "))";
  if (c_default && L.X > c1) os_ << "  c=A:B for other channels";
  os_ << "\n";
}

void Explorer::cmd_worst(int i, int n) {
  const auto& r = rep_.results[i];
  const Sides& s = sides(i);
  n = std::clamp(n, 1, 10000);
  if (!s.full()) {
    // Without elements, the worst tokens are what the dumps can tell.
    os_ << "worst elements need full tensors in both dumps; " << how_to_get_full(i) << "\nthe worst tokens instead ("
        << basis_label(i) << "):\n";
    std::vector<int64_t> idx(r.m.token_rel.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return r.m.token_rel[a] > r.m.token_rel[b]; });
    for (size_t k = 0; k < idx.size() && k < static_cast<size_t>(n); ++k)
      os_ << "  " << k + 1 << ". token " << idx[k] << "  rel_l2 " << fmt_num(r.m.token_rel[idx[k]]) << "\n";
    return;
  }
  const Layout L = layout_of(*s.spec, s.b.data.numel(), s.a.tp);
  const int64_t numel = s.b.data.numel();
  auto err = [&](int64_t e) {
    const double x = s.a.data.data[e], y = s.b.data.data[e];
    if (std::isnan(x) && std::isnan(y)) return 0.0;
    if (!std::isfinite(x) || !std::isfinite(y)) return x == y ? 0.0 : static_cast<double>(INFINITY);
    return std::fabs(x - y);
  };
  std::vector<int64_t> idx(numel);
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = std::min<int64_t>(n, numel);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) { return err(a) > err(b); });
  os_ << "worst " << k << " elements of layer " << r.layer << " " << r.name << " by |candidate - reference|:\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %4s  %13s  %13s  %11s  %s\n", "#", "candidate", "reference", "|diff|", "where");
  os_ << line;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t e = idx[j];
    const Coord at = L.coord(r.layer, e / L.row, e % L.row);
    std::snprintf(line, sizeof line, "  %4lld  %13.6g  %13.6g  %11.4g  %s\n", static_cast<long long>(j + 1),
                  static_cast<double>(s.a.data.data[e]), static_cast<double>(s.b.data.data[e]), err(e),
                  at.to_string().c_str());
    os_ << line;
  }
}

}  // namespace mla
