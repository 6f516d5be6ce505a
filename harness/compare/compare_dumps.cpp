// The comparison of two dumps (compare_dumps): each expected probe gathered, measured and judged (DSA's topk as sets
// of keys), the weights compared, the first divergence.
#include "harness/compare/compare.h"
#include "harness/compare/selection.h"
#include "harness/compare/weight_diff.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "harness/compare/compare_internal.h"
#include "harness/compare/format.h"
#include "core/model/errors.h"
#include "core/model/progress_hook.h"

namespace mla {

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

CompareReport compare_dumps(const Dump& a, const Dump& b, const ToleranceModel& tol, const CompareOptions& opt) {
  using compare_detail::groups_text;
  using compare_detail::ranks_of;
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
