// Compare two dumps probe by probe (DESIGN.md "Compare"): gather shards to the global layout, measure the
// error (full tensors when both sides have them, else stats and sketches), hold it against a tolerance
// that says where it came from, and name the first divergence in graph order.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "probes/dump.h"

namespace mla {

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
  std::vector<std::string> problems;  // e.g. "replicated probe differs on rank 3 (checksum)"
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
  std::string why;        // one line: which limit, by how much
  std::vector<std::string> problems;
};

struct CompareReport {
  std::string a_path, b_path, a_status, b_status;
  std::vector<ProbeResult> results;  // (layer, order)
  int first_divergence = -1;         // index into results
  std::vector<std::string> notes;    // e.g. "b has no full tensors: metrics from sketches"
  bool stopped_early() const { return a_status != "complete" || b_status != "complete"; }
};

struct CompareOptions {
  double atol = 1e-3, rtol = 1e-2;  // for the mismatch fraction only (bf16-sized)
};

// rel_l2 per group of `block` consecutive entries of per-channel sums (Metrics::channel_err2 / channel_ref2);
// the last group may be shorter.
std::vector<double> channel_block_rel(const std::vector<double>& err2, const std::vector<double>& ref2, int64_t block);

Metrics compare_gathered(const Gathered& a, const Gathered& b, const DumpProbe& spec, int layer,
                         const CompareOptions& opt);
// `a` is the candidate, `b` the reference (rel_l2 is relative to b).
CompareReport compare_dumps(const Dump& a, const Dump& b, const ToleranceModel& tol, const CompareOptions& opt = {});

// Calibrates tolerances: runs the reference at FP32 and at `precision` on the same config, weights and inputs,
// and takes k × the per-probe error (rel_l2, worst token) as the tolerance, with a floor.
ToleranceModel calibrate(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                         const Inputs& inputs, Precision precision, double k = 4.0);

}  // namespace mla
