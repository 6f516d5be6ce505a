// attention_mha: the prefill form. New tokens attend causally among themselves; a
// sequence's cached context is up-projected through kv_b_proj, attended without a mask, and merged by LSE.
#pragma once
#include "kernels/rank_context.cuh"

namespace mla::cuda {

// A selection instead of the causal mask (DSA's top-k, built by attention_sparse.cu): per new token one bitmap over
// its sequence's new tokens and one over its cached context (FlashParams::keep), and each one's reach (last selected
// key + 1). Words per row: multiples of 4 covering the longest s_q / context rounded up to 128 keys. Writable: the
// kernel that builds it takes it too.
struct MhaSelection {
  uint32_t* keep_new = nullptr;  // [T, words_new]
  int* reach_new = nullptr;      // [T]
  int words_new = 0;
  uint32_t* keep_ctx = nullptr;  // [T, words_ctx] (unread without context)
  int* reach_ctx = nullptr;      // [T]
  int words_ctx = 0;
};

struct MhaArgs {
  const bf16* q_nope = nullptr;     // [T, Nl, P]
  const bf16* q_pe_rope = nullptr;  // [T, Nl, R]
  const bf16* k_nope = nullptr;     // [T, Nl, P]
  const bf16* k_pe_rope = nullptr;  // [T, R] shared by all heads
  const bf16* v = nullptr;          // [T, Nl, V]
  const bf16* cache = nullptr;      // [blocks, 64, L+R] (context rows)
  const bf16* w_kvb = nullptr;      // [Nl·(P+V), L] this rank's kv_b_proj
  int T = 0, Nl = 0, P = 0, R = 0, V = 0, L = 0;
  float scale = 0.f;
  bool causal = true;        // false plants causal-off (no mask among the new tokens)
  bool lse_base2 = false;    // true plants lse-base2 (the context merge reads the LSEs as base 2)
  int window = 0;            // > 0 plants sliding-window: each new token sees its last `window` new-token keys
  int kernel = 4;  // 4/3/2: flash on the tensor cores (attention_flash.cu; the engine passes its mha_kernel
                   // option, 4 unless asked); 1: the simple core
  const MhaSelection* selection = nullptr;  // set: each token sees its selected keys only (causal, window and
                                           // lse_base2 unread; flash kernels only)
  bf16* attn_out = nullptr;  // [T, Nl, V]
  float* lse = nullptr;      // [T, Nl]
};

// Runs on rc's stream with rc's batch layout and scratch.
void launch_attention_mha(const MhaArgs& a, RankContext& rc);

}  // namespace mla::cuda
