// The explorer's commands. Everything reads the comparison made once at start (compare_dumps at the tolerances
// the caller chose); element-level pictures (heat maps, slices, worst elements, channel maps) read the gathered
// full tensors when both dumps hold them and say so when they fall back to norms or sketches.
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

#include "harness/bisect/isolate.h"
#include "harness/hypotheses/hypotheses.h"
#include "harness/compare/diagnose.h"
#include "harness/compare/weight_diff.h"
#include "core/engine/engine.h"
#include "core/model/errors.h"
#include "core/model/injection.h"
#include "harness/report/compare_report.h"
#include "harness/report/heatmap.h"
#include "core/weights/loader.h"

namespace mla {

struct Explorer::Sides {
  Gathered a, b;  // candidate, reference
  const DumpProbe* spec = nullptr;
  bool full() const { return a.full && b.full && a.data.numel() == b.data.numel() && a.data.numel() > 0; }
};

namespace {

std::vector<std::string> split_words(const std::string& line) {
  std::istringstream is(line);
  std::vector<std::string> w;
  for (std::string s; is >> s;) w.push_back(s);
  return w;
}

bool is_number(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A probe argument is neither a number nor key=value.
bool is_probe_word(const std::string& s) { return !s.empty() && !is_number(s) && s.find('=') == std::string::npos; }

int to_int(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const long v = std::stol(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
    return static_cast<int>(v);
  } catch (const std::exception&) {
    throw UsageError(what + ": '" + s + "' is not a number");
  }
}

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

std::string engine_text(const Dump& d) {
  std::string s = d.meta.engine.empty() ? "?" : d.meta.engine;
  if (!d.meta.engine_options.empty()) s += ":" + d.meta.engine_options;
  if (!d.meta.inject.empty()) s += "  inject " + d.meta.inject;
  return s;
}

std::string pad(std::string s, size_t w) {
  if (s.size() < w) s.resize(w, ' ');
  return s;
}


std::string basis_words(const std::string& basis) {
  if (basis == "full") return "full tensors";
  if (basis == "sketch") return "sketches (an estimate, about +-25%)";
  return basis.empty() ? "-" : basis;
}

// The per-head error of a probe recorded without full tensors. A head's norms give its norm error exactly,
// (‖a_h‖−‖b_h‖)²; what a rotation or a mixing of lanes leaves (the angle between a_h and b_h) shows only in the
// sketch of a whole shard (one per token and rank: E‖S(a−b)‖² = ‖a−b‖²). That angle part, the sketch's estimate
// less the heads' norm errors, is shared among the shard's heads in proportion to ‖a_h‖‖b_h‖ (the same cosine in
// every head of the shard). Exact for norm errors; an angle error confined to some heads of one shard is spread
// over all of that shard's heads. Without sketches only the norm part is left: a lower bound.
struct HeadEstimate {
  int64_t T = 0, N = 0;
  int groups = 1;                 // shards the angle part was measured on (ranks of a heads probe, else 1)
  bool sketched = false;          // the angle part came from sketches
  std::vector<double> cell;       // [T, N] rel error
  std::vector<double> head;       // [N]
  std::vector<double> group_rel;  // [groups] (from the sketches)
};

std::optional<HeadEstimate> estimate_heads(const DumpProbe* pa, const DumpProbe* pb, const Gathered& a,
                                           const Gathered& b) {
  if (!pa || !pb || pb->heads_axis < 0 || a.head_l2.empty() || a.head_l2.size() != b.head_l2.size()) return std::nullopt;
  HeadEstimate e;
  e.N = pb->shape[pb->heads_axis];
  if (e.N <= 0) return std::nullopt;
  e.T = static_cast<int64_t>(b.head_l2.size()) / e.N;
  const int64_t T = e.T, N = e.N;
  // The angle part per (token, shard): each rank's own sketch of its heads when both sides hold the heads
  // sharded alike, else the global sketch over all heads.
  const size_t tp = pb->ranks.size();
  const auto sk = [](const ProbeRecord& r, int64_t T) { return static_cast<int64_t>(r.sketch.size()) == T * kSketchDim; };
  bool per_rank = pb->contract == "heads" && tp > 1 && pa->ranks.size() == tp && N % static_cast<int64_t>(tp) == 0;
  for (size_t k = 0; per_rank && k < tp; ++k) per_rank = sk(pa->ranks[k], T) && sk(pb->ranks[k], T);
  e.groups = per_rank ? static_cast<int>(tp) : 1;
  const int64_t per = N / e.groups;
  std::vector<double> d2(T * e.groups, -1), s2(T * e.groups, 0);  // sketch ‖S(a−b)‖², ‖Sb‖² per (token, shard)
  auto lanes = [&](const float* x, const float* y, int64_t t, int g) {
    double d = 0, n = 0;
    for (int k = 0; k < kSketchDim; ++k) {
      const double u = x[t * kSketchDim + k], v = y[t * kSketchDim + k];
      if (!std::isfinite(u) || !std::isfinite(v)) continue;
      d += (u - v) * (u - v);
      n += v * v;
    }
    d2[t * e.groups + g] = d;
    s2[t * e.groups + g] = n;
  };
  if (per_rank) {
    for (int g = 0; g < e.groups; ++g)
      for (int64_t t = 0; t < T; ++t) lanes(pa->ranks[g].sketch.data(), pb->ranks[g].sketch.data(), t, g);
    e.sketched = true;
  } else if (a.sketch && b.sketch && a.sketch_rows.size() == b.sketch_rows.size() &&
             static_cast<int64_t>(b.sketch_rows.size()) == T * kSketchDim) {
    for (int64_t t = 0; t < T; ++t) lanes(a.sketch_rows.data(), b.sketch_rows.data(), t, 0);
    e.sketched = true;
  }
  std::vector<double> err2(T * N, 0), ref2(T * N, 0);
  std::vector<char> bad(T * N, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int g = 0; g < e.groups; ++g) {
      double norm_part = 0, weight = 0;
      for (int64_t h = g * per; h < (g + 1) * per; ++h) {
        const double x = a.head_l2[t * N + h], y = b.head_l2[t * N + h];
        if (!std::isfinite(x) || !std::isfinite(y)) {
          bad[t * N + h] = std::isfinite(x) != std::isfinite(y) || std::isnan(x) != std::isnan(y);
          continue;
        }
        err2[t * N + h] = (x - y) * (x - y);
        ref2[t * N + h] = y * y;
        norm_part += err2[t * N + h];
        weight += x * y;
      }
      const double dd = d2[t * e.groups + g];
      if (dd < 0) continue;  // no sketch: the norm part alone
      const double angle = std::max(0.0, dd - norm_part);
      for (int64_t h = g * per; h < (g + 1) * per; ++h) {
        const double x = a.head_l2[t * N + h], y = b.head_l2[t * N + h];
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        const double w = weight > 0 ? x * y / weight : 1.0 / per;
        err2[t * N + h] = std::min(err2[t * N + h] + w * angle, (x + y) * (x + y));  // |a−b| <= |a| + |b|
      }
    }
  std::vector<double> hd(N, 0), hb(N, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h) {
      const int64_t c = t * N + h;
      e.cell.push_back(bad[c] ? NAN : rel_of_sums(err2[c], ref2[c]));
      hd[h] += bad[c] ? INFINITY : err2[c];
      hb[h] += ref2[c];
    }
  for (int64_t h = 0; h < N; ++h) e.head.push_back(std::isfinite(hd[h]) ? rel_of_sums(hd[h], hb[h]) : NAN);
  if (e.sketched && e.groups > 1)
    for (int g = 0; g < e.groups; ++g) {
      double d = 0, n = 0;
      for (int64_t t = 0; t < T; ++t) {
        d += d2[t * e.groups + g];
        n += s2[t * e.groups + g];
      }
      e.group_rel.push_back(rel_of_sums(d, n));
    }
  return e;
}

// The dump's own command line with --full-probes PROBE added and --out pointing beside the dump: the run that makes
// the same dump with this probe in full.
std::string full_command(const Dump& d, const std::string& probe) {
  std::istringstream is(d.meta.command);
  std::vector<std::string> w;
  for (std::string x; is >> x;) w.push_back(x);
  if (w.empty()) return "";
  std::string out, cmd;
  for (size_t k = 0; k < w.size(); ++k) {
    if ((w[k] == "--full-probes" || w[k] == "--out") && k + 1 < w.size()) {
      if (w[k] == "--out") out = w[k + 1];
      ++k;
      continue;
    }
    if (w[k] == "--quiet" || w[k] == "--watchdog") {  // bisect's child options: not what a person types
      if (w[k] == "--watchdog") ++k;
      continue;
    }
    cmd += (cmd.empty() ? "" : " ") + w[k];
  }
  if (out.empty()) out = d.path;
  const auto dot = out.rfind(".h5");
  out = (dot == std::string::npos ? out : out.substr(0, dot)) + ".full.h5";
  return cmd + " --full-probes " + probe + " --out " + out;
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& Explorer::commands() {
  static const std::vector<std::pair<std::string, std::string>> list = {
      {"list", "every probe with rel_l2, tolerance and verdict (* beyond tolerance, > current)"},
      {"first", "go to the first divergence"},
      {"next", "step to the next divergence (also: n)"},
      {"prev", "step to the previous divergence (also: p)"},
      {"show [PROBE [LAYER]]", "metrics, tolerance and its origin, drill-down, diagnosis"},
      {"heads [PROBE]", "rel_l2 per head (bar chart)"},
      {"tokens [PROBE]", "rel_l2 per token, with positions (bar chart)"},
      {"ranks [PROBE]", "rel_l2 per tensor-parallel rank (bar chart)"},
      {"channels [PROBE]", "rel_l2 per channel group, rope vs latent lanes (bar chart)"},
      {"heatmap [PROBE]", "token x head heat map of the error"},
      {"slice [PROBE] t=T [h=H] [c=A:B]", "candidate vs reference values side by side, with the difference"},
      {"worst [PROBE] [N]", "the N largest element errors with coordinates (default 10)"},
      {"isolate [PROBE]", "re-run the probe's stage on the reference's exact inputs: introduced or amplified?"},
      {"help", "this list (also: ?)"},
      {"quit", "leave (also: exit, q, end of input)"},
  };
  return list;
}

Explorer::Explorer(Dump candidate, Dump reference, ToleranceModel tol, std::ostream& out, ExploreStyle style)
    : cand_(std::move(candidate)), ref_(std::move(reference)), tol_(std::move(tol)), os_(out), style_(style) {
  rep_ = compare_dumps(cand_, ref_, tol_);
  if (ref_.has_inputs) {
    batch_ = ref_.inputs.batch;
  } else if (cand_.has_inputs) {
    batch_ = cand_.inputs.batch;
  } else {
    try {
      batch_ = make_batch(ref_.spec());
    } catch (const std::exception&) {
      // No layout: diagnoses that read positions say less.
    }
  }
  cur_ = rep_.first_divergence >= 0 ? rep_.first_divergence : (rep_.results.empty() ? -1 : 0);
}

Explorer::~Explorer() = default;

bool Explorer::divergent(int i) const {
  const auto v = rep_.results[i].verdict;
  return v == Verdict::Verdict_diverge || v == Verdict::Verdict_nonfinite;
}

const Explorer::Sides& Explorer::sides(int i) {
  auto& slot = sides_[i];
  if (!slot) {
    slot = std::make_unique<Sides>();
    const auto& r = rep_.results[i];
    const DumpProbe* pa = cand_.find(r.layer, r.name);
    const DumpProbe* pb = ref_.find(r.layer, r.name);
    slot->spec = pb ? pb : pa;
    if (pa) slot->a = gather(*pa);
    if (pb) slot->b = gather(*pb);
  }
  return *slot;
}

const Metrics& Explorer::metrics(int i) {
  if (auto it = metrics_.find(i); it != metrics_.end()) return it->second;
  const auto& r = rep_.results[i];
  Metrics m = r.m;
  if (m.basis != "full" && r.matched()) {
    const Sides& s = sides(i);
    if (auto e = estimate_heads(cand_.find(r.layer, r.name), ref_.find(r.layer, r.name), s.a, s.b)) {
      m.head_rel = e->head;
      m.token_head_rel = e->cell;
      if (m.rank_rel.empty()) {
        if (!e->group_rel.empty()) m.rank_rel = e->group_rel;
        else if (e->sketched && std::max(1, s.a.tp) == 1) m.rank_rel = {m.rel_l2};  // one rank: the whole probe
      }
    }
  }
  return metrics_[i] = std::move(m);
}

std::string Explorer::basis_label(int i) {
  const std::string& b = rep_.results[i].m.basis;
  if (b == "full") return "full tensors";
  if (b == "sketch") return "estimate (from sketches/norms)";
  if (b.rfind("stats", 0) == 0) return "lower bound (from norms)";
  return b.empty() ? "-" : b;
}

std::string Explorer::how_to_get_full(int i) const {
  const auto& r = rep_.results[i];
  std::string s = "for full tensors of " + r.name + ", run both sides again with --full-probes " + r.name +
                  " (or --probe-level full for every probe) and explore the new pair";
  const std::string c = full_command(cand_, r.name), b = full_command(ref_, r.name);
  if (!c.empty() && !b.empty()) {
    const auto out = [](const std::string& cmd) { return cmd.substr(cmd.rfind(" --out ") + 7); };
    s += ":\n    " + c + "\n    " + b + "\n    mla-bisect explore " + out(c) + " " + out(b);
  }
  s += "\n  (isolate, here, re-runs the stage in this process and judges it on full tensors, but keeps no tensors "
       "for worst, slice or channels)";
  return s;
}

void Explorer::print_intro() {
  os_ << "candidate  " << cand_.path << "  " << engine_text(cand_) << "  (" << cand_.status << ")\n";
  os_ << "reference  " << ref_.path << "  " << engine_text(ref_) << "  (" << ref_.status << ")\n";
  int n_div = 0;
  for (size_t i = 0; i < rep_.results.size(); ++i) n_div += divergent(static_cast<int>(i));
  os_ << rep_.results.size() << " probes compared, " << n_div << " beyond tolerance\n";
  // Weights come first: a weight that differs is the cause of what follows from its stage on.
  if (rep_.first_weight >= 0) os_ << "weight differs: " << weight_sentence(rep_.weights[rep_.first_weight]) << "\n";
  if (rep_.first_divergence >= 0) {
    const auto& r = rep_.results[rep_.first_divergence];
    os_ << "first divergence: layer " << r.layer << " " << r.name << " (stage " << r.stage << "): " << r.why
        << (r.m.basis == "full" ? "" : "  [" + basis_label(rep_.first_divergence) + "]") << "\n";
  } else if (rep_.exit_code() == 0) {
    os_ << "no divergence: every probe within its tolerance\n";
  }
  if (rep_.exit_code() != 0) os_ << rep_.verdict_line() << "\n";  // missing probes, a stopped run: never a pass
  for (auto& n : rep_.notes) os_ << "note: " << n << "\n";
  if (cur_ >= 0) os_ << "current probe: " << rep_.results[cur_].name << ".  ";
  os_ << "Type help for the commands.\n";
}

std::vector<std::string> Explorer::complete(const std::string& line) const {
  const auto sp = line.find_last_of(' ');
  const std::string word = sp == std::string::npos ? line : line.substr(sp + 1);
  std::vector<std::string> pool;
  if (sp == std::string::npos || line.find_first_not_of(' ') > sp) {
    for (auto& [c, _] : commands()) pool.push_back(c.substr(0, c.find(' ')));
  } else {
    for (auto& r : rep_.results)
      if (std::find(pool.begin(), pool.end(), r.name) == pool.end()) pool.push_back(r.name);
  }
  std::vector<std::string> out;
  for (auto& p : pool)
    if (p.compare(0, word.size(), word) == 0) out.push_back(p);
  return out;
}

int Explorer::resolve(const std::string& probe_text, int layer) {
  if (probe_text.empty()) {
    if (cur_ < 0) os_ << "no current probe: name one (list shows them)\n";
    return cur_;
  }
  std::string name = probe_text;
  if (const auto at = name.find('@'); at != std::string::npos) {
    layer = to_int(name.substr(at + 1), "layer");
    name = name.substr(0, at);
  } else if (const auto slash = name.find('/'); slash != std::string::npos) {
    std::string l = name.substr(0, slash);
    if (l.rfind("layer", 0) == 0) l = l.substr(5);
    layer = to_int(l, "layer");
    name = name.substr(slash + 1);
  }
  int found = -1, first_div = -1, any = -1;
  for (size_t k = 0; k < rep_.results.size(); ++k) {
    const auto& r = rep_.results[k];
    if (r.name != name) continue;
    const int i = static_cast<int>(k);
    if (layer >= 0) {
      if (r.layer == layer) found = i;
      continue;
    }
    if (any < 0) any = i;
    if (first_div < 0 && divergent(i)) first_div = i;
    if (i == cur_) found = i;
  }
  if (found < 0) found = first_div >= 0 ? first_div : any;
  if (found < 0) {
    std::vector<std::string> names;
    for (auto& r : rep_.results)
      if (std::find(names.begin(), names.end(), r.name) == names.end()) names.push_back(r.name);
    std::string list;
    for (auto& n : names) list += (list.empty() ? " " : ", ") + n;
    os_ << "no probe '" << name << "'" << (layer >= 0 ? " in layer " + std::to_string(layer) : std::string())
        << " in these dumps; probes:" << list << "\n";
    return -1;
  }
  cur_ = found;
  return found;
}

bool Explorer::execute(const std::string& line) {
  const auto words = split_words(line);
  if (words.empty()) return true;
  std::string cmd = words[0];
  std::transform(cmd.begin(), cmd.end(), cmd.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::vector<std::string> args(words.begin() + 1, words.end());
  auto probe_arg = [&](size_t i) { return i < args.size() && is_probe_word(args[i]) ? args[i] : std::string(); };
  try {
    if (cmd == "quit" || cmd == "exit" || cmd == "q") return false;
    if (cmd == "help" || cmd == "?" || cmd == "h") {
      cmd_help();
    } else if (cmd == "list" || cmd == "ls" || cmd == "l") {
      cmd_list();
    } else if (cmd == "next" || cmd == "n") {
      cmd_step(+1);
    } else if (cmd == "prev" || cmd == "p") {
      cmd_step(-1);
    } else if (cmd == "first") {
      cmd_first();
    } else if (cmd == "show") {
      const int layer = args.size() > 1 ? to_int(args[1], "layer") : -1;
      if (const int i = resolve(probe_arg(0), layer); i >= 0) cmd_show(i);
    } else if (cmd == "heads" || cmd == "tokens" || cmd == "ranks" || cmd == "channels" || cmd == "heatmap" ||
               cmd == "isolate") {
      const int i = resolve(probe_arg(0));
      if (i < 0) return true;
      if (cmd == "heads") cmd_heads(i);
      else if (cmd == "tokens") cmd_tokens(i);
      else if (cmd == "ranks") cmd_ranks(i);
      else if (cmd == "channels") cmd_channels(i);
      else if (cmd == "heatmap") cmd_heatmap(i);
      else cmd_isolate(i);
    } else if (cmd == "slice") {
      const std::string p = probe_arg(0);
      const int i = resolve(p);
      if (i >= 0) cmd_slice(i, std::vector<std::string>(args.begin() + (p.empty() ? 0 : 1), args.end()));
    } else if (cmd == "worst") {
      const std::string p = probe_arg(0);
      const size_t k = p.empty() ? 0 : 1;
      const int n = k < args.size() ? to_int(args[k], "N") : 10;
      if (const int i = resolve(p); i >= 0) cmd_worst(i, n);
    } else {
      os_ << "unknown command '" << words[0] << "': type help for the commands\n";
    }
  } catch (const std::exception& e) {
    os_ << "error: " << e.what() << "\n";
  }
  os_.flush();
  return true;
}

void Explorer::cmd_help() {
  os_ << "commands (PROBE is a name such as q_pe_rope, or NAME@LAYER; left out: the current probe)\n";
  size_t w = 0;
  for (auto& [c, _] : commands()) w = std::max(w, c.size());
  for (auto& [c, d] : commands()) os_ << "  " << pad(c, w) << "  " << d << "\n";
}

void Explorer::cmd_list() {
  char line[256];
  std::snprintf(line, sizeof line, "%-2s %4s %3s  %-12s %-7s %10s %10s  %s\n", "", "#", "L", "probe", "basis", "rel_l2",
                "tolerance", "verdict");
  os_ << line;
  for (size_t k = 0; k < rep_.results.size(); ++k) {
    const int i = static_cast<int>(k);
    const auto& r = rep_.results[k];
    const char mark[3] = {i == cur_ ? '>' : ' ', divergent(i) ? '*' : ' ', 0};
    std::snprintf(line, sizeof line, "%-2s %4d %3d  %-12s %-7s %10s %10s  %s%s\n", mark, i, r.layer, r.name.c_str(),
                  r.m.basis.substr(0, 7).c_str(), r.verdict == Verdict::Verdict_missing ? "-" : fmt_num(r.m.rel_l2).c_str(),
                  fmt_num(r.tol.rel_l2).c_str(), verdict_name(r.verdict),
                  i == rep_.first_divergence ? "  <- first divergence" : "");
    os_ << line;
  }
  int n_div = 0;
  for (size_t i = 0; i < rep_.results.size(); ++i) n_div += divergent(static_cast<int>(i));
  os_ << rep_.results.size() << " probes, " << n_div << " beyond tolerance (*); > marks the current probe\n";
}

void Explorer::print_card(int i, const std::string& title) {
  const auto& r = rep_.results[i];
  os_ << "[" << title << "] layer " << r.layer << " " << r.name << "  (stage " << r.stage << ", " << r.contract << ", "
      << shape_string(r.shape) << ")" << (i == rep_.first_divergence ? "  <- first divergence" : "") << "\n";
  os_ << "  " << verdict_name(r.verdict) << ": " << r.why
      << (r.m.basis == "full" || !r.matched() ? "" : "  [" + basis_label(i) + "]") << "\n";
  os_ << "  tolerance: " << r.tol.origin << "\n";
  if (divergent(i)) {
    const Diagnosis dg = diagnose(r, metrics(i), r.tol, batch_, rep_);
    os_ << "  diagnosis (" << diagnosis_label(dg) << (r.m.basis == "full" ? "" : ", on " + basis_label(i))
        << "): " << dg.pattern << "\n";
  }
  os_ << "  (show, heatmap, worst, slice, isolate look closer)\n";
}

void Explorer::cmd_step(int dir) {
  std::vector<int> div;
  for (size_t k = 0; k < rep_.results.size(); ++k)
    if (divergent(static_cast<int>(k))) div.push_back(static_cast<int>(k));
  if (div.empty()) {
    os_ << "no divergence: every probe within its tolerance\n";
    return;
  }
  int target = -1;
  if (dir > 0) {
    for (int k : div)
      if (k > cur_) {
        target = k;
        break;
      }
  } else {
    for (auto it = div.rbegin(); it != div.rend(); ++it)
      if (*it < cur_) {
        target = *it;
        break;
      }
  }
  if (target < 0) {
    const auto& r = rep_.results[cur_];
    os_ << "no divergence " << (dir > 0 ? "after" : "before") << " layer " << r.layer << " " << r.name << " ("
        << div.size() << " in all)\n";
    return;
  }
  cur_ = target;
  const auto pos = std::find(div.begin(), div.end(), target) - div.begin();
  print_card(target, "divergence " + std::to_string(pos + 1) + " of " + std::to_string(div.size()));
}

void Explorer::cmd_first() {
  if (rep_.first_divergence < 0) {
    os_ << "no divergence: every probe within its tolerance\n";
    return;
  }
  cur_ = rep_.first_divergence;
  int n = 0;
  for (size_t i = 0; i < rep_.results.size(); ++i) n += divergent(static_cast<int>(i));
  print_card(cur_, "divergence 1 of " + std::to_string(n));
}

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
  const auto w = [](const char* s) { return pad(std::string("  ") + s, 14); };
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
      t = to_int(v, "t");
      t_given = true;
    } else if (k == "h" || k == "head") {
      if (L.N <= 0) throw UsageError(r.name + " has no heads axis: leave out h=");
      h = to_int(v, "h");
      h_given = true;
    } else if (k == "c" || k == "channel" || k == "channels") {
      const auto colon = v.find(':');
      if (colon == std::string::npos) {
        c0 = to_int(v, "c");
        c1 = c0 + 1;
      } else {
        c0 = colon == 0 ? 0 : to_int(v.substr(0, colon), "c");
        c1 = colon + 1 == v.size() ? L.X : to_int(v.substr(colon + 1), "c");
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

void Explorer::cmd_isolate(int i) {
  const ProbeResult r = rep_.results[i];
  if (r.verdict == Verdict::Verdict_missing) {
    os_ << r.name << " is not in both dumps: nothing to isolate\n";
    return;
  }
  const Dump& in_dump = ref_.has_inputs ? ref_ : cand_;
  if (!in_dump.has_inputs) {
    os_ << "isolate needs the run's inputs: neither dump has /inputs\n";
    return;
  }
  const MlaConfig cfg = ref_.config();
  RunSpec spec = cand_.meta.run_options.is_null() ? ref_.spec() : cand_.spec();
  const uint64_t weight_seed = ref_.meta.run_options.value("weight_seed", uint64_t{0});
  if (cand_.meta.run_options.value("weight_seed", weight_seed) != weight_seed)
    os_ << "note: the dumps name different weight seeds; isolation uses the reference's (" << weight_seed << ")\n";
  // The candidate engine as its dump recorded it; a hang, crash or fault injection would take this session down.
  const std::string cand_engine = cand_.meta.engine + (cand_.meta.engine_options.empty() ? "" : ":" + cand_.meta.engine_options);
  std::vector<Injection> inject;
  std::string skipped;
  for (auto& inj : parse_injections(cand_.meta.inject)) {
    if (inj.name == "hang-at" || inj.name == "crash-at" || inj.name == "fault-at")
      skipped += (skipped.empty() ? "" : ",") + inj.text;
    else inject.push_back(inj);
  }
  if (!skipped.empty()) os_ << "note: leaving out " << skipped << " (it would stop this session)\n";
  // The weights the reference dump ran with (synthetic, a --weight-format, or a checkpoint that must still be
  // where the dump says); weight injections are a wrong dequantization, so the candidate loads its own.
  const auto& ro = ref_.meta.run_options;
  WeightSpec ws;
  ws.source = ro.value("weights", std::string("synthetic"));
  ws.format = ro.value("weight_format", std::string());
  ws.layer_range = ro.value("layer_range", std::string());
  const StageGraph graph = build_graph(cfg, spec.graph_shape());
  const StageSpec* stage = graph.find_stage(parse_stage(r.stage));
  if (!stage) {
    os_ << "stage " << r.stage << " is not in this run's graph\n";
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto names = engine_names();
  if (std::find(names.begin(), names.end(), cand_.meta.engine) == names.end()) {
    // A capture from another system (HF transformers, vLLM, ...): its engine cannot run here, so the reference's
    // stage runs on the candidate's own captured inputs instead.
    std::vector<LayerWeights> weights;
    try {
      weights = load_weights(ws, cfg, spec, weight_seed).layers;
    } catch (const UsageError& e) {
      os_ << "isolate needs the weights the reference was made with ('" << ws.source << "'): " << e.what() << "\n";
      return;
    }
    os_ << "candidate: " << (cand_.meta.engine.empty() ? "a capture" : cand_.meta.engine)
        << " (captured: it cannot run here); the reference's " << r.stage << " of layer " << r.layer
        << " fed the capture's own inputs ..." << std::endl;
    const IsolationResult res = isolate_on_captured_inputs(cand_, cfg, spec, weights, in_dump.inputs, r, rep_);
    if (res.judged)
      os_ << "isolated " << r.name << ": rel_l2 " << fmt_num(res.isolated.rel_l2) << ", worst token "
          << fmt_num(res.isolated.max_token_rel) << " (tolerance " << fmt_num(r.tol.rel_l2) << ")\n";
    os_ << "isolation: " << res.sentence << "   ("
        << fmt_num(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3) << " s)\n";
    if (res.judged && res.introduced) search_causes(cand_, cand_, cfg, spec, weights, in_dump.inputs, r);
    return;
  }
  std::vector<LayerWeights> weights, cand_weights;
  try {
    weights = load_weights(ws, cfg, spec, weight_seed).layers;
    cand_weights = engine_injections(inject).size() != inject.size()
                       ? load_weights(ws, cfg, spec, weight_seed, inject).layers
                       : weights;
  } catch (const UsageError& e) {
    os_ << "isolate needs the weights the dumps were made with ('" << ws.source << "'): " << e.what() << "\n";
    return;
  }
  if (!ref_full_) {
    os_ << "reference: reference (fp32) on the dumps' inputs, every probe in full ..." << std::endl;
    auto ref_engine = make_engine(EngineSpec::parse("reference"));
    ref_full_ = run_in_process(*ref_engine, cfg, spec, weights, in_dump.inputs, nullptr, -1, nullptr, {}, false);
  }
  auto engine = make_engine(EngineSpec::parse(cand_engine));
  engine->set_injections(engine_injections(inject));
  os_ << "candidate: " << cand_engine << (cand_.meta.inject.empty() ? "" : " (inject " + cand_.meta.inject + ")")
      << ", stage " << r.stage << " of layer " << r.layer << " fed the reference's";
  for (auto& n : stage->inputs) os_ << " " << n;
  os_ << " ..." << std::endl;
  const Dump iso =
      run_in_process(*engine, cfg, spec, cand_weights, in_dump.inputs, &*ref_full_, r.layer, stage, {}, false);
  const IsolationResult res = judge_isolation(iso, *ref_full_, r, rep_);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!res.judged) {
    os_ << "isolation: " << r.name << " is missing from the isolated run or the reference run\n";
    return;
  }
  os_ << "isolated " << r.name << ": rel_l2 " << fmt_num(res.isolated.rel_l2) << ", worst token "
      << fmt_num(res.isolated.max_token_rel) << ", cosine " << fmt_num(res.isolated.cosine, 6) << " (tolerance "
      << fmt_num(r.tol.rel_l2) << ", worst token " << fmt_num(r.tol.token_rel) << ")\n";
  if (!divergent(i) && !res.introduced)
    os_ << "isolation: stage " << r.stage << " is right on the reference's exact inputs (and " << r.name
        << " is within tolerance in the dumps)";
  else
    os_ << "isolation: " << res.sentence;
  os_ << "   (" << fmt_num(secs, 3) << " s)\n";
  if (res.introduced) search_causes(*ref_full_, iso, cfg, spec, weights, in_dump.inputs, r);
}

void Explorer::search_causes(const Dump& inputs_dump, const Dump& outputs_dump, const MlaConfig& cfg,
                             const RunSpec& spec, const std::vector<LayerWeights>& weights, const Inputs& inputs,
                             const ProbeResult& r) {
  if (r.layer >= static_cast<int>(weights.size())) return;
  hyp::StageCase hc;
  std::string why;
  hyp::Report rep;
  if (hyp::make_case(hc, inputs_dump, outputs_dump, cfg, spec, weights[r.layer], inputs, r.layer, parse_stage(r.stage),
                     hyp::stage_tolerances(rep_, r.layer, r.stage), why)) {
    hc.focus = r.name;
    rep = hyp::search(std::move(hc));
  } else {
    rep.reason = "not searched: " + why;
  }
  hyp::print_report(os_, rep);
  if (!rep.confirmed.empty()) os_ << "cause (confirmed by re-running the stage): " << rep.sentence() << "\n";
}

}  // namespace mla
