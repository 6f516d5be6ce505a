// DSA's sparse attention (docs/mla.md, "Sparse attention"): each new token attends only to its selected keys
// (topk [T, k] of kernels/dsa_indexer.cuh: key numbers of its sequence, −1 padded), softmax over those keys alone.
// The reference is attend_selected (reference/dsa_indexer.cpp). Keys outside 0 .. seq_total_len − 1 of the token's
// sequence (the padding) are skipped; a token with no key left gets out 0 and lse −inf. Both forms run on rc's
// stream with rc's batch layout (key numbering: kernels/dsa_indexer.cuh).
#pragma once
#include "kernels/attention_mha.cuh"
#include "kernels/attention_mqa.cuh"
#include "kernels/rank_context.cuh"

namespace mla::cuda {

// Absorbed (decode) form over the paged latent cache: query [q_latent | q_pe_rope] (L+R lanes), key = the whole
// cache row [kv_c_norm | k_pe_rope], value = its first L lanes; heads share the keys.
// The dense form's arguments (kernels/attention_mqa.cuh: block_table nullptr for the batch's, another for a planted
// bug; its kernel is not read) and the selection.
struct SparseMqaArgs : MqaArgs {
  const int* topk = nullptr;  // [T, k] key numbers, −1 padded
  int k = 0;
};

// Whether launch_attention_mqa_sparse covers these dims (L ≤ 512, L + R ≤ 576, multiples of 8).
bool mqa_sparse_supports(int L, int R);
void launch_attention_mqa_sparse(const SparseMqaArgs& a, RankContext& rc);

// MHA (prefill) form. Key s of a token of sequence b: s ≥ ctx (this step's new token n = s − ctx of b): [k_nope |
// k_pe_rope] and v of that token; s < ctx (cached): the cache row up-projected through w_kvb per head (k_nope_h =
// W_UK_h·kv_c_norm, v_h = W_UV_h·kv_c_norm, rounded to bf16 as attention_mha's context path) and the row's last R
// lanes as k_pe. Query [q_nope | q_pe_rope].
// The dense form's arguments (kernels/attention_mha.cuh; its causal, lse_base2, window and selection are not read:
// the top-k replaces the mask) and the selection. kernel ≥ 2 with dims the flash kernels cover: attention_mha's flash
// path with the selection turned into bitmaps (MhaSelection); kernel 1: a gather kernel that visits the selected
// keys one by one.
struct SparseMhaArgs : MhaArgs {
  const int* topk = nullptr;  // [T, k] key numbers, −1 padded
  int k = 0;
};

// Whether launch_attention_mha_sparse covers these dims (P ≤ 256, R ≤ 64, V ≤ 256).
bool mha_sparse_supports(int P, int R, int V);
void launch_attention_mha_sparse(const SparseMhaArgs& a, RankContext& rc);

}  // namespace mla::cuda
