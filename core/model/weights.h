// The MLA weights of one layer, global (unsharded) and FP32, stored [out, in] as checkpoints store them,
// and the head-block slices a tensor-parallel rank holds.
#pragma once
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/tensor.h"

namespace mla {

struct LayerWeights {
  Tensor input_norm;  // [H] input_layernorm (empty when the layer starts at x)
  Tensor q_a_proj;    // [Lq, H]            (empty without q LoRA)
  Tensor q_a_norm;    // [Lq]
  Tensor q_b_proj;    // [N*(P+R), Lq], or q_proj [N*(P+R), H] without q LoRA; rows grouped per head
  Tensor kv_a_proj;   // [L+R, H]  kv_a_proj_with_mqa
  Tensor kv_a_norm;   // [L]
  Tensor kv_b_proj;   // [N*(P+V), L]; per head P k_nope rows then V v rows
  Tensor o_proj;      // [H, N*V]
  // DSA's lightning indexer (configs with index_topk; empty otherwise), replicated on every rank. Hi heads of Di
  // lanes; checkpoints name them self_attn.indexer.{wq_b, wk, k_norm, weights_proj}.
  Tensor idx_wq_b;          // [Hi*Di, Lq]  indexer.wq_b
  Tensor idx_wk;            // [Di, H]      indexer.wk
  Tensor idx_k_norm;        // [Di]         indexer.k_norm.weight (a LayerNorm)
  Tensor idx_k_norm_bias;   // [Di]         indexer.k_norm.bias
  Tensor idx_weights_proj;  // [Hi, H]      indexer.weights_proj

  // Every field, in declaration order (empty ones included).
  std::vector<Tensor*> tensors();
  std::vector<const Tensor*> tensors() const;
};

// The field of LayerWeights that holds the weight a checkpoint names `name` (build_weights' names: q_proj is the
// q_b_proj field); nullptr for a name that is not a layer weight.
Tensor LayerWeights::*weight_field(const std::string& name);

// Rank `rank` of `tp`: the column-parallel slices of q_b/q_proj and kv_b (its head blocks) and the row-parallel
// slice of o_proj (its input columns); the other fields are left empty: every other weight is replicated, and the
// engines read it from the global layer rather than holding a copy per rank.
LayerWeights head_shards(const LayerWeights& w, const MlaConfig& cfg, int tp, int rank);
// One of them: `field` is q_b_proj, kv_b_proj or o_proj (any other: an empty tensor).
Tensor head_shard(const LayerWeights& w, const MlaConfig& cfg, int tp, int rank, const Tensor LayerWeights::*field);

// Seeded synthetic weights: N(0,1)/sqrt(fan_in), norm weights 1 + N(0, 0.1); bf16-exact values
// (checkpoints are bf16, so a bf16 engine sees exactly what the FP32 reference sees).
std::vector<LayerWeights> synthetic_weights(const MlaConfig& cfg, int layers, bool input_norm, uint64_t seed);

// Counter-based normal numbers: value i of stream (seed, stream) — reproducible on any machine.
void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, float stddev);
// fill_normal's values rounded to bf16 (bit for bit), several times faster where glibc's vector math is available.
void fill_normal_bf16(float* out, int64_t n, uint64_t seed, uint64_t stream, float stddev);
// The widest vector path fill_normal_bf16 may take: 512 (AVX-512), 256 (AVX2), 0 (scalar); each is used only where
// the CPU has it. The default is 512; the tests pin each in turn to check it against fill_normal.
void set_fill_normal_width(int bits);

}  // namespace mla
