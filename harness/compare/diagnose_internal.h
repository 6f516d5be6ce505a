// What the diagnosis rules share (harness/compare/diagnose*.cpp): the measurements they read, what a rule finds,
// the helpers their evidence is written with, and the rules, each in the file of its family.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/compare/diagnose.h"

namespace mla::diagnose_detail {

// What the rules read, measured once. Each rule looks for its own evidence in these and says which numbers it
// used; none assumes another rule has ruled something out, so that their order (diagnose_pattern in diagnose.cpp)
// only picks the most specific of several that fit.
struct Ctx {
  const ProbeResult& r;
  const Metrics& m;
  const Tolerance& tol;
  const Batch& batch;
  const CompareReport& all;
  int64_t T = 0, N = 0, C = 0, X = 0;  // tokens, heads, channels of a token's row, channels per head
  std::vector<char> off;               // token above the per-token tolerance
  int64_t n_off = 0;
  bool positions = false;        // the batch's layout is the probe's tokens
  bool per_token = false;        // per-token cosines and norm ratios
  bool channels = false;         // per-channel error sums
  bool channel_factors = false;  // per-channel Σa² and Σa·b too
  bool attention = false, rope_stage = false, norm_stage = false, projection = false;
  std::vector<int64_t> heads_off;
};

struct Finding {
  std::string pattern, confidence;
  std::vector<std::string> evidence;
};
using Found = std::optional<Finding>;

// The helpers of the rules' evidence (diagnose.cpp).
std::string percent(double f);
std::string values(const std::vector<double>& v, int precision = 3, size_t max_items = 16);
// Where the error points relative to the reference, in units of its own energy: (a−b)·b / ‖a−b‖², from the norm
// ratio and rel_l2 alone (‖a‖² = ‖b‖² + 2(a−b)·b + ‖a−b‖²). −1: the error is orthogonal to the candidate, which is
// the reference minus a part (a term of a sum missing); +1: the reference plus a part of itself (a term counted
// twice); 0: error unrelated to the reference (noise, a different tensor of the same size: ‖a‖² = ‖b‖² + ‖a−b‖²).
double part_index(double norm_ratio, double rel);
// Channels by name: "channels 8-15", or per head "head 2 lanes 0-3; head 5 lane 1".
std::string channel_names(const Ctx& c, const std::vector<int64_t>& sorted);
// Per-channel factor of the candidate over the reference (least squares over tokens) and their cosine over tokens:
// a channel that is the reference times a constant has cosine 1.
double channel_factor(const Metrics& m, size_t c);
double channel_cos(const Metrics& m, size_t c);

// The rules. Each fires on its own evidence or returns nothing; diagnose_pattern (diagnose.cpp) tries them most
// specific first.
// Along the tokens (diagnose_tokens.cpp): unwritten rows, sequences, RoPE, the softmax scale, positions, scattered
// tokens, DSA's index mask.
Found rule_unwritten(const Ctx& c);
Found rule_sequences(const Ctx& c);
Found rule_rope(const Ctx& c);
Found rule_softmax(const Ctx& c);
Found rule_positions(const Ctx& c);
Found rule_scattered(const Ctx& c);
Found rule_index_mask(const Ctx& c);
// Across the tensor (diagnose_channels.cpp): ranks, block-shaped error, channels, heads.
Found rule_ranks(const Ctx& c);
Found rule_blocks(const Ctx& c);
Found rule_channels(const Ctx& c);
Found rule_heads(const Ctx& c);
// The candidate as the reference transformed (diagnose_factors.cpp): one factor, per-channel and per-token factors,
// a missing norm, the data moved.
Found rule_scale(const Ctx& c);
Found rule_channel_scale(const Ctx& c);
Found rule_token_scale(const Ctx& c);
Found rule_norm_missing(const Ctx& c);
Found rule_layout(const Ctx& c);
// Sums and neighbouring probes (diagnose_sums.cpp): the all-reduce, DSA's index combination, a neighbour's tensor
// missing from a sum or added twice, a part of the sum missing or counted twice.
Found rule_all_reduce(const Ctx& c);
Found rule_index_combine(const Ctx& c);
Found rule_neighbour_equal(const Ctx& c);
Found rule_neighbour_part(const Ctx& c);
Found rule_sum_part(const Ctx& c);

}  // namespace mla::diagnose_detail
