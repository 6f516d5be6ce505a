// attention_mqa versions 2 and 3: split-KV over the paged latent cache on the tensor cores, then a combine pass.
#pragma once
#include "kernels/rank_context.cuh"

namespace mla::cuda {

struct MqaSplitParams {
  const bf16* q_latent = nullptr;  // [T, heads, L]
  const bf16* q_pe = nullptr;      // [T, heads, R]
  const bf16* cache = nullptr;     // [blocks, 64, L+R]
  const int* block_table = nullptr;  // [B, max_blocks] device; nullptr: the batch's
  int64_t cache_rows = 0;            // rows of the cache (pages · 64): version 3's TMA map
  int L = 0, R = 0, heads = 0, tokens = 0;
  float scale = 0.f;
  bf16* out = nullptr;   // [T, heads, L]
  float* lse = nullptr;  // [T, heads] natural log
};

// Whether the split kernel covers these dims (L ≤ 512, L + R ≤ 576, multiples of 8).
bool mqa_split_supports(int L, int R);
// Runs on rc's stream with rc's batch layout (causal, bottom-right) and scratch for the partial results.
void launch_attention_mqa_split(const MqaSplitParams& p, RankContext& rc);
// How a launch of versions 2 and 3 splits the keys: blocks of `groups` query-row groups per sequence, `splits`
// splits of `tiles_per_split` pages each (whole pages of `page_keys`), enough to fill the multiprocessors about once
// with one resident block each.
struct MqaSplitPlan {
  int splits = 1, tiles_per_split = 1;
};
MqaSplitPlan mqa_split_plan(const RankContext& rc, int groups, int page_keys);
// Version 3 (attention_mqa_wgmma.cu): the same split-KV plan on Hopper's wgmma and TMA, where sm90a_available()
// (tensor_map.cuh).
void launch_attention_mqa_wgmma(const MqaSplitParams& p, RankContext& rc);
// The merge of `splits` normalised partial outputs o_part [splits, TH, L] (fp32, L a multiple of 4) by their lse
// (log2 units, −inf: the split saw no key): out = Σ_s 2^(lse_s − lse)·o_s (bf16) and lse (natural log); a row no
// split saw: 0 and −inf. One warp per (token, head) row; also DSA's sparse kernel's (attention_sparse.cu).
void launch_mqa_combine(const float* o_part, const float* lse_part, int splits, int64_t TH, int L, bf16* out,
                        float* lse, cudaStream_t stream);

}  // namespace mla::cuda
