// Checkpoint configs: GGUF metadata keys to MlaConfig, config.json beside safetensors.
#include "harness/weights/checkpoint_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/model/errors.h"
#include "harness/weights/gguf.h"
#include "harness/weights/safetensors.h"

namespace mla {

namespace fs = std::filesystem;

bool is_checkpoint_path(const std::string& path) { return is_gguf_path(path) || is_safetensors_path(path); }

std::string safetensors_config_path(const std::string& path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  return ((dir.empty() ? fs::path(".") : dir) / "config.json").string();
}

MlaConfig config_from_gguf(const Bytes& file, const GgufHeader& h) {
  const std::string& origin = file.origin();
  const auto arch = gguf_get_string(file, h, "general.architecture");
  if (!arch) throw UsageError(origin + ": no general.architecture in the metadata");
  const std::string& a = *arch;
  const auto key = [&](const std::string& k) { return a + "." + k; };
  const auto req_int = [&](const std::string& k) {
    const auto v = gguf_get_int(file, h, key(k));
    if (!v) throw UsageError(origin + ": metadata '" + key(k) + "' is missing");
    if (*v < 0 || *v > (1 << 24)) throw UsageError(origin + ": metadata '" + key(k) + "' = " + std::to_string(*v) + " is out of range");
    return static_cast<int>(*v);
  };
  if (!gguf_get_int(file, h, key("attention.kv_lora_rank")))
    throw UsageError(origin + ": architecture '" + a + "' has no " + key("attention.kv_lora_rank") + ": not an MLA model");
  MlaConfig c;
  c.name = origin;
  c.model_type = a == "glm-dsa" ? "glm_moe_dsa" : a == "deepseek2" ? "deepseek_v2" : "gguf-" + a;
  c.hidden = req_int("embedding_length");
  c.heads = req_int("attention.head_count");
  c.q_lora_rank = gguf_get_int(file, h, key("attention.q_lora_rank")) ? req_int("attention.q_lora_rank") : 0;
  c.kv_lora_rank = req_int("attention.kv_lora_rank");
  c.qk_rope = req_int("rope.dimension_count");
  // Files with the split attn_k_b/attn_v_b carry the MLA head sizes in *_mla; their key_length/value_length
  // describe the absorbed form (L+R, L). Older files have only key_length = P+R and value_length = V.
  const bool mla_keys = gguf_get_int(file, h, key("attention.key_length_mla")).has_value();
  const int key_len = req_int(mla_keys ? "attention.key_length_mla" : "attention.key_length");
  c.v_head = req_int(mla_keys ? "attention.value_length_mla" : "attention.value_length");
  c.qk_nope = key_len - c.qk_rope;
  if (c.qk_nope <= 0)
    throw UsageError(origin + ": key length " + std::to_string(key_len) + " is not larger than rope.dimension_count " +
                     std::to_string(c.qk_rope));
  c.num_layers = gguf_get_int(file, h, key("block_count")) ? req_int("block_count") : 1;
  if (auto e = gguf_get_float(file, h, key("attention.layer_norm_rms_epsilon"))) c.rms_eps = *e;
  if (auto t = gguf_get_float(file, h, key("rope.freq_base"))) c.rope_theta = *t;
  const auto scaling = gguf_get_string(file, h, key("rope.scaling.type"));
  if (scaling && *scaling == "yarn") {
    c.rope_scaling = RopeScaling::RopeScaling_yarn;
    const auto factor = gguf_get_float(file, h, key("rope.scaling.factor"));
    if (!factor) throw UsageError(origin + ": yarn rope scaling without " + key("rope.scaling.factor"));
    c.yarn.factor = *factor;
    c.yarn.original_max_position = req_int("rope.scaling.original_context_length");
    if (auto v = gguf_get_float(file, h, key("rope.scaling.yarn_beta_fast"))) c.yarn.beta_fast = *v;
    if (auto v = gguf_get_float(file, h, key("rope.scaling.yarn_beta_slow"))) c.yarn.beta_slow = *v;
    // llama.cpp's converter stores 0.1 * mscale_all_dim as yarn_log_multiplier and not mscale itself;
    // every MLA model has mscale == mscale_all_dim, so the cos/sin ratio get_mscale(s, mscale) / get_mscale(s,
    // mscale_all_dim) stays 1.
    // The multiplier is an f32: round to 6 significant digits to get the config's decimal back (0.707, 1.0).
    if (auto v = gguf_get_float(file, h, key("rope.scaling.yarn_log_multiplier")))
      c.yarn.mscale_all_dim = std::round(*v / 0.1 * 1e6) / 1e6;
    c.yarn.mscale = c.yarn.mscale_all_dim;
  } else if (scaling && *scaling != "none") {
    throw UsageError(origin + ": rope scaling type '" + *scaling + "' is not supported (yarn or none)");
  }
  if (auto k = gguf_get_int(file, h, key("attention.indexer.top_k"))) c.index_topk = static_cast<int>(*k);
  try {
    c.validate();
  } catch (const UsageError& e) {
    throw UsageError(std::string(e.what()) + " (from the GGUF metadata)");
  }
  c.derive();
  return c;
}

MlaConfig checkpoint_config(const std::string& path) {
  if (is_gguf_path(path)) {
    const GgufFile g(path);
    return config_from_gguf(g.bytes(), g.header());
  }
  const std::string cp = safetensors_config_path(path);
  std::error_code ec;
  if (!fs::exists(cp, ec)) throw UsageError(path + ": no config.json beside the safetensors (" + cp + "); pass --model");
  std::ifstream in(cp, std::ios::binary);
  if (!in) throw UsageError("cannot read " + cp);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hf_config(ss.str(), cp);
}

}  // namespace mla
