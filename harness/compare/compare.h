// Compare two dumps probe by probe: refuse dumps that cannot be compared, gather shards to the global layout, measure
// the error (full tensors when both sides have them, else stats and sketches), hold it against a tolerance that says
// where it came from, name the first divergence in graph order, and account for every probe the reference's stage
// graph expects (matched, or missing with the reason).
#pragma once
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/compare/selection.h"
#include "probes/dump.h"

namespace mla {

// num / den; inf where only the numerator is nonzero, 0 for 0 / 0.
inline double ratio_or_inf(double num, double den) {
  if (den > 0) return num / den;
  return num > 0 ? INFINITY : 0.0;
}

// A relative L2 error from sums of squares: sqrt(err2 / ref2); inf where only the error is nonzero.
inline double rel_of_sums(double err2, double ref2) {
  if (ref2 > 0) return std::sqrt(err2 / ref2);
  return err2 > 0 ? INFINITY : 0.0;
}

// One probe gathered across ranks to its global layout.
struct Gathered {
  std::vector<int64_t> shape;  // global
  int tp = 1;
  bool full = false;           // every rank had its data: `data` is the global tensor
  Tensor data;
  bool sketch = false;         // every rank had a sketch: `sketch_rows` is the global [T, 32]
  std::vector<float> sketch_rows;
  double l2 = 0, absmax = 0;
  int64_t nan = 0, inf = 0;
  std::vector<float> token_l2;  // [T] global
  std::vector<float> head_l2;   // [T, N] global (heads probes)
  // e.g. "replicated probe differs on rank 3 (full data vs rank 0: ...)": replicas are judged on the most their
  // records carry (full data, else sketches, else stats; checksums only where both ranks have one)
  std::vector<std::string> problems;
  int missing_ranks = 0;
};
Gathered gather(const DumpProbe& p);

struct Coord {
  int layer = 0, rank = -1;
  int64_t token = -1, head = -1, channel = -1;
  std::string to_string() const;
};

struct Metrics {
  std::string basis;  // "full" or "sketch" (from stats and sketches: no element-wise metrics)
  double rel_l2 = 0;  // ‖a−b‖/‖b‖ (full), or sketch-estimated
  double cosine = 1;
  double nmse = 0;
  double norm_ratio = 1;  // ‖a‖/‖b‖
  double max_abs = 0;
  Coord max_at;
  double a_at_max = 0, b_at_max = 0;
  double mismatch = 0;  // fraction failing allclose(atol, rtol)
  int64_t nan_a = 0, nan_b = 0, inf_a = 0, inf_b = 0;
  bool nonfinite_agree = true;
  std::string first_nonfinite;  // coordinates of the first NaN/Inf in a that b lacks
  std::vector<double> token_rel;  // [T]
  std::vector<double> head_rel;   // [N] (heads probes)
  std::vector<double> rank_rel;   // [tp] per rank shard (heads: its heads; partial: its partial)
  double nope_rel = -1, rope_rel = -1;    // channel groups (probes with rope lanes)
  double first_half_rel = -1, second_half_rel = -1;
  double max_token_rel = 0;
  std::vector<double> token_norm_ratio;  // [T] ‖a_t‖/‖b_t‖
  std::vector<double> token_cos;         // [T] cosine of a_t and b_t
  std::vector<double> token_head_rel;    // [T, N] (heads probes, full basis): the heat map
  // Per channel of a token's row, summed over tokens (full basis): Σ(a−b)² and Σb². The row is the probe's
  // trailing dims flattened (heads probes: head-major, h·X + c). channel_block_rel groups them into blocks: a
  // block-scaled weight (FP8, 128x128) read with the wrong scales leaves error that is uniform within blocks.
  std::vector<double> channel_err2, channel_ref2;  // [row]
  // Σa² and Σa·b per channel (full basis; empty otherwise): per-channel factor and cosine over tokens, which tell
  // a per-channel scale (a norm without its weight) from other per-channel error.
  std::vector<double> channel_cand2, channel_dot;  // [row]
  struct Element {
    Coord at;
    double a = 0, b = 0;
  };
  std::vector<Element> worst;  // largest |a−b| first (full basis), at most 8
};

struct Tolerance {
  double rel_l2 = 0;
  double token_rel = 0;  // worst single token
  std::string origin;    // "calibrated: 4 x bf16 noise floor 3.1e-3", "floor for exact comparison", "--tol"
};

// Tolerances per probe name (layer-independent), with a default.
struct ToleranceModel {
  std::map<std::string, Tolerance> per_probe;
  Tolerance fallback{1e-5, 1e-5, "floor for FP32-vs-FP32 comparison (1e-5: FP32 rounding through a layer)"};
  std::map<std::string, double> overrides;  // --tol probe=value
  Tolerance for_probe(const std::string& name, int layer) const;
};

enum class Verdict { Verdict_pass, Verdict_diverge, Verdict_missing, Verdict_nonfinite };
const char* verdict_name(Verdict v);

struct ProbeResult {
  int layer = 0;
  std::string name, stage, contract;
  std::vector<int64_t> shape;
  int order = 0;
  Metrics m;
  Tolerance tol;
  Verdict verdict = Verdict::Verdict_pass;
  std::string why;        // one line: which limit, by how much (missing: why it was not compared)
  std::vector<std::string> problems;
  bool missing_allowed = false;  // Verdict_missing that the user allowed (--allow-missing): reported, not failed
  bool weight = false;           // a layer weight (CompareReport::weights), not an activation probe
  // DSA's topk, compared as sets of keys (harness/compare/selection.h): the pattern over the tokens that differ;
  // `why` holds SelectionDiff::explain().
  bool selection = false;
  SelectionPattern selection_pattern = SelectionPattern::SelectionPattern_none;
  int selection_shift = 0;  // SelectionPattern_shifted's offset
  int64_t near_tie_swaps = 0;
  // A weight beyond tolerance, described (describe_weight): the pattern in plain words and the numbers behind it.
  std::string pattern;
  std::vector<std::string> evidence;
  std::vector<int> ranks_off;  // ranks whose shard of the weight is beyond tolerance
  bool matched() const { return verdict != Verdict::Verdict_missing; }
  std::string label() const;     // "q_c", or "layer1/q_c" where layers matter (set by compare_dumps); weights:
                                 // "weight q_a_proj", "weight layer1/q_a_proj"
  bool multi_layer = false;
};

// The layout version of every JSON report the tool writes (compare, bisect, replay, golden check, zoo, bench): each
// carries it as "schema_version" (docs/commands.md, Reports). Raised when a key is renamed, removed or changes
// meaning.
inline constexpr int kJsonSchemaVersion = 1;

struct CompareReport {
  std::string a_path, b_path, a_status, b_status;
  // Every expected probe in (layer, graph order): matched ones with their metrics, the others Verdict_missing.
  std::vector<ProbeResult> results;
  int first_divergence = -1;         // index into results
  // The weights both dumps recorded, compared before the activations (harness/compare/weight_diff.h), and the first
  // beyond its tolerance (index into weights, -1 none). A weight that differs fails the comparison.
  std::vector<ProbeResult> weights;
  int first_weight = -1;
  std::vector<std::string> notes;    // e.g. "b has no full tensors: metrics from sketches"
  int expected = 0;                  // probes expected: the reference's stage graph, or the --probes selection
  int matched = 0;                   // of those, present in both dumps and compared
  std::string expected_from;         // where the expected list came from, in words
  bool stopped_early() const { return a_status != "complete" || b_status != "complete"; }
  int divergent() const;             // results beyond tolerance (diverge or NaN/Inf)
  int divergent_weights() const;
  std::vector<const ProbeResult*> missing(bool allowed) const;  // missing probes, not allowed / allowed ones
  bool missing_fails() const { return !missing(false).empty(); }
  // 3 a dump stopped early, 2 nothing matched, 1 a divergence or a missing probe not allowed, 0 pass.
  int exit_code() const;
  // One line that counts: "17 of 19 probes matched, 2 missing (o_partial, o): FAIL". Never a pass for a dump
  // that stopped early, for missing probes or for nothing matched.
  std::string verdict_line() const;
};

// Which probes a comparison expects. Names are probe names ("q_c": every layer) or one layer's ("layer1/q_c",
// "1/q_c"); a name the reference's graph does not have is a UsageError.
struct CompareOptions {
  double atol = 1e-3, rtol = 1e-2;  // for the mismatch fraction only (bf16-sized)
  std::vector<std::string> only;           // --probes: compare only these (the rest are not expected)
  std::vector<std::string> allow_missing;  // --allow-missing: may be absent without failing the comparison
};

// The differences that make two dumps incomparable: model dimensions, mode, tokens / batch / context, where the
// layer starts (h or x), the inputs' shape, and the shapes of probes both hold. Empty: comparable. A different tp
// is not a difference (each side is gathered to the global layout first), nor are engine, dtype or input seed.
std::vector<std::string> check_comparable(const Dump& a, const Dump& b);
// Throws UsageError ("cannot compare A with B: ...") listing check_comparable's differences.
void require_comparable(const Dump& a, const Dump& b);

// One expected probe: its place in the graph and where the expectation came from.
struct ExpectedProbe {
  int layer = 0;
  std::string name, stage, contract;
  std::vector<int64_t> shape;
  int order = 0;
  bool allowed_missing = false;
};
struct ExpectedProbes {
  std::vector<ExpectedProbe> probes;  // (layer, graph order)
  std::string from;                   // "the stage graph of REFERENCE's config and run spec", ...
  std::vector<std::string> notes;     // e.g. the probes one attention form has and the other lacks
  bool multi_layer = false;
};
// The probes `b` (the reference) expects of `a`: build_graph of b's config and run spec for each of its layers
// (without a config or run spec: b's own probes), less the probes of another attention form when a's differs,
// narrowed to opt.only. Throws UsageError for a name in opt.only or opt.allow_missing that the graph lacks.
ExpectedProbes expected_probes(const Dump& a, const Dump& b, const CompareOptions& opt);

// Throws UsageError for a --tol override (PROBE=REL_L2) whose PROBE is none of `probes` (the names of the stage
// graph the comparison expects, described by `from`), naming it and listing them.
void check_tol_overrides(const std::map<std::string, double>& overrides, const std::vector<std::string>& probes,
                         const std::string& from);

// Throws UsageError when a dump cannot be read as mla-bisect writes it: a probe with no rank records (its data
// somewhere else), a complete dump whose probe lacks ranks, a full-level record without data.
void require_readable(const Dump& d);

// DSA: topk compared as sets of keys per token. ref_topk, cand_topk: [T, index_topk], −1 past a token's last key;
// ref_scores (optional): the reference's idx_scores [T, keys] in full, which near-ties are judged on; cand_scores
// (optional, with ref_scores): the candidate's, whose largest difference from ref_scores in a token's row, doubled,
// bounds that token's near-ties; without them `fallback_tie` does. `batch` (optional) says which keys each token sees.
// `bound` and `widest` (optional) receive the bound in words and its largest value. A token whose sets differ only by
// near-tie swaps is in SelectionDiff::swapped_tokens: not a divergence at topk, but its attention reads other keys,
// so the probes after topk hold it to whatever its reference attention read (never excused).
SelectionDiff compare_topk(const Tensor& ref_topk, const Tensor& cand_topk, const Tensor* ref_scores,
                           const Tensor* cand_scores, const Batch* batch, double fallback_tie,
                           std::string* bound = nullptr, double* widest = nullptr);
// The tokens of `layer` whose top-k in `a` (the candidate) differs from `b`'s only by swaps between near-tied keys,
// judged as compare_dumps judges topk; empty where either lacks topk in full.
std::vector<int64_t> near_tie_tokens(const Dump& a, const Dump& b, int layer, const ToleranceModel& tol);
// Whether a stage reads DSA's selection, or comes after the one that does: the attention and every stage after it.
bool reads_selection(const std::string& stage);

// rel_l2 per group of `block` consecutive entries of per-channel sums (Metrics::channel_err2 / channel_ref2);
// the last group may be shorter.
std::vector<double> channel_block_rel(const std::vector<double>& err2, const std::vector<double>& ref2, int64_t block);

Metrics compare_gathered(const Gathered& a, const Gathered& b, const DumpProbe& spec, int layer,
                         const CompareOptions& opt);
// The verdict of a measured result (r.m against r.tol; a replica problem of the candidate fails it too) and its
// one-line reason. `row`: what a row of the first axis is ("token", or "row" for a weight).
void judge(ProbeResult& r, const Gathered& candidate, const char* row = "token");
// `a` is the candidate, `b` the reference (rel_l2 is relative to b). Throws UsageError when the dumps are not
// comparable (require_comparable), not readable (require_readable), or when nothing expected matched while both
// dumps are complete ("no probe of B matched in A: ...").
CompareReport compare_dumps(const Dump& a, const Dump& b, const ToleranceModel& tol, const CompareOptions& opt = {});

}  // namespace mla
