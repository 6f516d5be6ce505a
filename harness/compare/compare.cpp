// Metrics, tolerances, verdicts, the first divergence, and what is comparable and expected.
#include "harness/compare/compare.h"
#include "harness/compare/diagnose.h"
#include "harness/compare/selection.h"
#include "harness/compare/weight_diff.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "core/engine/engine.h"
#include "core/model/errors.h"
#include "core/model/progress_hook.h"
#include "core/model/weights.h"
#include "probes/h5.h"

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
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data[i], y = b.data[i];
    const bool fx = std::isfinite(x), fy = std::isfinite(y);
    m.nan_a += std::isnan(x);
    m.nan_b += std::isnan(y);
    m.inf_a += std::isinf(x);
    m.inf_b += std::isinf(y);
    const int64_t t = i / row, c = i % row, h = N > 0 ? c / X : -1, ch = c % last;
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
      continue;
    }
    if (!fx) continue;  // both non-finite the same way
    const double d = x - y;
    dd += d * d;
    bb += y * y;
    aa += x * x;
    ab += x * y;
    tok_d[t] += d * d;
    tok_b[t] += y * y;
    tok_a[t] += x * x;
    tok_ab[t] += x * y;
    m.channel_err2[c] += d * d;
    m.channel_ref2[c] += y * y;
    m.channel_cand2[c] += x * x;
    m.channel_dot[c] += x * y;
    if (N > 0) {
      head_d[h] += d * d;
      head_b[h] += y * y;
      th_d[t * N + h] += d * d;
      th_b[t * N + h] += y * y;
      const int r = static_cast<int>(h / (N / tp_a));
      rank_d[r] += d * d;
      rank_b[r] += y * y;
    }
    if (p.rope_from >= 0) {
      (ch >= p.rope_from ? rope_d : nope_d) += d * d;
      (ch >= p.rope_from ? rope_b : nope_b) += y * y;
    }
    (ch < last / 2 ? h1_d : h2_d) += d * d;
    (ch < last / 2 ? h1_b : h2_b) += y * y;
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

// ---------------------------------------------------------------------------------------------------
// What can be compared, and what is expected
// ---------------------------------------------------------------------------------------------------

namespace {

std::string probe_label(int layer, const std::string& name, bool multi_layer) {
  return multi_layer ? "layer" + std::to_string(layer) + "/" + name : name;
}

std::optional<MlaConfig> config_of(const Dump& d) {
  if (d.meta.model.is_null()) return std::nullopt;
  try {
    return d.config();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<RunSpec> spec_of(const Dump& d) {
  if (d.meta.run_options.is_null() || !d.meta.run_options.is_object()) return std::nullopt;
  try {
    return d.spec();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Cached tokens per sequence, one value each (the run spec allows one value for all, or none).
std::vector<int> context_per_sequence(const RunSpec& s) {
  std::vector<int> c(std::max(s.batch, 0), 0);
  for (size_t i = 0; i < c.size(); ++i)
    if (!s.context.empty()) c[i] = s.context.size() == 1 ? s.context[0] : (i < s.context.size() ? s.context[i] : 0);
  return c;
}

std::string ints_text(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "none" : s;
}

// The effective tp of a dump: its tp attribute, or more where the records say so (in-memory dumps made without
// provenance carry the default tp 1).
int ranks_of(const Dump& d) {
  int tp = std::max(d.meta.tp, 1);
  for (const auto& p : d.probes) tp = std::max(tp, static_cast<int>(p.ranks.size()));
  return tp;
}

// What a dump holds, for a message: its HDF5 file's top-level groups where it has a file, else its layers.
std::string groups_text(const Dump& d) {
  const std::string file = !d.parts.empty() ? d.parts.front() : d.path;
  std::string out;
  try {
    if (h5::File::is_hdf5(file)) {
      const auto f = h5::File::open_read(file);
      for (const auto& c : f.children()) out += (out.empty() ? "" : ", ") + c;
      out = out.empty() ? "no groups" : "groups " + out;
    }
  } catch (const std::exception&) {
    out.clear();
  }
  std::map<int, int> per_layer;
  for (const auto& p : d.probes) ++per_layer[p.layer];
  std::string layers;
  for (const auto& [l, n] : per_layer)
    layers += (layers.empty() ? "" : ", ") + ("layer" + std::to_string(l) + " (" + std::to_string(n) + " probes)");
  if (layers.empty()) layers = "no probes read";
  return out.empty() ? layers : out + "; probes read: " + layers;
}

// "layer1/q_c" or "1/q_c" -> {1, "q_c"}; "q_c" -> {-1, "q_c"}.
std::pair<int, std::string> parse_probe_name(const std::string& text) {
  const auto slash = text.find('/');
  if (slash == std::string::npos) return {-1, text};
  std::string l = text.substr(0, slash);
  if (l.rfind("layer", 0) == 0) l = l.substr(5);
  if (l.empty() || l.size() > 6 || l.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError("probe '" + text + "': expected NAME, layerL/NAME or L/NAME");
  return {std::stoi(l), text.substr(slash + 1)};
}

}  // namespace

std::string ProbeResult::label() const {
  return weight ? "weight " + probe_label(layer, name, multi_layer) : probe_label(layer, name, multi_layer);
}

std::vector<std::string> check_comparable(const Dump& a, const Dump& b) {
  std::vector<std::string> diff;
  auto differ = [&](const std::string& what, const std::string& x, const std::string& y) {
    if (x != y) diff.push_back(what + ": " + x + " vs " + y);
  };
  const auto ca = config_of(a), cb = config_of(b);
  if (ca && cb) {
    differ("hidden size", std::to_string(ca->hidden), std::to_string(cb->hidden));
    differ("attention heads", std::to_string(ca->heads), std::to_string(cb->heads));
    differ("q LoRA rank", std::to_string(ca->q_lora_rank), std::to_string(cb->q_lora_rank));
    differ("kv LoRA rank", std::to_string(ca->kv_lora_rank), std::to_string(cb->kv_lora_rank));
    differ("qk nope head dim", std::to_string(ca->qk_nope), std::to_string(cb->qk_nope));
    differ("qk rope head dim", std::to_string(ca->qk_rope), std::to_string(cb->qk_rope));
    differ("v head dim", std::to_string(ca->v_head), std::to_string(cb->v_head));
  }
  const auto sa = spec_of(a), sb = spec_of(b);
  if (sa && sb) {
    differ("mode", mode_name(sa->mode), mode_name(sb->mode));
    differ("tokens per sequence", std::to_string(sa->tokens), std::to_string(sb->tokens));
    differ("batch", std::to_string(sa->batch), std::to_string(sb->batch));
    differ("context", ints_text(context_per_sequence(*sa)), ints_text(context_per_sequence(*sb)));
    differ("layer input", sa->graph_shape().input_norm ? "h (input_norm)" : "x",
           sb->graph_shape().input_norm ? "h (input_norm)" : "x");
  } else {
    if (!a.meta.mode.empty() && !b.meta.mode.empty()) differ("mode", a.meta.mode, b.meta.mode);
    if (a.has_inputs && b.has_inputs) {
      differ("inputs x", shape_string(a.inputs.x.shape), shape_string(b.inputs.x.shape));
      differ("new tokens per sequence", ints_text(a.inputs.batch.new_lens), ints_text(b.inputs.batch.new_lens));
      differ("context", ints_text(a.inputs.batch.context_lens), ints_text(b.inputs.batch.context_lens));
    }
  }
  std::vector<std::string> shapes;
  for (const auto& pb : b.probes)
    if (const DumpProbe* pa = a.find(pb.layer, pb.name); pa && pa->shape != pb.shape)
      shapes.push_back("layer" + std::to_string(pb.layer) + "/" + pb.name + " " + shape_string(pa->shape) + " vs " +
                       shape_string(pb.shape));
  if (!shapes.empty()) {
    std::string s = "probe shapes: ";
    for (size_t i = 0; i < shapes.size() && i < 6; ++i) s += (i ? ", " : "") + shapes[i];
    if (shapes.size() > 6) s += " and " + std::to_string(shapes.size() - 6) + " more";
    diff.push_back(s);
  }
  return diff;
}

void require_comparable(const Dump& a, const Dump& b) {
  const auto diff = check_comparable(a, b);
  if (diff.empty()) return;
  std::string msg = "cannot compare " + a.path + " with " + b.path + ", runs of different shapes (each line: " + a.path +
                    " vs " + b.path + "):";
  for (const auto& d : diff) msg += "\n  " + d;
  throw UsageError(msg);
}

void require_readable(const Dump& d) {
  const int tp = ranks_of(d);
  for (const auto& p : d.probes) {
    const std::string where = d.path + ": layer" + std::to_string(p.layer) + "/" + p.name;
    if (p.ranks.empty())
      throw UsageError(where + " has no rank records (rank0/ ... with the probe's stats and data): its data is "
                       "somewhere an mla-bisect dump does not keep it; the dump cannot be read");
    if (d.complete() && static_cast<int>(p.ranks.size()) != tp)
      throw UsageError(where + " has records for " + std::to_string(p.ranks.size()) + " of " + std::to_string(tp) +
                       " ranks, yet the dump says it is complete; the dump cannot be read");
    for (size_t r = 0; r < p.ranks.size(); ++r)
      if (p.ranks[r].level == ProbeLevel::ProbeLevel_full && p.ranks[r].data.numel() == 0)
        throw UsageError(where + "/rank" + std::to_string(d.rank_of(r)) +
                         " says level full but holds no data (no 'data' dataset where the dump keeps it); the dump "
                         "cannot be read");
  }
}

ExpectedProbes expected_probes(const Dump& a, const Dump& b, const CompareOptions& opt) {
  ExpectedProbes ex;
  const auto cb = config_of(b);
  const auto sb = spec_of(b);
  std::optional<StageGraph> graph;
  if (cb && sb) {
    try {
      graph = build_graph(*cb, sb->graph_shape());
    } catch (const std::exception&) {
      graph.reset();
    }
  }
  if (graph) {
    ex.from = "the stage graph of " + b.path + "'s config and run spec";
    // Another attention form computes the same attention through other intermediates: those are not expected.
    std::optional<StageGraph> graph_a;
    const auto ca = config_of(a);
    const auto sa = spec_of(a);
    if (ca && sa && sa->form != sb->form) {
      try {
        graph_a = build_graph(*ca, sa->graph_shape());
      } catch (const std::exception&) {
        graph_a.reset();
      }
    }
    std::string other_form;
    for (int l = 0; l < std::max(sb->layers, 1); ++l)
      for (const auto& p : graph->probes) {
        if (graph_a && !graph_a->find(p.name)) {
          if (l == 0) other_form += (other_form.empty() ? "" : ", ") + p.name;
          continue;
        }
        ex.probes.push_back({l, p.name, stage_name(p.stage), contract_name(p.contract), p.shape, p.order, false});
      }
    if (!other_form.empty())
      ex.notes.push_back(std::string("attention forms differ (") + form_name(sa->form) + " vs " + form_name(sb->form) +
                         "): " + other_form + " exist only in the reference's form, not compared");
  } else {
    ex.from = b.path + "'s own probes (it has no model configuration and run options to build the stage graph from)";
    for (const auto& p : b.probes) ex.probes.push_back({p.layer, p.name, p.stage, p.contract, p.shape, p.order, false});
  }
  int max_layer = 0;
  for (const auto& p : ex.probes) max_layer = std::max(max_layer, p.layer);
  ex.multi_layer = max_layer > 0;

  // A name matches every layer's probe of that name, or one layer's.
  auto matches = [](const ExpectedProbe& p, const std::pair<int, std::string>& want) {
    return p.name == want.second && (want.first < 0 || want.first == p.layer);
  };
  auto check_names = [&](const std::vector<std::string>& names, const char* option) {
    std::vector<std::pair<int, std::string>> out;
    for (const auto& n : names) {
      if (n.empty()) continue;
      const auto want = parse_probe_name(n);
      const bool known = std::any_of(ex.probes.begin(), ex.probes.end(), [&](const auto& p) { return matches(p, want); });
      if (!known) {
        std::string have;
        for (const auto& p : ex.probes)
          if (p.layer == 0) have += (have.empty() ? "" : ", ") + p.name;
        throw UsageError(std::string(option) + " " + n + ": no such probe in " + ex.from + " (" +
                         (max_layer == 0 ? std::string("layer 0 only") : "layers 0-" + std::to_string(max_layer)) +
                         "; probes: " + have + ")");
      }
      out.push_back(want);
    }
    return out;
  };
  const auto only = check_names(opt.only, "--probes");
  const auto allowed = check_names(opt.allow_missing, "--allow-missing");
  if (!only.empty()) {
    std::vector<ExpectedProbe> kept;
    for (const auto& p : ex.probes)
      if (std::any_of(only.begin(), only.end(), [&](const auto& w) { return matches(p, w); })) kept.push_back(p);
    ex.probes = std::move(kept);
    ex.from += ", narrowed to the selected probes";
  }
  // A capture (its engine is none of this build's: HF transformers, vLLM, a Recorder) holds the probes its system
  // recorded, any subset: the others are not captured, listed and not compared, as replay treats them.
  const auto engines = engine_names();
  if (only.empty() && a.complete() && !engines.empty() &&
      std::find(engines.begin(), engines.end(), a.meta.engine) == engines.end()) {
    std::vector<ExpectedProbe> kept;
    std::string not_captured;
    for (auto& p : ex.probes)
      if (a.find(p.layer, p.name))
        kept.push_back(p);
      else
        not_captured += (not_captured.empty() ? "" : ", ") + ("layer" + std::to_string(p.layer) + "/" + p.name);
    if (!not_captured.empty() && !kept.empty()) {
      ex.probes = std::move(kept);
      ex.notes.push_back("not captured (not compared): " + not_captured + " (the candidate is a capture by '" +
                         (a.meta.engine.empty() ? std::string("capture") : a.meta.engine) +
                         "', which may record any subset of the probes)");
    }
  }
  for (auto& p : ex.probes)
    p.allowed_missing = std::any_of(allowed.begin(), allowed.end(), [&](const auto& w) { return matches(p, w); });
  return ex;
}

void check_tol_overrides(const std::map<std::string, double>& overrides, const std::vector<std::string>& probes,
                         const std::string& from) {
  for (const auto& [name, value] : overrides) {
    if (std::find(probes.begin(), probes.end(), name) != probes.end()) continue;
    std::string have;
    std::set<std::string> said;
    for (const auto& p : probes)
      if (said.insert(p).second) have += (have.empty() ? "" : ", ") + p;
    throw UsageError("--tol " + name + "=" + fmt_num(value) + ": no probe " + name + " in " + from +
                     " (a --tol names a probe, for every layer: " + have + ")");
  }
}

// ---------------------------------------------------------------------------------------------------
// The comparison and its verdict
// ---------------------------------------------------------------------------------------------------

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

// DSA's topk as sets of keys per token (harness/compare/selection.h). The near-tie bound comes from the candidate's
// own index scores: where both sides hold idx_scores in full, twice the largest difference between them in the
// token's row (a swap between keys whose reference scores lie closer than that is what the candidate's scores imply);
// otherwise `fallback_tie` (compare_dumps: twice idx_scores' tolerance times the reference scores' RMS). Keys a token
// does not see are those past Batch::keys_seen; without a batch every column counts as seen.
SelectionDiff compare_topk(const Tensor& ref_topk, const Tensor& cand_topk, const Tensor* ref_scores,
                           const Tensor* cand_scores, const Batch* batch, double fallback_tie, std::string* bound,
                           double* widest) {
  const int64_t T = ref_topk.rank() == 2 ? ref_topk.dim(0) : 0, k = ref_topk.rank() == 2 ? ref_topk.dim(1) : 0;
  const auto sets = [&](const Tensor& t) {
    std::vector<std::vector<int>> out(T);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < k && i * k + j < t.numel(); ++j)
        if (const float v = t.data[i * k + j]; v >= 0) out[i].push_back(static_cast<int>(v));
    return out;
  };
  const auto ref_sets = sets(ref_topk), cand_sets = sets(cand_topk);
  const bool have_scores = ref_scores && ref_scores->rank() == 2 && ref_scores->dim(0) == T;
  Tensor scores;
  if (have_scores) {
    scores = *ref_scores;
  } else {  // distinct stand-in scores (−s): visibility only, no two keys tie
    int64_t K = 1;
    for (const auto* v : {&ref_sets, &cand_sets})
      for (const auto& row : *v)
        for (int s : row) K = std::max<int64_t>(K, s + 1);
    scores = Tensor({T, K});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < K; ++s) scores.data[t * K + s] = -static_cast<float>(s);
  }
  const int64_t K = scores.dim(1);
  for (int64_t t = 0; t < T && batch && batch->tokens() == T; ++t)
    for (int64_t s = batch->keys_seen(static_cast<int>(t)); s < K; ++s)
      scores.data[t * K + s] = -std::numeric_limits<float>::infinity();
  std::string words = "no near-ties: the reference holds no full idx_scores";
  std::vector<double> tie_tol(T, 0.0);  // per token
  if (have_scores) {
    if (cand_scores && cand_scores->shape == ref_scores->shape) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < K; ++s) {
          const double d = std::fabs(static_cast<double>(cand_scores->data[t * K + s]) - ref_scores->data[t * K + s]);
          tie_tol[t] = std::max(tie_tol[t], 2 * d);
        }
      words = "per token, twice the largest difference of the two runs' idx_scores in its row";
    } else {
      std::fill(tie_tol.begin(), tie_tol.end(), fallback_tie);
      words = "twice idx_scores' tolerance times the scores' RMS";
    }
  }
  if (bound) *bound = words;
  if (widest) *widest = tie_tol.empty() ? 0.0 : *std::max_element(tie_tol.begin(), tie_tol.end());
  return compare_selection(ref_sets, cand_sets, scores, tie_tol);
}

namespace {

// Twice idx_scores' tolerance times the RMS of `scores`: the near-tie bound where the candidate's scores are not
// held in full.
double fallback_tie(const Tensor& scores, const ToleranceModel& tol, int layer) {
  double sum2 = 0;
  for (float v : scores.data) sum2 += static_cast<double>(v) * v;
  const double rms = std::sqrt(sum2 / static_cast<double>(std::max<int64_t>(1, scores.numel())));
  return 2 * tol.for_probe("idx_scores", layer).rel_l2 * rms;
}

// topk of two dumps compared as sets (compare_topk, on the dumps' idx_scores where they hold them in full). Returns
// the tokens whose sets differ only by near-tie swaps (SelectionDiff::swapped_tokens).
std::vector<int64_t> judge_selection(ProbeResult& r, const Gathered& ga, const Gathered& gb, const Dump& a,
                                     const Dump& b, const ToleranceModel& tol) {
  const int64_t T = gb.shape[0];
  const DumpProbe* sb = b.find(r.layer, "idx_scores");
  const DumpProbe* sa = a.find(r.layer, "idx_scores");
  const Gathered scores_b = sb ? gather(*sb) : Gathered{}, scores_a = sa ? gather(*sa) : Gathered{};
  const bool have_b = scores_b.full && scores_b.data.rank() == 2 && scores_b.data.dim(0) == T;
  const bool have_a = have_b && scores_a.full && scores_a.data.shape == scores_b.data.shape;
  const Batch* batch = b.has_inputs ? &b.inputs.batch : nullptr;
  std::string bound;
  double widest = 0;
  const SelectionDiff d = compare_topk(gb.data, ga.data, have_b ? &scores_b.data : nullptr,
                                       have_a ? &scores_a.data : nullptr, batch,
                                       have_b ? fallback_tie(scores_b.data, tol, r.layer) : 0.0, &bound, &widest);
  r.m = Metrics{};
  r.m.basis = "sets";
  r.m.rel_l2 = 1.0 - d.mean_overlap;
  r.m.mismatch = d.tokens > 0 ? static_cast<double>(d.differing) / static_cast<double>(d.tokens) : 0.0;
  r.tol = Tolerance{0, 0, "sets of keys per token; swaps within " + fmt_num(widest) + " at most (" + bound +
                              ") are near-ties, not divergences at topk"};
  r.selection = true;
  r.selection_pattern = d.pattern;
  r.selection_shift = d.shift;
  r.near_tie_swaps = d.near_tie_swaps;
  r.verdict = d.diverges() ? Verdict::Verdict_diverge : Verdict::Verdict_pass;
  r.why = d.explain();
  if (d.diverges() && d.first_token >= 0) r.m.max_at = Coord{r.layer, -1, d.first_token, -1, -1};
  return d.swapped_tokens;
}

}  // namespace

bool reads_selection(const std::string& stage) {
  static const std::set<std::string> kStages = {"attention_mha", "attention_mqa", "v_up",
                                                "o_proj",        "all_reduce",    "residual"};
  return kStages.count(stage) > 0;
}

std::vector<int64_t> near_tie_tokens(const Dump& a, const Dump& b, int layer, const ToleranceModel& tol) {
  const DumpProbe *pa = a.find(layer, "topk"), *pb = b.find(layer, "topk");
  if (!pa || !pb) return {};
  const Gathered ga = gather(*pa), gb = gather(*pb);
  if (!ga.full || !gb.full || gb.shape.size() != 2 || ga.shape != gb.shape) return {};
  ProbeResult r;
  r.layer = layer;
  return judge_selection(r, ga, gb, a, b, tol);
}

int CompareReport::divergent_weights() const {
  int n = 0;
  for (const auto& r : weights) n += r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite;
  return n;
}

int CompareReport::divergent() const {
  int n = 0;
  for (const auto& r : results) n += r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite;
  return n;
}

std::vector<const ProbeResult*> CompareReport::missing(bool allowed) const {
  std::vector<const ProbeResult*> out;
  for (const auto& r : results)
    if (r.verdict == Verdict::Verdict_missing && r.missing_allowed == allowed) out.push_back(&r);
  return out;
}

int CompareReport::exit_code() const {
  if (stopped_early()) return ExitCode_engine;
  if (matched == 0) return ExitCode_usage;
  if (first_divergence >= 0 || first_weight >= 0 || missing_fails()) return ExitCode_divergence;
  return ExitCode_ok;
}

namespace {
std::string name_list(const std::vector<const ProbeResult*>& v, size_t max_items = 8) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + v[i]->label();
  if (v.size() > max_items) s += ", ... " + std::to_string(v.size() - max_items) + " more";
  return s;
}
}  // namespace

std::string CompareReport::verdict_line() const {
  std::ostringstream os;
  os << matched << " of " << expected << " probes matched";
  const auto miss = missing(false), allowed = missing(true);
  if (!miss.empty()) os << ", " << miss.size() << " missing (" << name_list(miss) << ")";
  if (!allowed.empty()) os << ", " << allowed.size() << " missing but allowed (" << name_list(allowed) << ")";
  if (miss.empty() && allowed.empty()) os << ", none missing";
  const int div = divergent();
  if (div > 0)
    os << ", " << div << " beyond tolerance (first: " << results[first_divergence].label() << ")";
  else if (matched > 0)
    os << ", " << (miss.empty() && allowed.empty() ? "every probe" : "every matched probe") << " within its tolerance";
  if (!weights.empty()) {
    const int wd = divergent_weights();
    os << "; " << weights.size() << " weight" << (weights.size() == 1 ? "" : "s") << " compared, ";
    if (wd > 0) os << wd << " beyond tolerance (first: " << weights[first_weight].label() << ")";
    else os << "every one within its tolerance";
  }
  switch (exit_code()) {
    case ExitCode_engine:
      os << ": INCOMPLETE (a dump stopped early: "
         << (a_status != "complete" ? "candidate " + a_status : "reference " + b_status) << ")";
      break;
    case ExitCode_usage: os << ": NOTHING COMPARED"; break;
    case ExitCode_divergence: os << ": FAIL"; break;
    default: os << ": PASS"; break;
  }
  return os.str();
}

CompareReport compare_dumps(const Dump& a, const Dump& b, const ToleranceModel& tol, const CompareOptions& opt) {
  require_every_rank(a, "compare");  // gathering needs every rank's shard
  require_every_rank(b, "compare");
  require_comparable(a, b);
  require_readable(a);
  require_readable(b);
  const ExpectedProbes ex = expected_probes(a, b, opt);
  CompareReport rep;
  rep.a_path = a.path;
  rep.b_path = b.path;
  rep.a_status = a.status;
  rep.b_status = b.status;
  rep.expected = static_cast<int>(ex.probes.size());
  rep.expected_from = ex.from;
  rep.notes = ex.notes;
  const int tp_a = ranks_of(a), tp_b = ranks_of(b);
  bool said_sketch = false;
  double compared = 0;  // for the progress ticks
  for (const auto& e : ex.probes) {
    if (progress_wanted())
      progress_tick("probes", "comparing layer " + std::to_string(e.layer) + " " + e.name, compared,
                    static_cast<double>(ex.probes.size()) + 1);
    ++compared;
    const DumpProbe* pa = a.find(e.layer, e.name);
    const DumpProbe* pb = b.find(e.layer, e.name);
    ProbeResult r;
    r.layer = e.layer;
    r.name = e.name;
    r.stage = pb ? pb->stage : pa ? pa->stage : e.stage;
    r.contract = pb ? pb->contract : pa ? pa->contract : e.contract;
    r.shape = pb ? pb->shape : pa ? pa->shape : e.shape;
    r.order = pb ? pb->order : pa ? pa->order : e.order;
    r.multi_layer = ex.multi_layer;
    r.tol = tol.for_probe(e.name, e.layer);
    // Not compared: say why, from the side that lacks it (a stopped run's missing probes are where it stopped).
    auto lacking = [](const Dump& d, const DumpProbe* p, int tp, const char* side) -> std::string {
      if (!p) return std::string("not in the ") + side + (d.complete() ? "" : ", which stopped before recording it");
      if (static_cast<int>(p->ranks.size()) < tp)
        return std::string("the ") + side + " recorded it on " + std::to_string(p->ranks.size()) + " of " +
               std::to_string(tp) + " ranks before it stopped";
      return "";
    };
    std::string why = lacking(a, pa, tp_a, "candidate");
    const std::string why_b = lacking(b, pb, tp_b, "reference");
    if (!why_b.empty()) why = why.empty() ? why_b : why + "; " + why_b;
    if (!why.empty()) {
      r.verdict = Verdict::Verdict_missing;
      r.missing_allowed = e.allowed_missing;
      r.why = why + (e.allowed_missing ? " (allowed by --allow-missing)" : "");
      rep.results.push_back(std::move(r));
      continue;
    }
    ++rep.matched;
    if (pa->shape != pb->shape) {  // check_comparable refuses these; kept for callers that skip it
      r.verdict = Verdict::Verdict_diverge;
      r.why = "shape " + shape_string(pa->shape) + " vs " + shape_string(pb->shape);
      rep.results.push_back(std::move(r));
      continue;
    }
    const Gathered ga = gather(*pa);
    const Gathered gb = gather(*pb);
    for (auto& s : ga.problems) r.problems.push_back("candidate: " + s);
    for (auto& s : gb.problems) r.problems.push_back("reference: " + s);
    r.m = compare_gathered(ga, gb, *pb, pb->layer, opt);
    if (r.m.basis != "full" && !said_sketch) {
      rep.notes.push_back("some probes lack full tensors on one side: their metrics come from sketches (estimates, "
                          "about ±25%) or, without sketches, from norms (a lower bound)");
      said_sketch = true;
    }
    // Per-rank partial sums (allreduce bugs leave every o_partial right and o wrong; a sharding bug shows here).
    if (pb->contract == "partial" && pa->ranks.size() == pb->ranks.size()) {
      r.m.rank_rel.clear();
      for (size_t k = 0; k < pb->ranks.size(); ++k) {
        const auto &ra = pa->ranks[k], &rb = pb->ranks[k];
        if (ra.data.numel() && ra.data.numel() == rb.data.numel()) {
          double d = 0, n = 0;
          for (int64_t i = 0; i < ra.data.numel(); ++i) {
            d += std::pow(static_cast<double>(ra.data.data[i]) - rb.data.data[i], 2);
            n += std::pow(static_cast<double>(rb.data.data[i]), 2);
          }
          r.m.rank_rel.push_back(ratio_or_inf(std::sqrt(d), std::sqrt(n)));
        } else if (!ra.sketch.empty() && ra.sketch.size() == rb.sketch.size()) {
          double d = 0, n = 0;
          for (size_t i = 0; i < ra.sketch.size(); ++i) {
            d += std::pow(static_cast<double>(ra.sketch[i]) - rb.sketch[i], 2);
            n += std::pow(static_cast<double>(rb.sketch[i]), 2);
          }
          r.m.rank_rel.push_back(ratio_or_inf(std::sqrt(d), std::sqrt(n)));
        }
      }
    }
    if (e.name == "topk" && ga.full && gb.full && gb.shape.size() == 2) {
      const auto tokens = judge_selection(r, ga, gb, a, b, tol);
      if (!tokens.empty()) {
        const auto k = static_cast<int64_t>(tokens.size());
        rep.notes.push_back("layer " + std::to_string(e.layer) + ": " + std::to_string(k) +
                            (k == 1 ? " token" : " tokens") + " (" + ranges(tokens, 8) + ") whose top-k swapped " +
                            "near-tied keys " + (k == 1 ? "is" : "are") + " compared as " + (k == 1 ? "it is" : "they are") +
                            " in the probes after topk: the candidate's attention read other keys there than the "
                            "reference's (bisect compares them against the reference's attention on the candidate's "
                            "selection)");
      }
    } else {
      judge(r, ga);
    }
    rep.results.push_back(std::move(r));
  }
  // Probes outside the expected set are not compared; say so unless the user narrowed the set.
  if (opt.only.empty()) {
    std::set<std::pair<int, std::string>> known, said;
    for (const auto& e : ex.probes) known.insert({e.layer, e.name});
    std::string extra;
    for (const Dump* d : {&a, &b})
      for (const auto& p : d->probes)
        if (!known.count({p.layer, p.name}) && said.insert({p.layer, p.name}).second)
          extra += (extra.empty() ? "" : ", ") + ("layer" + std::to_string(p.layer) + "/" + p.name) + " (" +
                   (d == &a ? "candidate" : "reference") + ")";
    if (!extra.empty()) rep.notes.push_back("not expected by " + ex.from + ", not compared: " + extra);
  }
  progress_tick("probes", "comparing the weights", compared, static_cast<double>(ex.probes.size()) + 1);
  compare_weights(a, b, tol, opt, rep);
  for (size_t i = 0; i < rep.results.size(); ++i) {
    const auto v = rep.results[i].verdict;
    if (v == Verdict::Verdict_diverge || v == Verdict::Verdict_nonfinite) {
      rep.first_divergence = static_cast<int>(i);
      break;
    }
  }
  if (rep.matched == 0 && !rep.stopped_early())
    throw UsageError("no probe of " + b.path + " matched in " + a.path + ": candidate has " + groups_text(a) +
                     ", reference " + groups_text(b) + " (expected: " + ex.from + "; probes live in groups "
                     "/layer<L>/<probe>/rank<R>)");
  return rep;
}

}  // namespace mla
