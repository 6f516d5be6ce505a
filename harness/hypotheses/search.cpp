// The search: the reference's computation of a stage on the candidate's inputs, every class of the catalogue that
// applies to the stage, each variant measured against the candidate's outputs at their tolerances.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ostream>
#include <sstream>

#include "harness/compare/diagnose.h"
#include "harness/hypotheses/common.h"
#include "core/model/errors.h"
#include "core/model/progress_hook.h"
#include "reference/stages.h"

namespace mla::hyp {

const Tensor& input(const StageCase& c, const char* name) {
  auto it = c.in.find(name);
  if (it == c.in.end()) throw UsageError("hypotheses: the case of stage " + std::string(stage_name(c.stage)) +
                                         " holds no input '" + std::string(name) + "'");
  return it->second;
}

const Tensor* cand(const StageCase& c, const std::string& name) {
  auto it = c.cand.find(name);
  return it == c.cand.end() ? nullptr : &it->second;
}

Tensor scaled(const Tensor& t, double c) {
  Tensor o = t;
  for (auto& v : o.data) v = static_cast<float>(v * c);
  return o;
}

double ls_scale(const Tensor& a, const Tensor& b) {
  double ab = 0, bb = 0;
  const int64_t n = std::min(a.numel(), b.numel());
  for (int64_t i = 0; i < n; ++i) {
    const double x = a.data[i], y = b.data[i];
    if (!std::isfinite(x) || !std::isfinite(y)) continue;
    ab += x * y;
    bb += y * y;
  }
  return bb > 0 ? ab / bb : 1.0;
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double dd = 0, bb = 0;
  const int64_t n = std::min(a.numel(), b.numel());
  for (int64_t i = 0; i < n; ++i) {
    const double x = a.data[i], y = b.data[i];
    if (!std::isfinite(x) || !std::isfinite(y)) continue;
    dd += (x - y) * (x - y);
    bb += y * y;
  }
  return rel_of_sums(dd, bb);
}

bool close_to(double a, double b, double rel) { return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b)); }

Variant variant(const std::string& output, Tensor t, nlohmann::json params, std::string phrase) {
  Variant v;
  v.out[output] = std::move(t);
  v.params = std::move(params);
  v.phrase = std::move(phrase);
  return v;
}

Tensor rounded(Tensor t, Precision p) {
  round_in_place(t, p);
  return t;
}

std::string num(double v, int precision) { return fmt_num(v, precision); }

BugClass make_class(std::string name, std::string family, std::vector<Stage> stages, int complexity,
                    std::string description, std::function<std::vector<Variant>(const StageCase&, const Outputs&)> run) {
  BugClass k;
  k.name = std::move(name);
  k.family = std::move(family);
  k.stages = std::move(stages);
  k.description = std::move(description);
  k.complexity = complexity;
  k.run = std::move(run);
  return k;
}

double golden_min(const std::function<double(double)>& f, double lo, double hi, int iters) {
  const double g = (std::sqrt(5.0) - 1) / 2;
  double a = hi - g * (hi - lo), b = lo + g * (hi - lo), fa = f(a), fb = f(b);
  for (int i = 0; i < iters; ++i) {
    if (fa < fb) {
      hi = b, b = a, fb = fa;
      a = hi - g * (hi - lo), fa = f(a);
    } else {
      lo = a, a = b, fa = fb;
      b = lo + g * (hi - lo), fb = f(b);
    }
  }
  return (lo + hi) / 2;
}

int key_index(const Batch& b, int64_t t) {
  const int s = b.token_seq[t];
  return b.context_lens[s] + static_cast<int>(t - b.first_token(s));
}

namespace {

Tensor as_2d(const Tensor& t) {
  Tensor o = t;
  if (o.rank() == 1) o.shape = {1, o.shape[0]};
  return o;
}

// Writes this step's rows [T, L+R] (or [T, Di]) into a copy of `before` at each new token's page and slot.
Tensor write_rows(const Tensor& before, const Batch& batch, const Tensor& rows) {
  Tensor cache = before;
  const int64_t W = rows.dim(-1);
  for (int64_t t = 0; t < batch.tokens(); ++t) {
    const int s = batch.token_seq[t];
    const int pos = batch.context_lens[s] + static_cast<int>(t - batch.first_token(s));
    const int64_t row = static_cast<int64_t>(batch.page(s, pos)) * kPageSize + pos % kPageSize;
    if ((row + 1) * W > cache.numel()) continue;
    std::memcpy(cache.ptr() + row * W, rows.ptr() + t * W, sizeof(float) * W);
  }
  return cache;
}

}  // namespace

Outputs reference_outputs(const StageCase& c) {
  const MlaConfig& cfg = c.cfg;
  const auto& W = *c.w;
  Outputs o;
  std::optional<ref::Selection> sel;
  if (cfg.has_dsa() && c.in.count("topk")) sel = ref::selection_of(input(c, "topk"));
  switch (c.stage) {
    case Stage::Stage_input_norm: o["x"] = ref::rms_norm(input(c, "h"), W.input_norm, cfg.rms_eps); break;
    case Stage::Stage_q_a_proj: o["q_a"] = ref::linear(input(c, "x"), W.q_a_proj); break;
    case Stage::Stage_q_a_norm: o["q_c"] = ref::rms_norm(input(c, "q_a"), W.q_a_norm, cfg.rms_eps); break;
    case Stage::Stage_q_b_proj:
    case Stage::Stage_q_proj: {
      auto q = ref::q_b_proj(input(c, c.stage == Stage::Stage_q_b_proj ? "q_c" : "x"), W.q_b_proj, cfg);
      o["q_nope"] = std::move(q.q_nope);
      o["q_pe"] = std::move(q.q_pe);
      break;
    }
    case Stage::Stage_kv_a_proj: {
      auto kv = ref::kv_a_proj(input(c, "x"), W.kv_a_proj, cfg);
      o["kv_c"] = std::move(kv.kv_c);
      o["k_pe"] = std::move(kv.k_pe);
      break;
    }
    case Stage::Stage_kv_a_norm: o["kv_c_norm"] = ref::rms_norm(input(c, "kv_c"), W.kv_a_norm, cfg.rms_eps); break;
    case Stage::Stage_rope:
      o["q_pe_rope"] = ref::rope(input(c, "q_pe"), c.batch.positions, cfg.inv_freq, cfg.rope_mscale, cfg.rope_style);
      o["k_pe_rope"] = ref::rope(input(c, "k_pe"), c.batch.positions, cfg.inv_freq, cfg.rope_mscale, cfg.rope_style);
      break;
    case Stage::Stage_cache_write: {
      Tensor cache = c.cache_before;
      o["kv_cache"] = ref::cache_write(cache, c.batch, input(c, "kv_c_norm"), input(c, "k_pe_rope"));
      break;
    }
    case Stage::Stage_indexer_q:
      o["idx_q"] = ref::indexer_q(input(c, "q_c"), W.idx_wq_b, cfg.index_n_heads, c.batch.positions, cfg.inv_freq,
                                  cfg.index_rope_style);
      break;
    case Stage::Stage_indexer_k:
      o["idx_k"] = ref::indexer_k(input(c, "x"), W.idx_wk, W.idx_k_norm, W.idx_k_norm_bias, MlaConfig::kIndexNormEps,
                                  c.batch.positions, cfg.inv_freq, cfg.index_rope_style);
      break;
    case Stage::Stage_indexer_weights: o["idx_weights"] = ref::indexer_weights(input(c, "x"), W.idx_weights_proj); break;
    case Stage::Stage_index_scores: {
      const Tensor icache = write_rows(c.index_cache_before, c.batch, input(c, "idx_k"));
      const Tensor* cs = cand(c, "idx_scores");
      const int64_t K = cs ? cs->dim(1) : 0;
      o["idx_scores"] = ref::index_scores(input(c, "idx_q"), input(c, "idx_weights"), icache, c.batch, K);
      break;
    }
    case Stage::Stage_topk:
      o["topk"] = ref::selection_tensor(ref::select_keys(input(c, "idx_scores"), c.batch, cfg.index_topk),
                                        cfg.index_topk);
      break;
    case Stage::Stage_kv_b_proj: {
      auto kv = ref::kv_b_proj(input(c, "kv_c_norm"), W.kv_b_proj, cfg);
      o["k_nope"] = std::move(kv.k_nope);
      o["v"] = std::move(kv.v);
      break;
    }
    case Stage::Stage_attention_mha: {
      auto a = ref::attention_mha(input(c, "q_nope"), input(c, "q_pe_rope"), input(c, "k_nope"), input(c, "k_pe_rope"),
                                  input(c, "v"), c.cache_after, c.batch, W.kv_b_proj, cfg,
                                  {.keys = sel ? &*sel : nullptr});
      o["attn_out"] = std::move(a.out);
      o["lse"] = std::move(a.lse);
      break;
    }
    case Stage::Stage_q_absorb: o["q_latent"] = ref::q_absorb(input(c, "q_nope"), W.kv_b_proj, cfg); break;
    case Stage::Stage_attention_mqa: {
      auto a = ref::attention_mqa(input(c, "q_latent"), input(c, "q_pe_rope"), c.cache_after, c.batch, cfg,
                                  sel ? &*sel : nullptr);
      o["attn_latent"] = std::move(a.out);
      o["lse"] = std::move(a.lse);
      break;
    }
    case Stage::Stage_v_up: o["attn_out"] = ref::v_up(input(c, "attn_latent"), W.kv_b_proj, cfg); break;
    case Stage::Stage_o_proj: o["o_partial"] = ref::o_proj(input(c, "attn_out"), W.o_proj); break;
    case Stage::Stage_all_reduce: {
      std::vector<const Tensor*> parts;
      for (const auto& p : c.o_partial_ranks) parts.push_back(&p);
      if (parts.empty()) parts.push_back(&input(c, "o_partial"));
      o["o"] = ref::all_reduce(parts);
      break;
    }
    case Stage::Stage_residual: o["h_out"] = ref::residual(input(c, "h"), input(c, "o")); break;
    case Stage::Stage_layer_input: break;
  }
  return o;
}

namespace {

OutputFit fit_output(const Tensor& candidate, const Tensor& model, const Tolerance& tol) {
  OutputFit f;
  f.tol = tol.rel_l2;
  f.token_tol = tol.token_rel > 0 ? tol.token_rel : tol.rel_l2;
  if (candidate.numel() != model.numel()) {
    f.rel_l2 = f.token_rel = INFINITY;
    return f;
  }
  const int64_t T = candidate.shape.empty() ? 1 : std::max<int64_t>(candidate.dim(0), 1);
  const int64_t per = candidate.numel() / T;
  double dd = 0, bb = 0;
  for (int64_t t = 0; t < T; ++t) {
    double td = 0, tb = 0;
    for (int64_t i = t * per; i < (t + 1) * per; ++i) {
      const double x = candidate.data[i], y = model.data[i];
      const bool fx = std::isfinite(x), fy = std::isfinite(y);
      if (!fx || !fy) {
        // NaN where NaN, the same infinity where an infinity: agreed; anything else is not.
        const bool same = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && std::isinf(y) && (x > 0) == (y > 0));
        if (!same) f.nonfinite_agree = false;
        continue;
      }
      td += (x - y) * (x - y);
      tb += y * y;
    }
    dd += td;
    bb += tb;
    f.token_rel = std::max(f.token_rel, rel_of_sums(td, tb));
  }
  f.rel_l2 = rel_of_sums(dd, bb);
  f.within = f.nonfinite_agree && f.rel_l2 <= f.tol && f.token_rel <= f.token_tol;
  return f;
}

double worst_ratio(const std::map<std::string, OutputFit>& fits) {
  double w = 0;
  for (const auto& [_, f] : fits) {
    if (!f.nonfinite_agree) return INFINITY;
    w = std::max({w, f.rel_l2 / std::max(f.tol, 1e-30), f.token_rel / std::max(f.token_tol, 1e-30)});
  }
  return w;
}

bool applies(const BugClass& k, Stage s) { return std::find(k.stages.begin(), k.stages.end(), s) != k.stages.end(); }

}  // namespace

Report search(StageCase c) {
  const auto t0 = std::chrono::steady_clock::now();
  Report r;
  r.stage = stage_name(c.stage);
  r.layer = c.layer;
  r.focus = c.focus;
  if (c.cand.empty()) {
    r.reason = "not searched: none of stage " + r.stage + "'s outputs is held in full";
    return r;
  }
  Outputs ref;
  try {
    ref = reference_outputs(c);
  } catch (const std::exception& e) {
    r.reason = std::string("not searched: the reference's ") + r.stage + " could not run on these inputs (" + e.what() + ")";
    return r;
  }
  const Tolerance fallback = c.tol.empty() ? Tolerance{1e-5, 1e-5, ""} : c.tol.begin()->second;
  auto tol_of = [&](const std::string& n) { return c.tol.count(n) ? c.tol.at(n) : fallback; };
  bool any_off = false;
  for (const auto& [name, t] : c.cand)
    if (auto it = ref.find(name); it != ref.end()) {
      r.as_run[name] = fit_output(t, it->second, tol_of(name));
      any_off |= !r.as_run[name].within;
    }
  if (r.as_run.empty()) {
    r.reason = "not searched: the candidate's outputs of stage " + r.stage + " are not the reference's";
    return r;
  }
  if (!any_off) {
    r.reason = "not searched: on these inputs the reference's " + r.stage + " agrees with the candidate";
    return r;
  }
  r.searched = true;
  int classes = 0;
  // Simplest first: classes by the parameters they fit. Once one is confirmed, classes that fit more are not tried
  // (a simpler explanation that reproduces the candidate stands; they could only join it).
  std::vector<const BugClass*> order;
  for (const auto& k : catalogue())
    if (applies(k, c.stage)) order.push_back(&k);
  std::stable_sort(order.begin(), order.end(), [](const BugClass* a, const BugClass* b) { return a->complexity < b->complexity; });
  int confirmed_at = -1;
  double done = 0;  // for the progress ticks
  for (const BugClass* kp : order) {
    const BugClass& k = *kp;
    if (progress_wanted())
      progress_tick("classes", "bug class " + k.name + " on stage " + r.stage, done, static_cast<double>(order.size()));
    ++done;
    if (confirmed_at >= 0 && k.complexity > confirmed_at) {
      r.skipped.push_back(k.name);
      continue;
    }
    ++classes;
    const auto k0 = std::chrono::steady_clock::now();
    std::vector<Variant> vs;
    try {
      vs = k.run(c, ref);
    } catch (const std::exception& e) {
      r.not_run.push_back(k.name + ": " + e.what());  // shapes it cannot apply to, or a case too large for it
      continue;
    }
    const double ks = std::chrono::duration<double>(std::chrono::steady_clock::now() - k0).count();
    for (auto& v : vs) {
      Tried tr;
      tr.cls = k.name;
      tr.description = k.description;
      tr.complexity = k.complexity;
      tr.params = v.params;
      tr.phrase = v.phrase;
      if (v.pretest_ratio >= 0) {
        tr.pretest_only = true;
        tr.worst = v.pretest_ratio;
        tr.class_seconds = ks;
        r.tried.push_back(std::move(tr));
        continue;
      }
      bool changes = false;
      for (const auto& [name, t] : c.cand) {
        auto it = v.out.find(name);
        const Tensor* model = nullptr;
        if (it != v.out.end()) {
          model = &it->second;
          changes = true;
        } else if (auto jt = ref.find(name); jt != ref.end()) {
          model = &jt->second;
        }
        if (model) tr.outputs[name] = fit_output(t, *model, tol_of(name));
      }
      if (!changes || tr.outputs.empty()) continue;
      tr.worst = worst_ratio(tr.outputs);
      tr.confirmed = std::all_of(tr.outputs.begin(), tr.outputs.end(), [](const auto& p) { return p.second.within; });
      tr.class_seconds = ks;
      if (tr.confirmed && confirmed_at < 0) confirmed_at = k.complexity;
      r.tried.push_back(std::move(tr));
    }
  }
  std::stable_sort(r.tried.begin(), r.tried.end(), [](const Tried& a, const Tried& b) {
    if (a.confirmed != b.confirmed) return a.confirmed;
    if (a.confirmed && a.complexity != b.complexity) return a.complexity < b.complexity;
    return a.worst < b.worst;
  });
  // One entry per class among the confirmed (its best variant).
  for (const auto& t : r.tried)
    if (t.confirmed && std::none_of(r.confirmed.begin(), r.confirmed.end(), [&](const Tried& x) { return x.cls == t.cls; }))
      r.confirmed.push_back(t);
  r.reason = "searched " + std::to_string(classes) + " classes (" + std::to_string(r.tried.size()) +
             " variants) of stage " + r.stage +
             (r.skipped.empty() ? "" : "; " + std::to_string(r.skipped.size()) + " with more parameters not tried") +
             (r.not_run.empty() ? "" : "; " + std::to_string(r.not_run.size()) + " could not run (" + r.not_run.front() +
                                           (r.not_run.size() > 1 ? ", ..." : "") + ")");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string Report::sentence() const {
  if (confirmed.empty()) return "";
  const Tried& t = confirmed.front();
  // The output that was furthest off as run: the one the sentence quotes.
  std::string name = as_run.count(focus) ? focus : "";
  double worst = -1;
  for (const auto& [n, f] : as_run)
    if (name != focus && f.rel_l2 / std::max(f.tol, 1e-30) > worst) {
      worst = f.rel_l2 / std::max(f.tol, 1e-30);
      name = n;
    }
  const double as = as_run.count(name) ? as_run.at(name).rel_l2 : 0;
  const double now = t.outputs.count(name) ? t.outputs.at(name).rel_l2 : 0;
  std::string s = "the candidate's " + name + " equals the reference's " + stage + " " + t.phrase + " (" + t.cls +
                  "): rel_l2 " + fmt_num(now) + " vs " + fmt_num(as) + " as run";
  return s;
}

nlohmann::json report_to_json(const Report& r) {
  auto fits = [](const std::map<std::string, OutputFit>& m) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [n, f] : m)
      j[n] = {{"rel_l2", std::isfinite(f.rel_l2) ? nlohmann::json(f.rel_l2) : nlohmann::json("inf")},
              {"token_rel", std::isfinite(f.token_rel) ? nlohmann::json(f.token_rel) : nlohmann::json("inf")},
              {"tolerance", f.tol}, {"token_tolerance", f.token_tol}, {"nonfinite_agree", f.nonfinite_agree},
              {"within", f.within}};
    return j;
  };
  auto tried = [&](const Tried& t, const Report& rep) {
    double worst_rel = 0, as_rel = 0, worst = -1;
    for (const auto& [n, f] : rep.as_run)
      if (f.rel_l2 / std::max(f.tol, 1e-30) > worst) {
        worst = f.rel_l2 / std::max(f.tol, 1e-30);
        as_rel = f.rel_l2;
        worst_rel = t.outputs.count(n) ? t.outputs.at(n).rel_l2 : 0;
      }
    return nlohmann::json{{"class", t.cls},
                          {"description", t.description},
                          {"params", t.params},
                          {"phrase", t.phrase},
                          {"confirmed", t.confirmed},
                          {"complexity", t.complexity},
                          {"rel_l2", std::isfinite(worst_rel) ? nlohmann::json(worst_rel) : nlohmann::json("inf")},
                          {"as_run_rel_l2", as_rel},
                          {"worst_ratio", std::isfinite(t.worst) ? nlohmann::json(t.worst) : nlohmann::json("inf")},
                          {"class_seconds", t.class_seconds},
                          {"pretest_only", t.pretest_only},
                          {"outputs", fits(t.outputs)}};
  };
  nlohmann::json j{{"stage", r.stage}, {"layer", r.layer}, {"searched", r.searched}, {"reason", r.reason},
                   {"as_run", fits(r.as_run)}, {"seconds", r.seconds}, {"sentence", r.sentence()}};
  j["confirmed"] = nlohmann::json::array();
  for (const auto& t : r.confirmed) {
    auto e = tried(t, r);
    e["summary"] = r.sentence().empty() ? "" : t.cls + " " + t.phrase;
    j["confirmed"].push_back(e);
  }
  j["skipped"] = r.skipped;
  j["not_run"] = r.not_run;
  j["tried"] = nlohmann::json::array();
  for (const auto& t : r.tried) j["tried"].push_back(tried(t, r));
  return j;
}

namespace {
std::string closest(const Report& r) {
  for (const auto& t : r.tried)
    if (!t.confirmed) {
      std::string s = t.cls + " " + t.phrase + " (" + fmt_num(t.worst, 3) + " x its tolerance)";
      return s;
    }
  return "";
}
}  // namespace

void print_report(std::ostream& os, const Report& r) {
  if (!r.searched) {
    if (!r.reason.empty()) os << "hypotheses: " << r.reason << "\n";
    return;
  }
  os << "hypotheses: " << r.reason << ", " << fmt_num(r.seconds, 2) << " s\n";
  if (r.confirmed.empty()) {
    os << "  none confirmed: no catalogued bug class reproduces the candidate within tolerance";
    if (const auto c = closest(r); !c.empty()) os << "; closest " << c;
    os << "\n";
    return;
  }
  for (size_t i = 0; i < r.confirmed.size() && i < 4; ++i)
    os << "  confirmed " << r.confirmed[i].cls << ": " << r.confirmed[i].phrase << " (worst output at "
       << fmt_num(r.confirmed[i].worst, 3) << " x its tolerance)\n";
  if (r.confirmed.size() > 4) os << "  and " << r.confirmed.size() - 4 << " more confirmed\n";
}

void explain(Diagnosis& d, const Report& r) {
  if (!r.searched) return;
  if (r.confirmed.empty()) {
    std::string s = "no catalogued bug class reproduces it on the stage's own inputs (" + r.reason + ")";
    if (const auto c = closest(r); !c.empty()) s += "; closest: " + c;
    d.evidence.push_back(s);
    return;
  }
  std::vector<std::string> ev;
  std::string fits;
  for (const auto& [n, f] : r.confirmed.front().outputs) {
    const auto as = r.as_run.find(n);
    fits += (fits.empty() ? "" : "; ") + n + " rel_l2 " + fmt_num(f.rel_l2) + ", worst token " + fmt_num(f.token_rel) +
            " (tolerance " + fmt_num(f.tol) + ", " + fmt_num(f.token_tol) + ")" +
            (as == r.as_run.end() ? "" : "; as run " + fmt_num(as->second.rel_l2));
  }
  ev.push_back("re-run on the stage's inputs: " + fits);
  if (r.confirmed.size() > 1) {
    std::string also;
    for (size_t i = 1; i < r.confirmed.size() && i < 5; ++i)
      also += (also.empty() ? "" : "; ") + r.confirmed[i].cls + " " + r.confirmed[i].phrase;
    ev.push_back("also reproduce it: " + also);
  }
  if (!d.pattern.empty()) ev.push_back("the pattern in the error alone (unconfirmed): " + d.pattern);
  ev.insert(ev.end(), d.evidence.begin(), d.evidence.end());
  d.pattern = r.sentence();
  d.confidence = "confirmed";
  d.fit.clear();
  d.evidence = std::move(ev);
}

std::map<std::string, Tolerance> stage_tolerances(const CompareReport& rep, int layer, const std::string& stage) {
  std::map<std::string, Tolerance> t;
  for (const auto& r : rep.results)
    if (r.layer == layer && r.stage == stage && !r.weight) t[r.name] = r.tol;
  return t;
}

const std::vector<BugClass>& catalogue() {
  static const std::vector<BugClass> all = [] {
    std::vector<BugClass> v;
    for (auto f : {norm_classes, rope_classes, projection_classes, absorb_classes, cache_classes, attention_classes, dsa_classes,
                   output_classes})
      for (auto& k : f()) v.push_back(std::move(k));
    return v;
  }();
  return all;
}

namespace {
std::string stage_list(const BugClass& k) {
  std::string s;
  for (auto st : k.stages) s += (s.empty() ? "" : ", ") + std::string(stage_name(st));
  return s;
}
}  // namespace

std::string catalogue_markdown() {
  std::ostringstream os;
  std::string family;
  for (const auto& k : catalogue()) {
    if (k.family != family) {
      family = k.family;
      os << "\n### " << family << "\n\n| Class | Stages | Fitted | What the candidate did |\n|---|---|---|---|\n";
    }
    std::string d;
    for (char ch : k.description) d += ch == '|' ? std::string("\\|") : std::string(1, ch);
    os << "| `" << k.name << "` | " << stage_list(k) << " | " << k.complexity << " | " << d << " |\n";
  }
  return os.str();
}

std::string catalogue_text() {
  std::ostringstream os;
  for (const auto& k : catalogue())
    os << k.name << std::string(k.name.size() < 28 ? 28 - k.name.size() : 1, ' ') << k.description << "\n"
       << std::string(28, ' ') << "stages: " << stage_list(k) << "\n";
  os << catalogue().size() << " classes\n";
  return os.str();
}

// ---- building a case from dumps

bool make_case(StageCase& c, const Dump& inputs_dump, const Dump& outputs_dump, const MlaConfig& cfg,
               const RunSpec& spec, const LayerWeights& w, const Inputs& run_inputs, int layer, Stage stage,
               const std::map<std::string, Tolerance>& tol, std::string& why) {
  c.cfg = cfg;
  c.spec = spec;
  c.batch = run_inputs.batch;
  c.w = std::shared_ptr<const LayerWeights>(&w, [](const LayerWeights*) {});  // a view
  c.layer = layer;
  c.stage = stage;
  c.tol = tol;
  const StageGraph graph = build_graph(cfg, spec.graph_shape());
  const StageSpec* st = graph.find_stage(stage);
  if (!st) {
    why = "stage " + std::string(stage_name(stage)) + " is not in this run's graph";
    return false;
  }
  auto full = [&](const Dump& d, const std::string& name, Tensor& out) {
    const DumpProbe* p = d.find(layer, name);
    if (!p) return false;
    const Gathered g = gather(*p);
    if (!g.full) return false;
    out = g.data;
    return true;
  };
  for (const auto& n : st->inputs) {
    Tensor t;
    if (!full(inputs_dump, n, t)) {
      why = "the full tensor of stage " + std::string(stage_name(stage)) + "'s input " + n + " is not held";
      return false;
    }
    c.in[n] = std::move(t);
  }
  if (stage == Stage::Stage_residual && !c.in.count("h")) {
    why = "the layer input h is not held";
    return false;
  }
  for (const auto& n : st->outputs) {
    Tensor t;
    if (full(outputs_dump, n, t)) c.cand[n] = std::move(t);
  }
  if (stage == Stage::Stage_all_reduce)
    if (const DumpProbe* p = inputs_dump.find(layer, "o_partial"))
      for (const auto& rk : p->ranks)
        if (rk.data.numel() > 0) c.o_partial_ranks.push_back(as_2d(rk.data));
  // The paged caches: the run's context, and this step's rows as the inputs' side wrote them.
  if (layer < static_cast<int>(run_inputs.kv_cache.size())) c.cache_before = run_inputs.kv_cache[layer];
  if (layer < static_cast<int>(run_inputs.index_cache.size())) c.index_cache_before = run_inputs.index_cache[layer];
  if (stage == Stage::Stage_attention_mha || stage == Stage::Stage_attention_mqa) {
    Tensor rows;
    if (!full(inputs_dump, "kv_cache", rows)) {
      why = "the full tensor of kv_cache (the rows attention reads) is not held";
      return false;
    }
    if (c.cache_before.numel() == 0) {
      why = "the run's paged cache is not at hand";
      return false;
    }
    c.cache_after = write_rows(c.cache_before, c.batch, rows);
  }
  if (c.cache_before.numel() == 0 && stage == Stage::Stage_cache_write) {
    why = "the run's paged cache is not at hand";
    return false;
  }
  return true;
}

}  // namespace mla::hyp
