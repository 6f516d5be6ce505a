// DSA's selections compared as sets (harness/compare/selection.h), on the reference indexer's own scores and top-k
// (reference/dsa_indexer.cpp) with the selection bugs a port makes planted in the candidate's sets: a causal leak,
// an off-by-one in the indices, a causal offset in the mask, top-k off by one, and scores that differ; near ties do
// not count.
#include "harness/compare/selection.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/model/errors.h"
#include "reference/stages.h"

namespace mla {
namespace {

constexpr int kTopk = 8;
constexpr int64_t kT = 30;
// The tie tolerance of the planted-bug cases: the scores here are O(1), and a planted bug moves keys whose scores
// differ by far more than 1e-6 from the last selected one, so no difference below is excused as a tie.
constexpr double kTieTol = 1e-6;

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937_64& rng) {
  Tensor t(std::move(shape));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : t.data) v = nd(rng);
  return t;
}

// Index scores of a random indexer over kT tokens (causal: −inf above the diagonal).
Tensor scores(uint64_t seed) {
  std::mt19937_64 rng(seed);
  return ref::indexer_scores(random_tensor({kT, 4, 16}, rng), random_tensor({kT, 16}, rng),
                             random_tensor({kT, 4}, rng));
}

TEST(Selection, EqualSetsInAnyOrderAgree) {
  const Tensor s = scores(1);
  const auto ref = ref::topk_keys(s, kTopk);
  auto cand = ref;
  for (auto& keys : cand) std::reverse(keys.begin(), keys.end());
  const auto d = compare_selection(ref, cand, s, kTieTol);
  EXPECT_FALSE(d.diverges());
  EXPECT_EQ(d.mean_overlap, 1.0);
  EXPECT_EQ(d.explain(), "all 30 tokens select the reference's keys");
}

TEST(Selection, SwapsBetweenTiedKeysAreCountedNotDivergences) {
  Tensor s = scores(2);
  const int64_t t = 20;
  auto ref = ref::topk_keys(s, kTopk);
  // The best unselected key of token 20 ties with its last selected one (one ulp above it).
  const int last = ref[t].back();
  int next = -1;
  for (int k = 0; k <= t; ++k)
    if (std::find(ref[t].begin(), ref[t].end(), k) == ref[t].end() &&
        (next < 0 || s.data[t * kT + k] > s.data[t * kT + next]))
      next = k;
  s.data[t * kT + next] = std::nextafter(s.data[t * kT + last], std::numeric_limits<float>::infinity());
  ref = ref::topk_keys(s, kTopk);
  auto cand = ref;
  std::replace(cand[t].begin(), cand[t].end(), ref[t].back(), ref[t].back() == next ? last : next);
  const auto d = compare_selection(ref, cand, s, 1e-5);  // the tie is one ulp (~5e-7 at these scores)
  EXPECT_FALSE(d.diverges()) << d.explain();
  EXPECT_EQ(d.near_tie_swaps, 1);
  EXPECT_EQ(d.swapped_tokens, std::vector<int64_t>{t});
  // The same swap with a tolerance below the tie is a divergence.
  EXPECT_TRUE(compare_selection(ref, cand, s, 1e-9).diverges());
}

// swapped_tokens names the tokens whose sets differ only by near-tie swaps, not those with a real difference.
TEST(Selection, SwappedTokensAreTheTokensWithOnlyNearTieSwaps) {
  // Every token: key 0 scores 5, key 1 scores 4 (the last selected of 2), key 2 ties with it within 1e-3.
  Tensor s({5, 6});
  for (int64_t t = 0; t < 5; ++t) {
    const float row[6] = {5.f, 4.f, 3.9995f, 2.f, 1.f, 0.f};
    std::copy(row, row + 6, s.data.begin() + t * 6);
  }
  const std::vector<std::vector<int>> ref(5, {0, 1});
  auto cand = ref;
  cand[1] = {0, 2};  // a near-tie swap
  cand[2] = {0, 3};  // key 3 (2.0) is far from the boundary: a real difference
  cand[3] = {2, 1};  // key 0 (5.0) for key 2: the missing key is not near the boundary
  cand[4] = {2, 0};  // a near-tie swap, in another order
  const auto d = compare_selection(ref, cand, s, 1e-3);
  EXPECT_EQ(d.swapped_tokens, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(d.near_tie_swaps, 2);
  EXPECT_EQ(d.differing, 2);
  EXPECT_EQ(d.first_token, 2);
  // With a bound below the tie, no token counts as swapped.
  EXPECT_TRUE(compare_selection(ref, cand, s, 1e-5).swapped_tokens.empty());
  // Equal sets: no token swapped.
  EXPECT_TRUE(compare_selection(ref, ref, s, 1e-3).swapped_tokens.empty());
}

TEST(Selection, ACausalLeakSelectsKeysTheQueryCannotSee) {
  const Tensor s = scores(3);
  const auto ref = ref::topk_keys(s, kTopk);
  auto cand = ref;
  for (int64_t t = kTopk; t + 1 < kT; ++t) cand[t].back() = static_cast<int>(t + 1);  // the next token's key
  const auto d = compare_selection(ref, cand, s, kTieTol);
  ASSERT_TRUE(d.diverges());
  EXPECT_EQ(d.pattern, SelectionPattern::SelectionPattern_future) << d.explain();
  EXPECT_EQ(d.first_token, kTopk);
  EXPECT_EQ(d.first_extra, std::vector<int>{kTopk + 1});
  EXPECT_NE(d.explain().find("causal leak"), std::string::npos) << d.explain();
}

TEST(Selection, AnOffByOneInTheIndicesIsAShift) {
  const Tensor s = scores(4);
  const auto ref = ref::topk_keys(s, kTopk);
  auto cand = ref;
  for (auto& keys : cand)
    for (int& k : keys) k += 1;
  const auto d = compare_selection(ref, cand, s, kTieTol);
  ASSERT_TRUE(d.diverges());
  EXPECT_EQ(d.pattern, SelectionPattern::SelectionPattern_shifted) << d.explain();
  EXPECT_EQ(d.shift, 1);
  EXPECT_EQ(d.first_token, 0);
  EXPECT_EQ(d.differing, kT);
}

TEST(Selection, ACausalOffsetLosesTheNewestKeys) {
  const Tensor s = scores(5);
  const auto ref = ref::topk_keys(s, kTopk);
  Tensor off = s;  // the candidate's mask hides each query's own key
  for (int64_t t = 0; t < kT; ++t) off.data[t * kT + t] = -std::numeric_limits<float>::infinity();
  const auto d = compare_selection(ref, ref::topk_keys(off, kTopk), s, kTieTol);
  ASSERT_TRUE(d.diverges());
  EXPECT_EQ(d.pattern, SelectionPattern::SelectionPattern_recent) << d.explain();
  EXPECT_EQ(d.first_token, 0);  // token 0 sees only itself: the candidate selects nothing
  EXPECT_EQ(d.first_missing, std::vector<int>{0});
  EXPECT_NE(d.explain().find("newest"), std::string::npos) << d.explain();
}

TEST(Selection, TopkOffByOneChangesTheSetSize) {
  const Tensor s = scores(6);
  const auto ref = ref::topk_keys(s, kTopk);
  const auto d = compare_selection(ref, ref::topk_keys(s, kTopk - 1), s, kTieTol);
  ASSERT_TRUE(d.diverges());
  EXPECT_EQ(d.pattern, SelectionPattern::SelectionPattern_count) << d.explain();
  EXPECT_EQ(d.first_token, kTopk - 1);  // the first token that sees kTopk keys
  EXPECT_EQ(d.differing, kT - (kTopk - 1));
}

TEST(Selection, OtherScoresScatterTheDifferences) {
  const Tensor s = scores(7), other = scores(8);
  const auto d = compare_selection(ref::topk_keys(s, kTopk), ref::topk_keys(other, kTopk), s, kTieTol);
  ASSERT_TRUE(d.diverges());
  EXPECT_EQ(d.pattern, SelectionPattern::SelectionPattern_scattered) << d.explain();
  EXPECT_LT(d.mean_overlap, 0.9);  // two random indexers share about k / (keys seen) of each set past the dense rows
  EXPECT_GE(d.first_token, kTopk);  // below top-k tokens every visible key is selected on both sides
}

TEST(Selection, MismatchedInputsAreUsageErrors) {
  const Tensor s = scores(9);
  const auto ref = ref::topk_keys(s, kTopk);
  EXPECT_THROW(compare_selection(ref, std::vector<std::vector<int>>(3), s, kTieTol), UsageError);
  EXPECT_THROW(compare_selection(ref, ref, Tensor({4, 4}), kTieTol), UsageError);
}

}  // namespace
}  // namespace mla
