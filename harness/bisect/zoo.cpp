// Scoring one zoo case: localized means the first divergence is one of the probes the zoo table names; the pattern is
// right when the diagnosis names the bug's mechanism in the words below.
#include "harness/bisect/zoo.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "harness/report/compare_report.h"

namespace mla {

std::string zoo_pattern_words(const std::string& inject) {
  // Words of the rule that describes each planted bug's mechanism (not the symptom another rule would also see).
  static const std::pair<const char*, const char*> words[] = {
      {"rope-neox", "RoPE layout or frequency"},
      {"rope-mscale", "pure scale"},
      {"position-offset", "positions offset"},
      {"softmax-scale", "the softmax scale"},
      {"causal-off", "causal mask is missing"},
      {"kv-b-split", "layout"},
      {"kv-norm-skip", "scale per token"},
      {"tp-head-offset", "sharding"},
      {"allreduce-skip", "the all-reduce"},
      {"wuk-transpose", "layout"},
      {"lse-base2", "cached context"},
      {"page-off-by-one", "paging"},
      {"decode-empty-cache", "all zeros"},
      {"residual-drop", "residual add dropped"},
      {"kv-norm-no-weight", "the norm without its weight"},
      {"q-norm-width", "scale per token"},
      {"o-proj-half-heads", "reference minus a part"},
      {"v-up-head", "a single head off"},
      {"sliding-window", "sliding window"},
      {"kv-a-rows-tile", "never written"},
      {"kv-norm-weight-wrap", "a channel group off"},
      {"fp8-scale-transpose", "block-shaped"},
      {"nvfp4-nibble-swap", "layout"},
      {"nvfp4-global-recip", "pure scale"},
      {"index-rope-layout", "RoPE layout or frequency"},
      {"index-k-norm-skip", "normalization missing"},
      {"index-weights-skip", "per-head weights"},
      {"index-causal-leak", "cannot see"},
      {"topk-off-by-one", "top-k off by one"},
      {"nan-at", "NaN/Inf originates here"},
  };
  const std::string name = inject.substr(0, inject.find(':'));
  for (const auto& [n, w] : words)
    if (name == n) return w;
  return "";
}

std::vector<std::string> zoo_expected_classes(const std::string& inject) {
  static const std::pair<const char*, std::vector<std::string>> classes[] = {
      {"rope-neox", {"rope.layout"}},
      {"rope-mscale", {"rope.mscale", "output.scale"}},
      {"position-offset", {"rope.position_offset"}},
      {"softmax-scale", {"attn.scale"}},
      {"causal-off", {"attn.causal_off"}},
      {"kv-b-split", {"proj.head_major_split"}},
      {"kv-norm-skip", {"norm.skipped"}},
      {"tp-head-offset", {"proj.heads_permuted", "weight"}},
      {"allreduce-skip", {"reduce.rank_missing"}},
      {"wuk-transpose", {"absorb.transposed"}},
      {"lse-base2", {"attn.merge_base2"}},
      {"page-off-by-one", {"attn.page_shift"}},
      {"decode-empty-cache", {"attn.context_missing"}},
      {"residual-drop", {"residual.dropped"}},
      {"kv-norm-no-weight", {"norm.no_weight"}},
      {"q-norm-width", {"norm.width"}},
      {"o-proj-half-heads", {"proj.short_reduction"}},
      {"v-up-head", {"absorb.head_weight"}},
      {"sliding-window", {"attn.window"}},
      {"kv-a-rows-tile", {"output.tail_unwritten"}},
      {"kv-norm-weight-wrap", {"norm.weight_wrap"}},
      {"fp8-scale-transpose", {"weight", "proj.block_scale"}},
      {"nvfp4-nibble-swap", {"weight"}},
      {"nvfp4-global-recip", {"weight", "proj.scale"}},
      {"index-rope-layout", {"dsa.index_rope_layout"}},
      {"index-k-norm-skip", {"dsa.index_k_norm_skipped"}},
      {"index-weights-skip", {"dsa.index_weights_skipped"}},
      {"index-causal-leak", {"dsa.future_keys"}},
      {"topk-off-by-one", {"dsa.topk_count"}},
  };
  const std::string name = inject.substr(0, inject.find(':'));
  for (const auto& [n, v] : classes)
    if (name == n) return v;
  return {};
}

ZooRow run_zoo_case(const ZooCase& c) {
  ZooRow row;
  row.c = c;
  try {
    BisectOptions o = c.options;
    o.inject = c.inject;
    const BisectReport rep = run_bisect(o);
    row.seconds = rep.seconds;
    row.found = rep.first ? rep.first->name : "-";
    // The rules' words: a confirmed cause replaces the diagnosis's pattern and keeps them in rule_pattern.
    row.pattern = !rep.first ? "" : rep.diagnosis.confidence == "confirmed" ? rep.diagnosis.rule_pattern : rep.diagnosis.pattern;
    if (rep.weight_cause) row.cause = "weight " + rep.weight_cause->name;
    else if (!rep.hypotheses.confirmed.empty()) row.cause = rep.hypotheses.confirmed.front().cls;
    if (c.expected.empty()) {
      row.ok = rep.exit_code == 0;
      row.verdict = row.ok ? "clean" : "FALSE ALARM";
    } else if (rep.exit_code == 1) {
      row.ok = std::find(c.expected.begin(), c.expected.end(), row.found) != c.expected.end();
      row.verdict = row.ok ? "localized" : "wrong probe";
      row.pattern_ok = row.ok && !c.pattern_words.empty() && row.pattern.find(c.pattern_words) != std::string::npos;
      const auto want = zoo_expected_classes(c.inject);
      if (!want.empty()) {
        const std::string got = row.cause.rfind("weight ", 0) == 0 ? "weight" : row.cause;
        row.cause_verdict = row.cause.empty() ? "none"
                            : std::find(want.begin(), want.end(), got) != want.end() ? "right" : "MISLEADING";
      }
    } else {
      row.verdict = rep.exit_code == 0 ? "MISSED" : "engine failed: " + rep.headline;
    }
  } catch (const std::exception& e) {
    row.verdict = std::string("error: ") + e.what();
  }
  return row;
}

void print_zoo(std::ostream& os, const std::vector<ZooRow>& rows) {
  char line[1024];
  std::snprintf(line, sizeof line, "%-22s %-9s %-3s %-22s %-12s %-12s %-7s %-26s %s\n", "injection", "mode", "tp",
                "expected", "found", "verdict", "pattern", "cause (confirmed)", "pattern named");
  os << line;
  int ok = 0, missed = 0, false_alarm = 0, injected = 0, probe_right = 0, scored = 0, pattern_right = 0;
  int causes = 0, cause_right = 0, cause_misleading = 0;
  std::vector<std::string> wrong;
  for (const auto& r : rows) {
    std::string exp;
    for (auto& e : r.c.expected) exp += (exp.empty() ? "" : "|") + e;
    if (exp.empty()) exp = "(none)";
    const bool scores = !r.c.expected.empty() && !r.c.pattern_words.empty();
    const std::string name = r.c.inject.empty() ? "clean seed " + std::to_string(r.c.options.spec.seed) : r.c.inject;
    const std::string cause = r.cause_verdict == "-" ? "-" : r.cause_verdict + (r.cause.empty() ? "" : " " + r.cause);
    std::snprintf(line, sizeof line, "%-22s %-9s %-3d %-22s %-12s %-12s %-7s %-26s %s\n", name.c_str(),
                  mode_name(r.c.options.spec.mode), r.c.options.spec.tp, exp.c_str(), r.found.c_str(), r.verdict.c_str(),
                  !scores ? "-" : r.pattern_ok ? "right" : "WRONG", cause.substr(0, 26).c_str(), r.pattern.substr(0, 90).c_str());
    causes += r.cause_verdict != "-";
    cause_right += r.cause_verdict == "right";
    cause_misleading += r.cause_verdict == "MISLEADING";
    os << line;
    ok += r.ok;
    missed += !r.ok && !r.c.expected.empty();
    false_alarm += !r.ok && r.c.expected.empty();
    injected += !r.c.expected.empty();
    probe_right += r.ok && !r.c.expected.empty();
    scored += scores;
    pattern_right += scores && r.pattern_ok;
    if (scores && !r.pattern_ok) wrong.push_back(name + " (expected \"" + r.c.pattern_words + "\")");
  }
  os << "\n" << ok << " of " << rows.size() << " as expected; " << missed << " injected bugs missed or mislocated, "
     << false_alarm << " clean or benign runs flagged\n";
  os << "probe right " << probe_right << " of " << injected << " injected; pattern right " << pattern_right << " of "
     << scored << "; cause confirmed right " << cause_right << " of " << causes << ", misleading " << cause_misleading
     << "\n";
  for (const auto& w : wrong) os << "  pattern not named: " << w << "\n";
}

}  // namespace mla
