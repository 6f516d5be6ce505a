// DSA's top-k selections (docs/mla.md) compared as what they are: a set of keys per query token, not a tensor of
// indices whose differences would mean nothing. Two selections agree on a token when they hold the same keys, up to
// swaps across the selection's boundary between keys whose reference scores tie with its last selected key within
// `tie_tol` (an indexer computing the same scores in another order or precision may pick either). Otherwise the
// token differs, and the comparison says how: the first token, how many keys it lacks and adds, and the pattern of
// the difference over every token that differs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/tensor.h"

namespace mla {

enum class SelectionPattern {
  SelectionPattern_none,        // every token agrees
  SelectionPattern_future,      // the candidate selects keys its query cannot see (a causal leak in the scores)
  SelectionPattern_shifted,     // every differing token's keys are the reference's moved by one offset
  SelectionPattern_recent,      // the keys the candidate lacks are the newest its query sees (a causal offset)
  SelectionPattern_count,       // the candidate selects a different number of keys (top-k off by one)
  SelectionPattern_scattered,   // none of those: the scores themselves differ (indexer q/k, rope, norm, weights)
};
const char* selection_pattern_name(SelectionPattern p);
// What the pattern points at, in words ("a causal leak in the index scores", ...); "" for none.
std::string selection_pattern_meaning(SelectionPattern p, int shift = 0);

struct SelectionDiff {
  int64_t tokens = 0;          // query tokens compared
  int64_t differing = 0;       // tokens whose sets differ beyond near-ties
  int64_t near_tie_swaps = 0;  // keys swapped across the boundary between near-tied keys (not a divergence)
  // The tokens whose sets differ only by those swaps, ascending: they attend to other keys than the reference's.
  std::vector<int64_t> swapped_tokens;
  double mean_overlap = 1.0;   // mean over tokens of |ref ∩ cand| / |ref| (1 where the reference selects none)
  // The first differing token: its set size in the reference, and the keys the candidate lacks and adds there.
  int64_t first_token = -1, first_size = 0;
  std::vector<int> first_missing, first_extra;
  SelectionPattern pattern = SelectionPattern::SelectionPattern_none;
  int shift = 0;  // SelectionPattern_shifted: candidate key = reference key + shift

  bool diverges() const { return differing > 0; }
  // One sentence for reports: "token 17 selects 3 of 12 keys the reference does not (...); ...".
  std::string explain() const;
};

// ref, cand: the selected keys per query token (any order); ref_scores [tokens, keys]: the reference's index scores,
// −inf where the query does not see the key (the keys it sees are those with a finite score).
SelectionDiff compare_selection(const std::vector<std::vector<int>>& ref, const std::vector<std::vector<int>>& cand,
                                const Tensor& ref_scores, double tie_tol);
// The same with a bound per token (tie_tol[t]).
SelectionDiff compare_selection(const std::vector<std::vector<int>>& ref, const std::vector<std::vector<int>>& cand,
                                const Tensor& ref_scores, const std::vector<double>& tie_tol);

}  // namespace mla
