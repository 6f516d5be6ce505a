// DSA's sparse attention (docs/mla.md, "Sparse attention"): each new token attends only to its selected keys
// (topk [T, k] of kernels/dsa_indexer.cuh: key numbers of its sequence, −1 padded), softmax over those keys alone.
// The reference is attend_selected (reference/dsa_indexer.cpp). Keys outside 0 .. seq_total_len − 1 of the token's
// sequence (the padding) are skipped; a token with no key left gets out 0 and lse −inf. Both forms run on rc's
// stream with rc's batch layout (key numbering: kernels/dsa_indexer.cuh).
#pragma once
#include "kernels/rank_context.cuh"

namespace mla::cuda {

// Absorbed (decode) form over the paged latent cache: query [q_latent | q_pe_rope] (L+R lanes), key = the whole
// cache row [kv_c_norm | k_pe_rope], value = its first L lanes; heads share the keys.
struct SparseMqaArgs {
  const bf16* q_latent = nullptr;   // [T, Nl, L]
  const bf16* q_pe_rope = nullptr;  // [T, Nl, R]
  const bf16* cache = nullptr;      // [blocks, 64, L+R], this step's rows already written
  const int* topk = nullptr;        // [T, k] key numbers, −1 padded
  int k = 0, T = 0, Nl = 0, L = 0, R = 0;
  float scale = 0.f;
  bf16* attn_latent = nullptr;  // [T, Nl, L]
  float* lse = nullptr;         // [T, Nl] natural log
};

// Whether launch_attention_mqa_sparse covers these dims (L ≤ 512, L + R ≤ 576, multiples of 8).
bool mqa_sparse_supports(int L, int R);
void launch_attention_mqa_sparse(const SparseMqaArgs& a, RankContext& rc);

// MHA (prefill) form. Key s of a token of sequence b: s ≥ ctx (this step's new token n = s − ctx of b): [k_nope |
// k_pe_rope] and v of that token; s < ctx (cached): the cache row up-projected through w_kvb per head (k_nope_h =
// W_UK_h·kv_c_norm, v_h = W_UV_h·kv_c_norm, rounded to bf16 as attention_mha's context path) and the row's last R
// lanes as k_pe. Query [q_nope | q_pe_rope].
struct SparseMhaArgs {
  const bf16* q_nope = nullptr;     // [T, Nl, P]
  const bf16* q_pe_rope = nullptr;  // [T, Nl, R]
  const bf16* k_nope = nullptr;     // [T, Nl, P]
  const bf16* k_pe_rope = nullptr;  // [T, R] shared by all heads
  const bf16* v = nullptr;          // [T, Nl, V]
  const bf16* cache = nullptr;      // [blocks, 64, L+R] (context rows)
  const bf16* w_kvb = nullptr;      // [Nl·(P+V), L]: per head P k_nope rows, then V v rows
  const int* topk = nullptr;        // [T, k] key numbers, −1 padded
  int k = 0, T = 0, Nl = 0, P = 0, R = 0, V = 0, L = 0;
  float scale = 0.f;
  bf16* attn_out = nullptr;  // [T, Nl, V]
  float* lse = nullptr;      // [T, Nl] natural log
};

// Whether launch_attention_mha_sparse covers these dims (P ≤ 256, R ≤ 64, V ≤ 256).
bool mha_sparse_supports(int P, int R, int V);
void launch_attention_mha_sparse(const SparseMhaArgs& a, RankContext& rc);

}  // namespace mla::cuda
