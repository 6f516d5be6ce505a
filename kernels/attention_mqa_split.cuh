// attention_mqa version 2: split-KV over the paged latent cache on the tensor cores, then a combine pass.
#pragma once
#include "kernels/rank_context.cuh"

namespace mla::cuda {

struct MqaSplitParams {
  const bf16* q_latent = nullptr;  // [T, heads, L]
  const bf16* q_pe = nullptr;      // [T, heads, R]
  const bf16* cache = nullptr;     // [blocks, 64, L+R]
  const int* block_table = nullptr;  // [B, max_blocks] device; nullptr: the batch's
  int L = 0, R = 0, heads = 0, tokens = 0;
  float scale = 0.f;
  bf16* out = nullptr;   // [T, heads, L]
  float* lse = nullptr;  // [T, heads] natural log
};

// Whether the split kernel covers these dims (L ≤ 512, L + R ≤ 576, multiples of 8).
bool mqa_split_supports(int L, int R);
// Runs on rc's stream with rc's batch layout (causal, bottom-right) and scratch for the partial results.
void launch_attention_mqa_split(const MqaSplitParams& p, RankContext& rc);

}  // namespace mla::cuda
