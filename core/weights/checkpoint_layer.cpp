// One layer of a checkpoint as it stores it (core/weights/checkpoint_layer.h).
#include "core/weights/checkpoint_layer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/model/errors.h"
#include "core/weights/checkpoint_config.h"
#include "core/weights/dequant.h"

namespace mla {

namespace fs = std::filesystem;

namespace {

std::string dims(std::initializer_list<int64_t> v) {
  std::string s = "[";
  bool first = true;
  for (auto d : v) s += (first ? "" : ", ") + std::to_string(d), first = false;
  return s + "]";
}

// The shape the config expects for a field, and how it follows from the config (for contradiction errors).
struct Expected {
  std::vector<int64_t> shape;
  std::string formula;
};
Expected expected_shape(const MlaConfig& c, const std::string& field) {
  const int64_t H = c.hidden, N = c.heads, Lq = c.q_lora_rank, L = c.kv_lora_rank, P = c.qk_nope, R = c.qk_rope,
                V = c.v_head;
  const std::string n = std::to_string(N), p = std::to_string(P), r = std::to_string(R), v = std::to_string(V),
                    h = std::to_string(H), l = std::to_string(L), lq = std::to_string(Lq);
  if (field == "input_norm") return {{H}, "[hidden_size] = [" + h + "]"};
  if (field == "q_a_proj") return {{Lq, H}, "[q_lora_rank, hidden_size] = [" + lq + ", " + h + "]"};
  if (field == "q_a_norm") return {{Lq}, "[q_lora_rank] = [" + lq + "]"};
  if (field == "q_b_proj")
    return c.has_q_lora()
               ? Expected{{N * (P + R), Lq}, "[num_attention_heads*(qk_nope_head_dim+qk_rope_head_dim), q_lora_rank] = [" +
                                                 n + "*(" + p + "+" + r + "), " + lq + "]"}
               : Expected{{N * (P + R), H}, "[num_attention_heads*(qk_nope_head_dim+qk_rope_head_dim), hidden_size] = [" +
                                                n + "*(" + p + "+" + r + "), " + h + "]"};
  if (field == "kv_a_proj")
    return {{L + R, H}, "[kv_lora_rank+qk_rope_head_dim, hidden_size] = [" + l + "+" + r + ", " + h + "]"};
  if (field == "kv_a_norm") return {{L}, "[kv_lora_rank] = [" + l + "]"};
  if (field == "kv_b_proj")
    return {{N * (P + V), L}, "[num_attention_heads*(qk_nope_head_dim+v_head_dim), kv_lora_rank] = [" + n + "*(" + p +
                                  "+" + v + "), " + l + "]"};
  if (field == "o_proj")
    return {{H, N * V}, "[hidden_size, num_attention_heads*v_head_dim] = [" + h + ", " + n + "*" + v + "]"};
  const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
  const std::string hi = std::to_string(Hi), di = std::to_string(Di);
  if (field == "indexer.wq_b")
    return {{Hi * Di, Lq}, "[index_n_heads*index_head_dim, q_lora_rank] = [" + hi + "*" + di + ", " + lq + "]"};
  if (field == "indexer.wk") return {{Di, H}, "[index_head_dim, hidden_size] = [" + di + ", " + h + "]"};
  if (field == "indexer.k_norm" || field == "indexer.k_norm_bias") return {{Di}, "[index_head_dim] = [" + di + "]"};
  if (field == "indexer.weights_proj")
    return {{Hi, H}, "[index_n_heads, hidden_size] = [" + hi + ", " + h + "]"};
  return {};
}

void check_shape(const MlaConfig& c, const std::string& field, const std::string& where,
                 const std::vector<int64_t>& got) {
  const Expected e = expected_shape(c, field);
  if (got != e.shape)
    throw UsageError(where + " is " + shape_string(got) + " but the model config '" + c.name + "' expects " +
                     shape_string(e.shape) + " for " + field + ": " + e.formula +
                     "; the config and the checkpoint disagree (wrong --model, or a different model's weights)");
}

// ---------------------------------------------------------------- safetensors (HF names)

PackedWeight copy_bytes(const Bytes& b, PackedWeight p) {
  p.data.assign(b.data(), b.data() + b.size());
  return p;
}

// One linear layer "BASE.weight" (+ its scale tensors), as a PackedWeight of logical shape [rows, cols].
PackedWeight st_linear(const SafetensorsCheckpoint& ck, const std::string& base, const std::string& field,
                       const MlaConfig& cfg, const StQuantInfo& qi) {
  const std::string wname = ck.has(base + ".weight_packed") ? base + ".weight_packed" : base + ".weight";
  const StTensorInfo& w = ck.info(wname);
  const std::string where = ck.file_of(wname) + ": tensor '" + wname + "' (" + st_dtype_name(w.dtype) + " " +
                            shape_string(w.shape) + ")";
  if (w.shape.size() != 2) throw UsageError(where + ": a linear weight must be 2-D");
  PackedWeight p;
  p.origin = ck.file_of(wname) + ": " + wname;
  p.rows = w.shape[0];
  const auto scale_of = [&](const std::string& suffix) -> const StTensorInfo* {
    return ck.has(base + suffix) ? &ck.info(base + suffix) : nullptr;
  };
  const auto expect_scale = [&](const StTensorInfo* s, std::initializer_list<StDtype> dtypes,
                                std::vector<int64_t> shape) {
    bool ok = false;
    for (auto d : dtypes) ok = ok || s->dtype == d;
    if (!ok || s->shape != shape)
      throw UsageError(ck.file_of(s->name) + ": tensor '" + s->name + "' is " + st_dtype_name(s->dtype) + " " +
                       shape_string(s->shape) + "; " + wname + " " + shape_string(w.shape) + " needs " +
                       st_dtype_name(*dtypes.begin()) + " " + shape_string(shape));
  };
  const auto scalar_f32 = [&](const StTensorInfo* s) {
    if (s->dtype != StDtype::StDtype_F32 || s->numel != 1)
      throw UsageError(ck.file_of(s->name) + ": tensor '" + s->name + "' must be one F32 value, got " +
                       st_dtype_name(s->dtype) + " " + shape_string(s->shape));
    float v;
    std::memcpy(&v, ck.data(s->name).at(0, 4, s->name), 4);
    return v;
  };
  switch (w.dtype) {
    case StDtype::StDtype_F32: case StDtype::StDtype_F16: case StDtype::StDtype_BF16:
      p.format = w.dtype == StDtype::StDtype_F32   ? WeightFormat::WeightFormat_f32
                 : w.dtype == StDtype::StDtype_F16 ? WeightFormat::WeightFormat_f16
                                                   : WeightFormat::WeightFormat_bf16;
      p.cols = w.shape[1];
      check_shape(cfg, field, where, {p.rows, p.cols});
      return copy_bytes(ck.data(wname), std::move(p));
    case StDtype::StDtype_F8_E4M3: {
      const StTensorInfo* s = scale_of(".weight_scale_inv");
      if (!s) throw UsageError(where + ": FP8 weight without " + base + ".weight_scale_inv (only DeepSeek's block-scaled FP8 is supported)");
      p.format = WeightFormat::WeightFormat_fp8;
      p.cols = w.shape[1];
      check_shape(cfg, field, where, {p.rows, p.cols});
      p.block_rows = qi.block_rows;
      p.block_cols = qi.block_cols;
      expect_scale(s, {StDtype::StDtype_F32},
                   {(p.rows + p.block_rows - 1) / p.block_rows, (p.cols + p.block_cols - 1) / p.block_cols});
      const Bytes sb = ck.data(s->name);
      p.scales.assign(sb.data(), sb.data() + sb.size());
      return copy_bytes(ck.data(wname), std::move(p));
    }
    case StDtype::StDtype_U8: {
      p.cols = w.shape[1] * 2;  // packed FP4, low nibble first
      check_shape(cfg, field, where + " (packed FP4: [" + std::to_string(p.rows) + ", " + std::to_string(p.cols) + "])",
                  {p.rows, p.cols});
      const StTensorInfo* s = scale_of(".weight_scale");
      if (!s) throw UsageError(where + ": packed U8 weight without " + base + ".weight_scale");
      if (s->dtype == StDtype::StDtype_F8_E4M3) {  // NVFP4: groups of 16
        expect_scale(s, {StDtype::StDtype_F8_E4M3}, {p.rows, p.cols / 16});
        if (const StTensorInfo* g = scale_of(".weight_global_scale")) {
          p.format = WeightFormat::WeightFormat_nvfp4_ct;
          p.global_scale = scalar_f32(g);
        } else if (const StTensorInfo* g2 = scale_of(".weight_scale_2")) {
          p.format = WeightFormat::WeightFormat_nvfp4;
          p.global_scale = scalar_f32(g2);
        } else {
          throw UsageError(where + ": NVFP4 weight without a global scale (" + base + ".weight_scale_2 for ModelOpt, " +
                           base + ".weight_global_scale for compressed-tensors)");
        }
      } else {  // MXFP4: E8M0 scales per 32
        expect_scale(s, {StDtype::StDtype_F8_E8M0, StDtype::StDtype_U8}, {p.rows, p.cols / 32});
        p.format = WeightFormat::WeightFormat_mxfp4;
      }
      if (p.cols % weight_format_k_multiple(p.format) != 0)
        throw UsageError(where + ": " + weight_format_name(p.format) + " needs the input dimension to be a multiple of " +
                         std::to_string(weight_format_k_multiple(p.format)));
      const Bytes sb = ck.data(s->name);
      p.scales.assign(sb.data(), sb.data() + sb.size());
      return copy_bytes(ck.data(wname), std::move(p));
    }
    default:
      throw UsageError(where + ": unsupported dtype for a linear weight (F32, F16, BF16, F8_E4M3 with "
                               "weight_scale_inv, or packed U8 FP4 with weight_scale)");
  }
}

Tensor st_norm(const SafetensorsCheckpoint& ck, const std::string& name, const std::string& field, const MlaConfig& cfg) {
  const StTensorInfo& t = ck.info(name);
  const std::string where = ck.file_of(name) + ": tensor '" + name + "' (" + st_dtype_name(t.dtype) + ")";
  if (t.dtype != StDtype::StDtype_F32 && t.dtype != StDtype::StDtype_F16 && t.dtype != StDtype::StDtype_BF16 &&
      t.dtype != StDtype::StDtype_F64)
    throw UsageError(where + ": a norm weight must be F32, F16, BF16 or F64");
  check_shape(cfg, field, where, t.shape);
  const Bytes b = ck.data(name);
  Tensor out(t.shape);
  out.data = st_to_float(t.dtype, b.data(), t.numel);
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UsageError("cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------- GGUF (llama.cpp names)

PackedWeight gguf_packed(const GgufFile& g, const GgufTensorInfo& t) {
  const auto f = weight_format_of_ggml(t.type);
  const std::string where = g.path() + ": tensor '" + t.name + "' (" + ggml_type_name(t.type) + ")";
  if (!f) throw UsageError(where + ": no dequantization for this type");
  PackedWeight p;
  p.format = *f;
  p.origin = g.path() + ": " + t.name;
  p.cols = t.ne.empty() ? 1 : t.ne[0];
  p.rows = p.cols == 0 ? 0 : t.numel / p.cols;
  const Bytes b = g.data(t);
  p.data.assign(b.data(), b.data() + b.size());
  return p;
}

const GgufTensorInfo& gguf_tensor(const GgufFile& g, const std::string& name) {
  const GgufTensorInfo* t = g.find(name);
  if (!t) throw UsageError(g.path() + ": no tensor '" + name + "'");
  return *t;
}

std::string gguf_where(const GgufFile& g, const GgufTensorInfo& t) {
  std::string ne;
  for (size_t i = 0; i < t.ne.size(); ++i) ne += (i ? ", " : "") + std::to_string(t.ne[i]);
  return g.path() + ": tensor '" + t.name + "' (" + ggml_type_name(t.type) + ", ne [" + ne + "])";
}

}  // namespace

// "model.layers." (or "language_model.model.layers.", ...) and the layer indices present.
std::string hf_layer_prefix(const SafetensorsCheckpoint& ck, std::set<int>* layers) {
  std::string prefix;
  for (const auto& n : ck.names()) {
    const auto pos = n.find(".self_attn.kv_a_proj_with_mqa.");
    if (pos == std::string::npos) continue;
    const std::string left = n.substr(0, pos);  // ...layers.N
    const auto dot = left.rfind('.');
    if (dot == std::string::npos) continue;
    const std::string num = left.substr(dot + 1), pre = left.substr(0, dot + 1);
    if (num.empty() || num.size() > 6 || num.find_first_not_of("0123456789") != std::string::npos) continue;
    if (prefix.empty()) prefix = pre;
    if (pre == prefix) layers->insert(std::stoi(num));
  }
  if (prefix.empty())
    throw UsageError(ck.path() + ": no MLA attention weights (no tensor named *.layers.N.self_attn.kv_a_proj_with_mqa.*)");
  return prefix;
}

LayerSource st_layer(const SafetensorsCheckpoint& ck, const std::string& prefix, int layer, const MlaConfig& cfg,
                     const StQuantInfo& qi, bool input_norm) {
  LayerSource s;
  const std::string base = prefix + std::to_string(layer) + ".";
  const std::string a = base + "self_attn.";
  if (!ck.has(a + "kv_a_proj_with_mqa.weight") && !ck.has(a + "kv_a_proj_with_mqa.weight_packed"))
    throw UsageError(ck.path() + ": layer " + std::to_string(layer) + " has no " + a + "kv_a_proj_with_mqa.weight");
  const bool has_qa = ck.has(a + "q_a_proj.weight") || ck.has(a + "q_a_proj.weight_packed");
  if (cfg.has_q_lora() && !has_qa)
    throw UsageError(ck.path() + ": the model config '" + cfg.name + "' has q_lora_rank " + std::to_string(cfg.q_lora_rank) +
                     " but layer " + std::to_string(layer) + " has no " + a + "q_a_proj.weight" +
                     (ck.has(a + "q_proj.weight") ? " (it has q_proj: a model without q LoRA)" : ""));
  if (!cfg.has_q_lora() && has_qa)
    throw UsageError(ck.path() + ": the model config '" + cfg.name + "' has no q_lora_rank but layer " +
                     std::to_string(layer) + " has " + a + "q_a_proj.weight");
  if (input_norm) s.norms["input_norm"] = st_norm(ck, base + "input_layernorm.weight", "input_norm", cfg);
  if (cfg.has_q_lora()) {
    s.linear["q_a_proj"] = st_linear(ck, a + "q_a_proj", "q_a_proj", cfg, qi);
    s.norms["q_a_norm"] = st_norm(ck, a + "q_a_layernorm.weight", "q_a_norm", cfg);
    s.linear["q_b_proj"] = st_linear(ck, a + "q_b_proj", "q_b_proj", cfg, qi);
  } else {
    s.linear["q_b_proj"] = st_linear(ck, a + "q_proj", "q_b_proj", cfg, qi);
  }
  s.linear["kv_a_proj"] = st_linear(ck, a + "kv_a_proj_with_mqa", "kv_a_proj", cfg, qi);
  s.norms["kv_a_norm"] = st_norm(ck, a + "kv_a_layernorm.weight", "kv_a_norm", cfg);
  s.linear["kv_b_proj"] = st_linear(ck, a + "kv_b_proj", "kv_b_proj", cfg, qi);
  s.linear["o_proj"] = st_linear(ck, a + "o_proj", "o_proj", cfg, qi);
  if (cfg.has_dsa()) {  // the indexer: HF's names under self_attn.indexer
    const bool shared = layer < static_cast<int>(cfg.index_shared.size()) && cfg.index_shared[layer];
    if (shared) return s;  // no indexer of its own (the Runner refuses to run it)
    if (!ck.has(a + "indexer.wq_b.weight") && !ck.has(a + "indexer.wq_b.weight_packed"))
      throw UsageError(ck.path() + ": the model config '" + cfg.name + "' has DSA (index_topk " +
                       std::to_string(cfg.index_topk) + ") but layer " + std::to_string(layer) + " has no " + a +
                       "indexer.wq_b.weight");
    for (const char* w : {"wq_b", "wk", "weights_proj"}) {
      const std::string field = std::string("indexer.") + w;
      s.indexer[field] = dequantize(st_linear(ck, a + field, field, cfg, qi));
    }
    s.indexer["indexer.k_norm"] = st_norm(ck, a + "indexer.k_norm.weight", "indexer.k_norm", cfg);
    s.indexer["indexer.k_norm_bias"] = st_norm(ck, a + "indexer.k_norm.bias", "indexer.k_norm_bias", cfg);
  }
  return s;
}

StQuantInfo st_quant_info(const std::string& path) {
  StQuantInfo qi;
  const fs::path cp = safetensors_config_path(path);
  std::error_code ec;
  if (!fs::exists(cp, ec)) return qi;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(cp));  // parse_hf_config has checked its nesting already
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(cp.string() + ": malformed JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("quantization_config") || !j["quantization_config"].is_object()) return qi;
  const auto& q = j["quantization_config"];
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const auto& b = q["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_unsigned() || !b[1].is_number_unsigned() ||
        b[0].get<uint64_t>() == 0 || b[1].get<uint64_t>() == 0 || b[0].get<uint64_t>() > (1u << 20) ||
        b[1].get<uint64_t>() > (1u << 20))
      throw UsageError(cp.string() + ": quantization_config.weight_block_size must be two positive integers, got " +
                       b.dump());
    qi.block_rows = b[0].get<int64_t>();
    qi.block_cols = b[1].get<int64_t>();
  }
  return qi;
}

LayerSource gguf_layer(const GgufFile& g, int layer, const MlaConfig& cfg, bool input_norm) {
  LayerSource s;
  const std::string b = "blk." + std::to_string(layer) + ".";
  if (!g.find(b + "attn_kv_a_mqa.weight")) {
    int n = 0;
    while (g.find("blk." + std::to_string(n) + ".attn_kv_a_mqa.weight")) ++n;
    throw UsageError(g.path() + ": no tensor '" + b + "attn_kv_a_mqa.weight' (the file has MLA layers 0.." +
                     std::to_string(n - 1) + ")");
  }
  const auto linear = [&](const std::string& name, const std::string& field) {
    const auto& t = gguf_tensor(g, name);
    if (t.ne.size() != 2) throw UsageError(gguf_where(g, t) + ": a linear weight must be 2-D");
    check_shape(cfg, field, gguf_where(g, t), t.shape());
    s.linear[field] = gguf_packed(g, t);
  };
  const auto norm = [&](const std::string& name, const std::string& field) {
    const auto& t = gguf_tensor(g, name);
    check_shape(cfg, field, gguf_where(g, t), t.shape());
    const PackedWeight p = gguf_packed(g, t);
    Tensor out({t.numel});
    dequantize_ggml_row(t.type, p.data.data(), out.ptr(), t.numel);
    s.norms[field] = std::move(out);
  };
  const bool has_qa = g.find(b + "attn_q_a.weight") != nullptr;
  if (cfg.has_q_lora() != has_qa)
    throw UsageError(g.path() + ": the model config '" + cfg.name + "' has " +
                     (cfg.has_q_lora() ? "q_lora_rank " + std::to_string(cfg.q_lora_rank) : std::string("no q_lora_rank")) +
                     " but layer " + std::to_string(layer) + (has_qa ? " has " : " has no ") + b + "attn_q_a.weight");
  if (input_norm) norm(b + "attn_norm.weight", "input_norm");
  if (cfg.has_q_lora()) {
    linear(b + "attn_q_a.weight", "q_a_proj");
    norm(b + "attn_q_a_norm.weight", "q_a_norm");
    linear(b + "attn_q_b.weight", "q_b_proj");
  } else {
    linear(b + "attn_q.weight", "q_b_proj");
  }
  linear(b + "attn_kv_a_mqa.weight", "kv_a_proj");
  norm(b + "attn_kv_a_norm.weight", "kv_a_norm");
  if (g.find(b + "attn_k_b.weight") && g.find(b + "attn_v_b.weight")) {
    // attn_k_b: [N, L, P] (W_UK_h transposed, ne [P, L, N]); attn_v_b: [N, V, L] (ne [L, V, N]).
    const int64_t N = cfg.heads, L = cfg.kv_lora_rank, P = cfg.qk_nope, V = cfg.v_head;
    const std::string kb_name = b + "attn_k_b.weight", vb_name = b + "attn_v_b.weight";
    const auto& kb = gguf_tensor(g, kb_name);
    const auto& vb = gguf_tensor(g, vb_name);
    const auto check3 = [&](const GgufTensorInfo& t, int64_t ne0, int64_t ne1, const std::string& formula) {
      const bool ok3 = t.ne.size() == 3 && t.ne[0] == ne0 && t.ne[1] == ne1 && t.ne[2] == N;
      const bool ok2 = t.ne.size() == 2 && t.ne[0] == ne0 && t.ne[1] == ne1 * N;
      if (!ok3 && !ok2)
        throw UsageError(gguf_where(g, t) + " contradicts the model config '" + cfg.name + "', which expects ne " +
                         dims({ne0, ne1, N}) + " = " + formula);
    };
    check3(kb, P, L, "[qk_nope_head_dim, kv_lora_rank, num_attention_heads] = [" + std::to_string(P) + ", " +
                         std::to_string(L) + ", " + std::to_string(N) + "]");
    check3(vb, L, V, "[kv_lora_rank, v_head_dim, num_attention_heads] = [" + std::to_string(L) + ", " +
                         std::to_string(V) + ", " + std::to_string(N) + "]");
    s.split_kv_b = true;
    s.k_b = gguf_packed(g, kb);
    s.v_b = gguf_packed(g, vb);
  } else if (g.find(b + "attn_kv_b.weight")) {
    linear(b + "attn_kv_b.weight", "kv_b_proj");
  } else {
    throw UsageError(g.path() + ": layer " + std::to_string(layer) + " has neither " + b + "attn_k_b.weight + " + b +
                     "attn_v_b.weight nor the older " + b + "attn_kv_b.weight");
  }
  linear(b + "attn_output.weight", "o_proj");
  if (cfg.has_dsa()) {  // the indexer: llama.cpp's names (blk.N.indexer.attn_q_b, attn_k, k_norm, proj)
    const bool shared = layer < static_cast<int>(cfg.index_shared.size()) && cfg.index_shared[layer];
    if (shared) return s;  // no indexer of its own (the Runner refuses to run it)
    if (!g.find(b + "indexer.attn_q_b.weight"))
      throw UsageError(g.path() + ": the model config '" + cfg.name + "' has DSA (index_topk " +
                       std::to_string(cfg.index_topk) + ") but layer " + std::to_string(layer) + " has no tensor '" +
                       b + "indexer.attn_q_b.weight'");
    for (const auto& [name, field] : {std::pair{"attn_q_b", "indexer.wq_b"}, std::pair{"attn_k", "indexer.wk"},
                                      std::pair{"proj", "indexer.weights_proj"}}) {
      const std::string tensor_name = b + "indexer." + name + ".weight";  // named: t refers into g, not into it
      const auto& t = gguf_tensor(g, tensor_name);
      if (t.ne.size() != 2) throw UsageError(gguf_where(g, t) + ": a linear weight must be 2-D");
      check_shape(cfg, field, gguf_where(g, t), t.shape());
      s.indexer[field] = dequantize(gguf_packed(g, t));
    }
    for (const auto& [name, field] : {std::pair{"k_norm.weight", "indexer.k_norm"},
                                      std::pair{"k_norm.bias", "indexer.k_norm_bias"}}) {
      const std::string tensor_name = b + "indexer." + name;
      const auto& t = gguf_tensor(g, tensor_name);
      check_shape(cfg, field, gguf_where(g, t), t.shape());
      const PackedWeight pw = gguf_packed(g, t);
      Tensor out({t.numel});
      dequantize_ggml_row(t.type, pw.data.data(), out.ptr(), t.numel);
      s.indexer[field] = std::move(out);
    }
  }
  return s;
}

}  // namespace mla
