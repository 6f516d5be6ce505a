// The explorer's session: the comparison made once at start (compare_dumps at the tolerances the caller chose), the
// current probe and how commands name one, the command line and its dispatch, stepping through the divergences.
// The views of one probe are in explore_views.cpp, isolation and the causes searched in explore_isolate.cpp.
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
#include "harness/compare/weight_diff.h"
#include "core/model/errors.h"
#include "harness/explore/explore_internal.h"

namespace mla {

namespace explore_detail {

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

std::string pad(std::string s, size_t w) {
  if (s.size() < w) s.resize(w, ' ');
  return s;
}

}  // namespace explore_detail

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

std::string engine_text(const Dump& d) {
  std::string s = d.meta.engine.empty() ? "?" : d.meta.engine;
  if (!d.meta.engine_options.empty()) s += ":" + d.meta.engine_options;
  if (!d.meta.inject.empty()) s += "  inject " + d.meta.inject;
  return s;
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
    layer = explore_detail::to_int(name.substr(at + 1), "layer");
    name = name.substr(0, at);
  } else if (const auto slash = name.find('/'); slash != std::string::npos) {
    std::string l = name.substr(0, slash);
    if (l.rfind("layer", 0) == 0) l = l.substr(5);
    layer = explore_detail::to_int(l, "layer");
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
      const int layer = args.size() > 1 ? explore_detail::to_int(args[1], "layer") : -1;
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
      const int n = k < args.size() ? explore_detail::to_int(args[k], "N") : 10;
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
  for (auto& [c, d] : commands()) os_ << "  " << explore_detail::pad(c, w) << "  " << d << "\n";
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

}  // namespace mla
