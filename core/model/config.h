// MlaConfig: the dimensions and constants of one MLA attention block, its presets,
// HF config.json parsing, validation, and the values derived once (YaRN frequencies, softmax scale).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mla {

enum class RopeScaling { RopeScaling_none, RopeScaling_yarn };
// How the R rope lanes are paired: (2i, 2i+1) in checkpoints (DeepSeek, vLLM is_neox_style=False),
// or (i, i+R/2) "rotate half" (neox).
enum class RopeStyle { RopeStyle_interleaved, RopeStyle_neox };
inline RopeStyle other_rope_style(RopeStyle s) {
  return s == RopeStyle::RopeStyle_interleaved ? RopeStyle::RopeStyle_neox : RopeStyle::RopeStyle_interleaved;
}

struct YarnParams {
  double factor = 1.0;            // s
  int original_max_position = 0;  // O
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct MlaConfig {
  std::string name;        // preset name or the path it came from
  std::string model_type;  // HF model_type (deepseek_v3, glm_moe_dsa, ...)
  int hidden = 0;          // H
  int heads = 0;           // N
  int q_lora_rank = 0;     // Lq; 0 = no q LoRA (q_proj directly from x)
  int kv_lora_rank = 0;    // L
  int qk_nope = 0;         // P
  int qk_rope = 0;         // R
  int v_head = 0;          // V
  int num_layers = 1;      // of the real model (informational)
  double rope_theta = 10000.0;
  double rms_eps = 1e-6;
  RopeScaling rope_scaling = RopeScaling::RopeScaling_none;
  YarnParams yarn;
  RopeStyle rope_style = RopeStyle::RopeStyle_interleaved;
  // DSA (GLM-5, DeepSeek-V3.2; docs/mla.md): keys per query (0: dense attention), the indexer's heads (Hi), head
  // lanes (Di) and the RoPE layout of its rope lanes (interleaved for glm_moe_dsa, half-split for deepseek_v32).
  int index_topk = 0;
  int index_n_heads = 0;
  int index_head_dim = 0;
  RopeStyle index_rope_style = RopeStyle::RopeStyle_interleaved;
  // Per model layer, true where the layer has no indexer of its own and attends with the top-k of the last layer
  // before it that has one (GLM-5's "shared" indexer_types); empty when every layer has its own.
  std::vector<bool> index_shared;
  bool has_dsa() const { return index_topk > 0; }
  static constexpr double kIndexNormEps = 1e-6;  // the indexer's k LayerNorm (HF's glm_moe_dsa and deepseek_v32)

  // Derived by derive(); never set by hand.
  std::vector<double> inv_freq;  // [R/2] after YaRN
  double rope_mscale = 1.0;      // cos/sin multiplier: get_mscale(s, mscale) / get_mscale(s, mscale_all_dim)
  double softmax_scale = 0.0;    // get_mscale(s, mscale_all_dim)^2 / sqrt(P + R)
  int yarn_low = 0, yarn_high = 0;

  int qk_head() const { return qk_nope + qk_rope; }      // D = P + R
  int cache_row() const { return kv_lora_rank + qk_rope; }  // 576 for every real model
  bool has_q_lora() const { return q_lora_rank > 0; }

  void derive();                    // compute the derived values; call after any change
  void validate() const;            // throws UsageError naming the bad field
  void validate_tp(int tp) const;   // N % tp == 0, else UsageError naming heads and tp
  nlohmann::json to_json() const;
};

double yarn_get_mscale(double scale, double mscale);
// The YaRN correction dimension dim(β): the index of the rope pair that turns β full times over the original
// context length (HF yarn_find_correction_dim).
double yarn_correction_dim(double num_rotations, int dim, double base, int original_max_position);

std::vector<std::string> preset_names();
std::optional<MlaConfig> find_preset(const std::string& name);

// Rejects JSON text that nests deeper than kMaxJsonDepth (objects and arrays, outside strings) with a UsageError
// naming `origin` and the byte, before nlohmann builds (and recursively destroys) a pathologically deep tree.
// Used for every untrusted JSON: config.json, safetensors headers and index files. Real files nest 3-4 deep.
constexpr int kMaxJsonDepth = 64;
void check_json_nesting(const std::string& text, const std::string& origin);

// HF config.json text (DeepSeek-V2/V3, Kimi-K2, glm4_moe_lite, glm_moe_dsa). `origin` names the file in errors.
MlaConfig parse_hf_config(const std::string& json_text, const std::string& origin);
MlaConfig config_from_json(const nlohmann::json& j);  // our own to_json() form (dumps)

}  // namespace mla
