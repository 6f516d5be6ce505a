// The reference's cache_write, and reading rows back through the block table, against the double-precision naive
// loops of tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, CacheWriteAndGatherFollowTheShuffledBlockTable) {
  const auto cfg = preset("tiny");
  const int64_t L = cfg.kv_lora_rank, R = cfg.qk_rope, W = L + R;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    // Three sequences: context crossing page boundaries, an empty context, new tokens crossing a boundary.
    const Batch b = shuffled_batch({5, 3, 4}, {130, 0, 62}, seed);
    const int64_t T = b.tokens();
    Tensor cache = randn({b.num_blocks, kPageSize, W}, rng);  // "old" content that must survive
    const Tensor kv_c_norm = randn({T, L}, rng), k_pe_rope = randn({T, R}, rng);

    Tensor want_cache = cache;
    Tensor want_rows({T, W});
    for (int s = 0, t = 0; s < b.num_seqs(); ++s)
      for (int i = 0; i < b.new_lens[s]; ++i, ++t)
        for (int64_t c = 0; c < W; ++c) {
          const float v = c < L ? kv_c_norm.data[t * L + c] : k_pe_rope.data[t * R + c - L];
          want_rows.data[t * W + c] = v;
          want_cache.data[cache_offset(b, s, b.context_lens[s] + i, W) + c] = v;
        }
    const Tensor rows = ref::cache_write(cache, b, kv_c_norm, k_pe_rope);
    expect_identical(rows, want_rows, "kv_cache rows");
    expect_identical(cache, want_cache, "cache after write (new rows placed, every other row untouched)");

    for (int s = 0; s < b.num_seqs(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const int n = b.context_lens[s] + b.new_lens[s];
      Tensor want({n, W});
      for (int slot = 0; slot < n; ++slot)
        std::memcpy(want.ptr() + slot * W, cache.ptr() + cache_offset(b, s, slot, W), sizeof(float) * W);
      expect_identical(ref::gather_cache_rows(cache, b, s, n), want, "gather_cache_rows");
    }
  }
}

}  // namespace
