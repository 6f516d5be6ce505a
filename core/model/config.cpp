// Presets, HF config.json parsing, validation and derived constants (YaRN frequencies and mscale, softmax scale).
#include "core/model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numbers>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/model/errors.h"

namespace mla {

using nlohmann::json;

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_correction_dim(double num_rotations, int dim, double base, int original_max_position) {
  return dim * std::log(original_max_position / (num_rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

void MlaConfig::derive() {
  const int R = qk_rope;
  inv_freq.assign(R / 2, 0.0);
  for (int i = 0; i < R / 2; ++i) inv_freq[i] = 1.0 / std::pow(rope_theta, (2.0 * i) / R);
  rope_mscale = 1.0;
  yarn_low = yarn_high = 0;
  double attn_mscale = 1.0;
  if (rope_scaling == RopeScaling::RopeScaling_yarn) {
    const double s = yarn.factor;
    // HF / DeepSeek clamp to [0, R-1]; a clamp to the last pair, R/2-1, gives the same for every real config
    // (high <= 23).
    yarn_low = std::max(0, static_cast<int>(std::floor(
                               yarn_correction_dim(yarn.beta_fast, R, rope_theta, yarn.original_max_position))));
    yarn_high = std::min(R - 1, static_cast<int>(std::ceil(yarn_correction_dim(
                                    yarn.beta_slow, R, rope_theta, yarn.original_max_position))));
    const double hi = yarn_high == yarn_low ? yarn_high + 0.001 : yarn_high;  // HF's linear_ramp_mask
    for (int i = 0; i < R / 2; ++i) {
      const double ramp = std::clamp((i - yarn_low) / (hi - yarn_low), 0.0, 1.0);
      inv_freq[i] = inv_freq[i] * (1.0 - ramp) + (inv_freq[i] / s) * ramp;
    }
    rope_mscale = yarn_get_mscale(s, yarn.mscale) / yarn_get_mscale(s, yarn.mscale_all_dim);
    if (yarn.mscale_all_dim != 0.0) attn_mscale = yarn_get_mscale(s, yarn.mscale_all_dim);
  }
  softmax_scale = attn_mscale * attn_mscale / std::sqrt(static_cast<double>(qk_nope + qk_rope));
}

void MlaConfig::validate() const {
  auto positive = [&](int v, const char* field) {
    if (v <= 0)
      throw UsageError("model '" + name + "': " + field + " must be positive, got " + std::to_string(v));
  };
  positive(hidden, "hidden_size");
  positive(heads, "num_attention_heads");
  positive(kv_lora_rank, "kv_lora_rank");
  positive(qk_nope, "qk_nope_head_dim");
  positive(qk_rope, "qk_rope_head_dim");
  positive(v_head, "v_head_dim");
  // A head dim past any model's (64-512 in real ones) is a broken config, refused before derive() sizes the rope
  // table by it.
  constexpr int kMaxHeadDim = 65536;
  for (const auto& [v, field] : {std::pair{qk_nope, "qk_nope_head_dim"}, std::pair{qk_rope, "qk_rope_head_dim"},
                                 std::pair{v_head, "v_head_dim"}})
    if (v > kMaxHeadDim)
      throw UsageError("model '" + name + "': " + field + " must be at most " + std::to_string(kMaxHeadDim) +
                       ", got " + std::to_string(v));
  if (q_lora_rank < 0)
    throw UsageError("model '" + name + "': q_lora_rank must be positive or null, got " + std::to_string(q_lora_rank));
  if (qk_rope % 2 != 0)
    throw UsageError("model '" + name + "': qk_rope_head_dim must be even (rope rotates pairs), got " +
                     std::to_string(qk_rope));
  if (!(rope_theta > 1.0)) throw UsageError("model '" + name + "': rope_theta must be > 1");
  if (!(rms_eps > 0.0) || rms_eps > 1.0) throw UsageError("model '" + name + "': rms_norm_eps must be in (0, 1]");
  if (index_topk < 0) throw UsageError("model '" + name + "': index_topk must be positive or absent");
  if (has_dsa()) {
    if (!has_q_lora())
      throw UsageError("model '" + name + "': index_topk (DSA) needs q_lora_rank: the indexer's query is made from "
                       "the q LoRA's q_c");
    if (index_n_heads <= 0)
      throw UsageError("model '" + name + "': index_n_heads must be positive, got " + std::to_string(index_n_heads));
    if (index_head_dim < qk_rope || index_head_dim % 2 != 0)
      throw UsageError("model '" + name + "': index_head_dim must be even and hold the " + std::to_string(qk_rope) +
                       " rope lanes (qk_rope_head_dim), got " + std::to_string(index_head_dim));
    if (!index_shared.empty() && static_cast<int>(index_shared.size()) != num_layers)
      throw UsageError("model '" + name + "': indexer_types has " + std::to_string(index_shared.size()) +
                       " entries for " + std::to_string(num_layers) + " layers (num_hidden_layers)");
    if (!index_shared.empty() && index_shared[0])
      throw UsageError("model '" + name + "': indexer_types makes layer 0 shared, but no layer before it has an "
                       "indexer whose top-k it could reuse");
  }
  if (rope_scaling == RopeScaling::RopeScaling_yarn) {
    if (!(yarn.factor >= 1.0)) throw UsageError("model '" + name + "': rope_scaling.factor must be >= 1");
    if (yarn.original_max_position <= 0)
      throw UsageError("model '" + name + "': rope_scaling.original_max_position_embeddings must be positive");
    if (!(yarn.beta_fast > 0.0) || !(yarn.beta_slow > 0.0))
      throw UsageError("model '" + name + "': rope_scaling beta_fast and beta_slow must be positive");
  }
}

void MlaConfig::validate_tp(int tp) const {
  if (tp <= 0) throw UsageError("--tp must be positive, got " + std::to_string(tp));
  if (heads % tp != 0)
    throw UsageError("model '" + name + "' has " + std::to_string(heads) +
                     " attention heads, which tp " + std::to_string(tp) +
                     " does not divide (heads % tp must be 0; column-parallel by head blocks)");
}

json MlaConfig::to_json() const {
  json j;
  j["name"] = name;
  j["model_type"] = model_type;
  j["hidden_size"] = hidden;
  j["num_attention_heads"] = heads;
  j["q_lora_rank"] = q_lora_rank > 0 ? json(q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = kv_lora_rank;
  j["qk_nope_head_dim"] = qk_nope;
  j["qk_rope_head_dim"] = qk_rope;
  j["v_head_dim"] = v_head;
  j["num_hidden_layers"] = num_layers;
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = rms_eps;
  j["rope_interleave"] = rope_style == RopeStyle::RopeStyle_interleaved;
  if (rope_scaling == RopeScaling::RopeScaling_yarn) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", yarn.factor},
                         {"original_max_position_embeddings", yarn.original_max_position},
                         {"beta_fast", yarn.beta_fast},
                         {"beta_slow", yarn.beta_slow},
                         {"mscale", yarn.mscale},
                         {"mscale_all_dim", yarn.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (has_dsa()) {
    j["index_topk"] = index_topk;
    j["index_n_heads"] = index_n_heads;
    j["index_head_dim"] = index_head_dim;
    if (!index_shared.empty()) {
      json types = json::array();
      for (bool shared : index_shared) types.push_back(shared ? "shared" : "full");
      j["indexer_types"] = types;
    }
  }
  j["derived"] = {{"softmax_scale", softmax_scale}, {"rope_mscale", rope_mscale},
                  {"yarn_low", yarn_low}, {"yarn_high", yarn_high}};
  return j;
}

namespace {

MlaConfig make(const char* name, const char* type, int H, int N, int Lq, int P, int V, double theta,
               double eps) {
  MlaConfig c;
  c.name = name;
  c.model_type = type;
  c.hidden = H;
  c.heads = N;
  c.q_lora_rank = Lq;
  c.kv_lora_rank = 512;
  c.qk_nope = P;
  c.qk_rope = 64;
  c.v_head = V;
  c.rope_theta = theta;
  c.rms_eps = eps;
  return c;
}

void set_yarn(MlaConfig& c, double s, double beta_fast, double beta_slow, double mscale, double mscale_all) {
  c.rope_scaling = RopeScaling::RopeScaling_yarn;
  c.yarn = {s, 4096, beta_fast, beta_slow, mscale, mscale_all};
}

std::vector<MlaConfig> all_presets() {
  std::vector<MlaConfig> v;
  auto v2lite = make("deepseek-v2-lite", "deepseek_v2", 2048, 16, 0, 128, 128, 1e4, 1e-6);
  set_yarn(v2lite, 40, 32, 1, 0.707, 0.707);
  v2lite.num_layers = 27;
  v.push_back(v2lite);
  auto v2 = make("deepseek-v2", "deepseek_v2", 5120, 128, 1536, 128, 128, 1e4, 1e-6);
  set_yarn(v2, 40, 32, 1, 0.707, 0.707);
  v2.num_layers = 60;
  v.push_back(v2);
  auto v3 = make("deepseek-v3", "deepseek_v3", 7168, 128, 1536, 128, 128, 1e4, 1e-6);
  set_yarn(v3, 40, 32, 1, 1.0, 1.0);
  v3.num_layers = 61;
  v.push_back(v3);
  auto kimi = make("kimi-k2", "kimi_k2", 7168, 64, 1536, 128, 128, 5e4, 1e-6);
  set_yarn(kimi, 32, 1, 1, 1.0, 1.0);
  kimi.num_layers = 61;
  v.push_back(kimi);
  auto flash = make("glm-4.7-flash", "glm4_moe_lite", 2048, 20, 768, 192, 256, 1e6, 1e-5);
  flash.num_layers = 47;
  v.push_back(flash);
  auto glm5 = make("glm-5", "glm_moe_dsa", 6144, 64, 2048, 192, 256, 1e6, 1e-5);
  glm5.index_topk = 2048;
  glm5.index_n_heads = 32;
  glm5.index_head_dim = 128;
  glm5.num_layers = 78;
  v.push_back(glm5);
  // Small dims for tests: q LoRA, YaRN with a real ramp (low 0, high 2), P != V, 8 heads for tp 2/4/8.
  MlaConfig tiny = make("tiny", "deepseek_v3", 64, 8, 48, 16, 12, 1e4, 1e-6);
  tiny.kv_lora_rank = 32;
  tiny.qk_rope = 8;
  set_yarn(tiny, 4, 32, 1, 1.0, 1.0);
  tiny.yarn.original_max_position = 64;
  tiny.num_layers = 4;
  v.push_back(tiny);
  // tiny with GLM-5's DSA: 4 indexer heads of 16 lanes, 12 keys a query, so that tests select from longer contexts.
  MlaConfig tiny_dsa = tiny;
  tiny_dsa.name = "tiny-dsa";
  tiny_dsa.model_type = "glm_moe_dsa";
  tiny_dsa.index_topk = 12;
  tiny_dsa.index_n_heads = 4;
  tiny_dsa.index_head_dim = 16;
  v.push_back(tiny_dsa);
  for (auto& c : v) c.derive();
  return v;
}

template <class T>
T get_field(const json& j, const char* key, const std::string& origin, std::optional<T> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    throw UsageError(origin + ": missing field '" + key + "'");
  }
  try {
    if constexpr (std::is_same_v<T, int>) {
      if (!it->is_number_integer()) throw UsageError(origin + ": field '" + key + "' must be an integer, got " + it->dump());
      const auto v = it->get<int64_t>();
      if (v < INT32_MIN || v > INT32_MAX) throw UsageError(origin + ": field '" + key + "' out of range: " + it->dump());
      return static_cast<int>(v);
    } else if constexpr (std::is_same_v<T, double>) {
      if (!it->is_number()) throw UsageError(origin + ": field '" + key + "' must be a number, got " + it->dump());
      return it->get<double>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw UsageError(origin + ": field '" + key + "' must be true or false, got " + it->dump());
      return it->get<bool>();
    } else {
      if (!it->is_string()) throw UsageError(origin + ": field '" + key + "' must be a string, got " + it->dump());
      return it->get<std::string>();
    }
  } catch (const json::exception& e) {
    throw UsageError(origin + ": field '" + key + "': " + e.what());
  }
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> n;
  for (const auto& c : all_presets()) n.push_back(c.name);
  return n;
}

void check_json_nesting(const std::string& text, const std::string& origin) {
  int depth = 0;
  bool in_string = false, escape = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escape) escape = false;
      else if (ch == '\\') escape = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    else if (ch == '{' || ch == '[') {
      if (++depth > kMaxJsonDepth)
        throw UsageError(origin + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels at byte " +
                         std::to_string(i));
    } else if (ch == '}' || ch == ']') --depth;
  }
}

std::optional<MlaConfig> find_preset(const std::string& name) {
  for (auto& c : all_presets())
    if (c.name == name) return c;
  return std::nullopt;
}

// GLM-5's per-layer indexer modes as HF derives them (GlmMoeDsaConfig): `indexer_types` ("full" / "shared" per
// layer), else `index_topk_pattern` ("F" / "S" per layer, or a list of modes), else `index_topk_freq` and
// `index_skip_topk_offset` (layer i full when max(i − offset + 1, 0) is a multiple of freq; defaults 1 and 2: every
// layer full). Empty when every layer is full.
static std::vector<bool> parse_indexer_types(const json& j, int layers, const std::string& origin) {
  std::vector<std::string> modes;
  const auto list = [&](const char* field) {
    if (!j[field].is_array()) throw UsageError(origin + ": " + field + " must be a list of \"full\" and \"shared\"");
    for (const auto& m : j[field]) {
      if (!m.is_string()) throw UsageError(origin + ": " + field + " must be a list of \"full\" and \"shared\"");
      modes.push_back(m.get<std::string>());
    }
  };
  const auto given = [&](const char* field) { return j.contains(field) && !j[field].is_null(); };
  std::string field = "indexer_types";
  if (given("indexer_types")) {
    list("indexer_types");
  } else if (given("index_topk_pattern")) {
    field = "index_topk_pattern";
    if (j[field].is_string()) {
      for (char ch : j[field].get<std::string>()) {
        if (ch != 'F' && ch != 'S')
          throw UsageError(origin + ": index_topk_pattern has '" + std::string(1, ch) + "' (expected F or S)");
        modes.push_back(ch == 'F' ? "full" : "shared");
      }
    } else {
      list("index_topk_pattern");
    }
  } else if (given("index_topk_freq") || given("index_skip_topk_offset")) {
    const int freq = std::max(get_field<int>(j, "index_topk_freq", origin, 1), 1);
    const int offset = get_field<int>(j, "index_skip_topk_offset", origin, 2);
    for (int i = 0; i < layers; ++i) modes.push_back(std::max(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  std::vector<bool> shared;
  for (size_t k = 0; k < modes.size(); ++k) {
    if (modes[k] != "full" && modes[k] != "shared")
      throw UsageError(origin + ": " + field + "[" + std::to_string(k) + "] is '" + modes[k] +
                       "' (expected full or shared)");
    shared.push_back(modes[k] == "shared");
  }
  if (std::find(shared.begin(), shared.end(), true) == shared.end()) shared.clear();
  return shared;
}

MlaConfig parse_hf_config(const std::string& text, const std::string& origin) {
  check_json_nesting(text, origin);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers too large (found by fuzz_config)
    throw UsageError(origin + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw UsageError(origin + ": expected a JSON object at the top level");
  // Multimodal wrappers (Kimi-K2.5 style) keep the language model under text_config.
  if (j.contains("text_config") && j["text_config"].is_object() && !j.contains("kv_lora_rank")) j = j["text_config"];

  MlaConfig c;
  c.name = origin;
  c.model_type = get_field<std::string>(j, "model_type", origin, std::string("unknown"));
  static const char* kKnown[] = {"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe_lite", "glm_moe_dsa"};
  bool known = false;
  for (auto k : kKnown) known |= c.model_type == k;
  if (!known) {
    if (!j.contains("kv_lora_rank"))
      throw UsageError(origin + ": model_type '" + c.model_type + "' is not an MLA model (no kv_lora_rank)");
    std::cerr << "notice: " << origin << ": model_type '" << c.model_type
              << "' is not one of the known MLA types; reading it as DeepSeek-V3-style MLA\n";
  }
  c.hidden = get_field<int>(j, "hidden_size", origin);
  c.heads = get_field<int>(j, "num_attention_heads", origin);
  c.q_lora_rank = get_field<int>(j, "q_lora_rank", origin, 0);
  c.kv_lora_rank = get_field<int>(j, "kv_lora_rank", origin);
  c.qk_nope = get_field<int>(j, "qk_nope_head_dim", origin);
  c.qk_rope = get_field<int>(j, "qk_rope_head_dim", origin);
  c.v_head = get_field<int>(j, "v_head_dim", origin);
  c.num_layers = get_field<int>(j, "num_hidden_layers", origin, 1);
  // Real models have up to ~128; a count past this is a broken config, refused before the indexer's per-layer modes
  // are listed by it.
  constexpr int kMaxLayers = 100000;
  if (c.num_layers < 1 || c.num_layers > kMaxLayers)
    throw UsageError(origin + ": num_hidden_layers must be 1 .. " + std::to_string(kMaxLayers) + ", got " +
                     std::to_string(c.num_layers));
  c.rms_eps = get_field<double>(j, "rms_norm_eps", origin, 1e-6);
  c.rope_style = get_field<bool>(j, "rope_interleave", origin, true) ? RopeStyle::RopeStyle_interleaved
                                                                       : RopeStyle::RopeStyle_neox;
  // Newer transformers put theta and scaling in rope_parameters; older ones in rope_theta / rope_scaling.
  json rope = nullptr;
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) rope = j["rope_scaling"];
  else if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) rope = j["rope_parameters"];
  c.rope_theta = get_field<double>(j, "rope_theta", origin, 10000.0);
  if (!rope.is_null()) {
    if (!rope.is_object()) throw UsageError(origin + ": rope_scaling must be an object or null");
    const std::string where = origin + " rope_scaling";
    if (rope.contains("rope_theta")) c.rope_theta = get_field<double>(rope, "rope_theta", where);
    std::string type = rope.contains("rope_type") ? get_field<std::string>(rope, "rope_type", where)
                                                  : get_field<std::string>(rope, "type", where, std::string("default"));
    if (type == "yarn") {
      c.rope_scaling = RopeScaling::RopeScaling_yarn;
      c.yarn.factor = get_field<double>(rope, "factor", where);
      c.yarn.original_max_position = get_field<int>(rope, "original_max_position_embeddings", where);
      c.yarn.beta_fast = get_field<double>(rope, "beta_fast", where, 32.0);
      c.yarn.beta_slow = get_field<double>(rope, "beta_slow", where, 1.0);
      c.yarn.mscale = get_field<double>(rope, "mscale", where, 1.0);
      c.yarn.mscale_all_dim = get_field<double>(rope, "mscale_all_dim", where, 0.0);
    } else if (type == "default" || type == "none") {
      c.rope_scaling = RopeScaling::RopeScaling_none;
    } else {
      throw UsageError(where + ": unknown rope type '" + type + "' (supported: yarn, default)");
    }
  }
  // GLM-5 and DeepSeek-V3.2 always select keys with DSA's indexer: HF's config classes give index_topk 2048 where
  // config.json leaves it out, and take the top min(index_topk, keys) of each query, so 0 would select none.
  const bool dsa_type = c.model_type == "glm_moe_dsa" || c.model_type == "deepseek_v32";
  if (dsa_type || (j.contains("index_topk") && !j["index_topk"].is_null())) {
    c.index_topk = get_field<int>(j, "index_topk", origin, dsa_type ? std::optional<int>(2048) : std::nullopt);
    if (dsa_type && c.index_topk <= 0)
      throw UsageError(origin + ": index_topk " + std::to_string(c.index_topk) + ": model_type '" + c.model_type +
                       "' attends through DSA's indexer, which selects min(index_topk, keys) keys per query (none at " +
                       std::to_string(c.index_topk) + "); leave index_topk out for HF's default 2048");
    // HF's defaults where a config leaves them out: 64 indexer heads for DeepSeek-V3.2, 32 for GLM-5; 128 lanes.
    const bool v32 = c.model_type == "deepseek_v32";
    c.index_n_heads = get_field<int>(j, "index_n_heads", origin, v32 ? 64 : 32);
    c.index_head_dim = get_field<int>(j, "index_head_dim", origin, 128);
    c.index_rope_style = v32 ? RopeStyle::RopeStyle_neox : RopeStyle::RopeStyle_interleaved;
    c.index_shared = parse_indexer_types(j, c.num_layers, origin);
  }
  c.validate();
  c.derive();
  return c;
}

MlaConfig config_from_json(const json& j) {
  auto c = parse_hf_config(j.dump(), j.value("name", std::string("dump")));
  c.name = j.value("name", c.name);
  return c;
}

}  // namespace mla
