// One layer of a checkpoint as it stores it, before dequantization: safetensors (HF names) and GGUF (llama.cpp
// names), every tensor checked against the model config (a contradiction names the config's formula). The loader
// (loader.h) turns such a layer into FP32 LayerWeights.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "core/model/config.h"
#include "core/model/tensor.h"
#include "core/weights/dequant.h"
#include "core/weights/gguf.h"
#include "core/weights/safetensors.h"

namespace mla {

// Everything one layer of a checkpoint provides, before dequantization.
struct LayerSource {
  std::map<std::string, PackedWeight> linear;  // by field; kv_b absent when split into k_b/v_b
  std::map<std::string, Tensor> norms;         // input_norm, q_a_norm, kv_a_norm
  std::map<std::string, Tensor> indexer;       // DSA: by build_weights' name (indexer.wq_b, ...), FP32, as read
  // GGUF attn_k_b [N, L, P] and attn_v_b [N, V, L] (llama.cpp's split of kv_b_proj).
  bool split_kv_b = false;
  PackedWeight k_b, v_b;
};

// ---------------------------------------------------------------- safetensors (HF names)

struct StQuantInfo {
  int64_t block_rows = 128, block_cols = 128;  // quantization_config.weight_block_size
};
// The config.json beside a safetensors checkpoint: its quantization_config (defaults without one).
StQuantInfo st_quant_info(const std::string& path);

// "model.layers." (or "language_model.model.layers.", ...) and the layer indices present.
std::string hf_layer_prefix(const SafetensorsCheckpoint& ck, std::set<int>* layers);

// Layer `layer` under `prefix` (hf_layer_prefix); input_layernorm only with `input_norm`.
LayerSource st_layer(const SafetensorsCheckpoint& ck, const std::string& prefix, int layer, const MlaConfig& cfg,
                     const StQuantInfo& qi, bool input_norm);

// ---------------------------------------------------------------- GGUF (llama.cpp names)

// Layer `layer` (blk.N.*); attn_k_b and attn_v_b stay split (split_kv_b), attn_kv_b is kv_b_proj.
LayerSource gguf_layer(const GgufFile& g, int layer, const MlaConfig& cfg, bool input_norm);

}  // namespace mla
