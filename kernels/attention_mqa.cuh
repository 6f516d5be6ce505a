// attention_mqa: the absorbed form over the paged latent cache. Query [q_latent | q_pe_rope]
// (L+R), one key row [kv_c_norm | k_pe_rope] per cached token shared by all heads, value = its first L lanes.
#pragma once
#include "kernels/rank_context.cuh"

namespace mla::cuda {

struct MqaArgs {
  const bf16* q_latent = nullptr;   // [T, Nl, L]
  const bf16* q_pe_rope = nullptr;  // [T, Nl, R]
  const bf16* cache = nullptr;      // [blocks, 64, L+R], this step's rows already written
  int64_t cache_rows = 0;           // blocks · 64
  int T = 0, Nl = 0, L = 0, R = 0;
  float scale = 0.f;
  const int* block_table = nullptr;  // [B, max_blocks] device; nullptr: the batch's (another: a planted bug)
  int kernel = 0;  // 3: split-KV on wgmma and TMA (attention_mqa_wgmma.cu, sm_90a); 2: split-KV on mma.sync
                   // (attention_mqa_split.cu); 1: the simple core (fallback); 0: 3 where it can run, else 2
  bf16* attn_latent = nullptr;  // [T, Nl, L]
  float* lse = nullptr;         // [T, Nl]
};

void launch_attention_mqa(const MqaArgs& a, RankContext& rc);

}  // namespace mla::cuda
