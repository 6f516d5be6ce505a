// Checkpoint configs: GGUF metadata keys to MlaConfig, config.json beside safetensors.
#include "core/weights/checkpoint_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/model/errors.h"
#include "core/weights/gguf.h"
#include "core/weights/safetensors.h"

namespace mla {

void check_quantization_config(const std::string& text, const std::string& where);


namespace fs = std::filesystem;

bool is_checkpoint_path(const std::string& path) { return is_gguf_path(path) || is_safetensors_path(path); }

std::string safetensors_config_path(const std::string& path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  return ((dir.empty() ? fs::path(".") : dir) / "config.json").string();
}

namespace {
// True the first time `what` is seen in this process: each file's warnings are printed once, however often it is read.
bool first_time(const std::string& what) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert(what).second;
}

// The keys of an MLA architecture's namespace in llama.cpp's converter (gguf-py constants): those read here and
// those that describe parts of the model outside attention.
const std::set<std::string>& known_gguf_keys() {
  static const std::set<std::string> k = {
      // read into the config
      "embedding_length", "block_count", "attention.head_count", "attention.q_lora_rank", "attention.kv_lora_rank",
      "attention.key_length", "attention.value_length", "attention.key_length_mla", "attention.value_length_mla",
      "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base", "rope.scaling.type",
      "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.yarn_beta_fast",
      "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_log_multiplier", "attention.indexer.top_k",
      "attention.indexer.head_count", "attention.indexer.key_length",
      // outside attention, or equal to what is modelled
      "vocab_size", "context_length", "feed_forward_length", "leading_dense_block_count", "expert_feed_forward_length",
      "expert_shared_feed_forward_length", "expert_count", "expert_used_count", "expert_shared_count",
      "expert_group_count", "expert_group_used_count", "expert_weights_scale", "expert_weights_norm",
      "expert_gating_func", "nextn_predict_layers", "attention.head_count_kv", "rope.scaling.finetuned",
      "pooling_type", "moe_every_n_layers"};
  return k;
}

void warn_unknown_gguf_keys(const Bytes& file, const GgufHeader& h, const std::string& arch) {
  const std::string prefix = arch + ".";
  std::vector<std::string> unknown;
  for (const auto& kv : h.kvs)
    if (kv.key.rfind(prefix, 0) == 0 && !known_gguf_keys().count(kv.key.substr(prefix.size()))) unknown.push_back(kv.key);
  if (unknown.empty() || !first_time("gguf:" + file.origin())) return;
  for (const auto& k : unknown)
    std::cerr << "warning: " << file.origin() << ": metadata key '" << k << "' is not one this reader knows; it is "
              << "ignored. If it is a damaged name of a known key (e.g. " << prefix << "rope.scaling.type), that "
              << "setting is read as absent\n";
}

bool looks_like_attention(const std::string& name) {
  for (const char* w : {"rope", "attn", "attention", "scaling", "window", "head"})
    if (name.find(w) != std::string::npos) return true;
  return false;
}
}  // namespace

void warn_unknown_config_fields(const std::string& text, const std::string& origin) {
  using nlohmann::json;
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return;
  if (j.contains("text_config") && j["text_config"].is_object() && !j.contains("kv_lora_rank")) j = j["text_config"];
  // Read into the config, or standard HF fields that MLA does not use (num_key_value_heads: MLA has one latent).
  static const std::set<std::string> known = {
      "num_attention_heads", "num_key_value_heads", "attention_bias", "attention_dropout", "routed_scaling_factor",
      "rope_scaling", "rope_parameters", "rope_theta", "rope_interleave", "qk_rope_head_dim", "qk_nope_head_dim",
      "v_head_dim", "head_dim", "index_head_dim", "index_n_heads", "_attn_implementation", "attn_implementation",
      "_attn_implementation_autoset"};
  static const std::set<std::string> known_rope = {"type", "rope_type", "factor", "original_max_position_embeddings",
                                                   "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "rope_theta"};
  std::vector<std::string> lines;
  // Fields transformers derives from the read ones and saves beside them (qk_head_dim = P + R): read for agreement.
  if (j.contains("qk_head_dim")) {
    const auto& q = j["qk_head_dim"];
    const auto& p = j.contains("qk_nope_head_dim") ? j["qk_nope_head_dim"] : json();
    const auto& r = j.contains("qk_rope_head_dim") ? j["qk_rope_head_dim"] : json();
    if (!(q.is_number_integer() && p.is_number_integer() && r.is_number_integer() &&
          q.get<int64_t>() == p.get<int64_t>() + r.get<int64_t>()))
      lines.push_back("field 'qk_head_dim' (" + q.dump() + ") is not qk_nope_head_dim + qk_rope_head_dim (" + p.dump() +
                      " + " + r.dump() + "); the head dims read are the latter two");
  }
  for (const auto& [k, v] : j.items())
    if (looks_like_attention(k) && !known.count(k) && k != "qk_head_dim")
      lines.push_back("field '" + k + "' looks like a rope or attention setting but is not read (" + v.dump() +
                      "); whatever it changes is not modelled");
  for (const char* r : {"rope_scaling", "rope_parameters"})
    if (j.contains(r) && j[r].is_object())
      for (const auto& [k, v] : j[r].items())
        if (!known_rope.count(k))
          lines.push_back(std::string(r) + "." + k + " is not a rope setting this reader knows (" + v.dump() +
                          "); it is ignored");
  if (lines.empty() || !first_time("config:" + origin)) return;
  for (const auto& l : lines) std::cerr << "warning: " << origin << ": " << l << "\n";
}

MlaConfig config_from_gguf(const Bytes& file, const GgufHeader& h) {
  const std::string& origin = file.origin();
  const auto arch = gguf_get_string(file, h, "general.architecture");
  if (!arch) throw UsageError(origin + ": no general.architecture in the metadata");
  const std::string& a = *arch;
  const auto key = [&](const std::string& k) { return a + "." + k; };
  warn_unknown_gguf_keys(file, h, a);
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
  if (auto k = gguf_get_int(file, h, key("attention.indexer.top_k"))) {
    c.index_topk = static_cast<int>(*k);
    c.index_n_heads = static_cast<int>(gguf_get_int(file, h, key("attention.indexer.head_count")).value_or(32));
    c.index_head_dim = static_cast<int>(gguf_get_int(file, h, key("attention.indexer.key_length")).value_or(128));
    c.index_rope_style = a == "glm-dsa" ? RopeStyle::RopeStyle_interleaved : RopeStyle::RopeStyle_neox;
  }
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
  MlaConfig c = parse_hf_config(ss.str(), cp);
  check_quantization_config(ss.str(), cp);
  warn_unknown_config_fields(ss.str(), cp);
  return c;
}

// config.json's quantization_config, when present, must be readable: an object whose quant_method is a string and
// whose weight_block_size is two positive integers (what the loader reads); a malformed one is refused naming it.
void check_quantization_config(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return;  // parse_hf_config has said what is wrong with the JSON
  }
  if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null()) return;
  const auto& q = j["quantization_config"];
  if (!q.is_object())
    throw UsageError(where + ": quantization_config must be an object, got " + q.dump());
  if (q.contains("quant_method") && !q["quant_method"].is_string())
    throw UsageError(where + ": quantization_config.quant_method must be a string, got " + q["quant_method"].dump());
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const auto& b = q["weight_block_size"];
    const auto ok = [](const nlohmann::json& v) {
      return v.is_number_unsigned() && v.get<uint64_t>() > 0 && v.get<uint64_t>() <= (1u << 20);
    };
    if (!b.is_array() || b.size() != 2 || !ok(b[0]) || !ok(b[1]))
      throw UsageError(where + ": quantization_config.weight_block_size must be two positive integers, got " +
                       b.dump());
  }
}

MlaConfig load_model_config(const std::string& spec) {
  if (auto p = find_preset(spec)) return *p;
  // A checkpoint file: GGUF metadata, or the config.json beside a .safetensors.
  if (is_checkpoint_path(spec) && !std::filesystem::is_directory(spec)) return checkpoint_config(spec);
  std::filesystem::path path(spec);
  if (std::filesystem::is_directory(path)) path /= "config.json";
  if (!std::filesystem::exists(path)) {
    std::string names;
    for (auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw UsageError("--model '" + spec + "' is neither a preset (" + names + ") nor an existing config.json");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  MlaConfig c = parse_hf_config(ss.str(), path.string());
  check_quantization_config(ss.str(), path.string());
  warn_unknown_config_fields(ss.str(), path.string());
  return c;
}

}  // namespace mla
