// Weight file descriptions for `inspect`.
#include "core/weights/inspect_weights.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "core/model/errors.h"
#include "core/weights/gguf.h"
#include "core/weights/loader.h"
#include "core/weights/safetensors.h"

namespace mla {

namespace {

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n < 10 * 1024) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else if (n < 10ull << 20) std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  else if (n < 10ull << 30) std::snprintf(buf, sizeof buf, "%.1f MiB", n / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.1f GiB", n / 1073741824.0);
  return buf;
}

std::string dims_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The layer a tensor name belongs to ("blk.N." or "layers.N."), or -1.
int layer_of(const std::string& name) {
  for (const char* key : {"blk.", "layers."}) {
    auto p = name.find(key);
    if (p == std::string::npos) continue;
    p += std::string(key).size();
    size_t e = p;
    while (e < name.size() && e - p < 7 && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
    if (e > p && e < name.size() && name[e] == '.') return std::stoi(name.substr(p, e - p));
  }
  return -1;
}

std::string dsa_lines(const MlaConfig& cfg, const SafetensorsCheckpoint* ck, std::ostream& os, int layer);

// The detected config and whether the checked layer loads with it; then, for DSA models, dsa_lines (ck: the
// safetensors checkpoint whose indexer weights it checks; nullptr for GGUF, whose indexer tensors it does not).
std::string config_lines(const std::string& path, std::ostream& os, int layer, const SafetensorsCheckpoint* ck) {
  MlaConfig cfg;
  try {
    cfg = checkpoint_config(path);
  } catch (const UsageError& e) {
    os << "config    none: " << e.what() << "\n";
    return e.what();
  }
  char yarn_buf[96] = "";
  if (cfg.rope_scaling == RopeScaling::RopeScaling_yarn)
    std::snprintf(yarn_buf, sizeof yarn_buf, ", yarn factor %g from %d (mscale %g / %g)", cfg.yarn.factor,
                  cfg.yarn.original_max_position, cfg.yarn.mscale, cfg.yarn.mscale_all_dim);
  const std::string yarn = yarn_buf;
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "config    %s: hidden %d, heads %d, q_lora_rank %s, kv_lora_rank %d, qk_nope %d, qk_rope %d, v_head %d, "
                "layers %d, rope theta %g%s, rms eps %g; softmax scale %.6g\n",
                cfg.model_type.c_str(), cfg.hidden, cfg.heads,
                cfg.has_q_lora() ? std::to_string(cfg.q_lora_rank).c_str() : "none", cfg.kv_lora_rank, cfg.qk_nope,
                cfg.qk_rope, cfg.v_head, cfg.num_layers, cfg.rope_theta,
                yarn.c_str(),
                cfg.rms_eps, cfg.softmax_scale);
  os << buf;
  // Load one layer the way a run does: the shapes checked against the config, every tensor dequantized.
  const int l = std::max(layer, 0);
  WeightSpec ws;
  ws.source = path;
  ws.layer_range = std::to_string(l);
  RunSpec spec;
  spec.layers = 1;
  spec.input_norm = true;
  try {
    const LoadedWeights w = load_weights(ws, cfg, spec, 0);
    os << "check     layer " << l << " loads and agrees with the config: " << w.description << "\n";
  } catch (const UsageError& e) {
    os << "check     layer " << l << ": " << e.what() << "\n";
    dsa_lines(cfg, ck, os, layer);
    return e.what();
  }
  return dsa_lines(cfg, ck, os, layer);
}

std::string describe_gguf(const std::string& path, std::ostream& os, int layer, size_t max_tensors) {
  const GgufFile g(path);
  const auto& h = g.header();
  const Bytes b = g.bytes();
  os << "file      " << path << " (GGUF v" << h.version << ", " << human_bytes(b.size()) << ", alignment "
     << h.alignment << ", " << h.kvs.size() << " metadata keys, " << h.tensors.size() << " tensors)\n";
  os << "metadata\n";
  for (const auto& kv : h.kvs) {
    if (layer >= 0) break;
    std::string t = gguf_type_name(kv.value.type);
    os << "  " << kv.key << " (" << t << ") = " << gguf_value_text(b, kv.value) << "\n";
  }
  if (layer >= 0) os << "  (" << h.kvs.size() << " keys; omitted with --layer)\n";
  std::map<std::string, int> types;
  std::set<int> layers;
  for (const auto& t : h.tensors) {
    ++types[ggml_type_name(t.type)];
    if (layer_of(t.name) >= 0 && t.name.find("attn_kv_a_mqa") != std::string::npos) layers.insert(layer_of(t.name));
  }
  os << "tensors   (name, type, shape outermost first, bytes)\n";
  size_t shown = 0, hidden = 0;
  for (const auto& t : h.tensors) {
    if (layer >= 0 && layer_of(t.name) != layer) continue;
    if (shown == max_tensors && layer < 0) {
      ++hidden;
      continue;
    }
    char line[256];
    std::snprintf(line, sizeof line, "  %-40s %-7s %-22s %s\n", t.name.c_str(), ggml_type_name(t.type).c_str(),
                  dims_text(t.shape()).c_str(), human_bytes(t.nbytes).c_str());
    os << line;
    ++shown;
  }
  if (hidden) os << "  ... " << hidden << " more (inspect FILE --layer N lists one layer)\n";
  std::string tt;
  for (auto& [k, n] : types) tt += (tt.empty() ? "" : ", ") + k + " x" + std::to_string(n);
  os << "types     " << tt << "\n";
  os << "MLA       " << layers.size() << " attention layers";
  if (!layers.empty()) os << " (" << *layers.begin() << ".." << *layers.rbegin() << ")";
  const bool split = g.find("blk." + std::to_string(layers.empty() ? 0 : *layers.begin()) + ".attn_k_b.weight") != nullptr;
  os << (layers.empty() ? "" : split ? ", kv_b_proj as attn_k_b [N, L, P] + attn_v_b [N, V, L]" : ", kv_b_proj as attn_kv_b")
     << "\n";
  if (layers.empty())
    return "no MLA attention layer (no blk.N.attn_kv_a_mqa tensor): nothing here that mla-bisect can run";
  return config_lines(path, os, layer, nullptr);
}

// The DSA indexer (configs with index_topk): its constants, the shared layers, and, in a safetensors checkpoint,
// whether the checked layer's indexer weights (HF's names: self_attn.indexer.wq_b, wk, k_norm, weights_proj) have the
// shapes the config implies. Returns what disagrees ("" when nothing does).
std::string dsa_lines(const MlaConfig& cfg, const SafetensorsCheckpoint* ck, std::ostream& os, int layer) {
  if (!cfg.has_dsa()) return "";
  const int64_t Hi = cfg.index_n_heads, Di = cfg.index_head_dim, H = cfg.hidden;
  const int64_t Lq = cfg.has_q_lora() ? cfg.q_lora_rank : H;
  std::string shared;
  for (size_t l = 0; l < cfg.index_shared.size(); ++l)
    if (cfg.index_shared[l]) shared += (shared.empty() ? "" : ", ") + std::to_string(l);
  os << "dsa       index_topk " << cfg.index_topk << "; indexer " << Hi << " heads x " << Di << " lanes, rope "
     << (cfg.index_rope_style == RopeStyle::RopeStyle_neox ? "half-split" : "interleaved") << " on its first "
     << cfg.qk_rope << " lanes; shared layers (the previous full layer's top-k): "
     << (shared.empty() ? "none" : shared) << " (runs refuse them; docs/mla.md)\n";
  if (!ck) return "";
  const int l = std::max(layer, 0);
  std::string base;  // "model.layers.L.self_attn."
  for (const auto& n : ck->names())
    if (layer_of(n) == l && n.find("self_attn.kv_a_proj_with_mqa.") != std::string::npos)
      base = n.substr(0, n.find("kv_a_proj_with_mqa."));
  const bool is_shared = l < static_cast<int>(cfg.index_shared.size()) && cfg.index_shared[l];
  const struct {
    const char* name;
    std::vector<int64_t> shape;
  } want[] = {{"indexer.wq_b.weight", {Hi * Di, Lq}},
              {"indexer.wk.weight", {Di, H}},
              {"indexer.k_norm.weight", {Di}},
              {"indexer.k_norm.bias", {Di}},
              {"indexer.weights_proj.weight", {Hi, H}}};
  std::string found, problem;
  int present = 0;
  for (const auto& w : want) {
    const std::string n = base + w.name;
    if (base.empty() || !ck->has(n)) continue;
    ++present;
    const auto& shape = ck->info(n).shape;
    std::string shown = std::string(w.name).substr(8);  // "wq_b.weight" -> "wq_b"; the bias keeps its suffix
    if (shown.size() > 7 && shown.compare(shown.size() - 7, 7, ".weight") == 0) shown.resize(shown.size() - 7);
    found += (found.empty() ? "" : ", ") + shown + " " + dims_text(shape);
    if (shape != w.shape && problem.empty())
      problem = n + " is " + dims_text(shape) + ", but index_n_heads " + std::to_string(Hi) + ", index_head_dim " +
                std::to_string(Di) + " make it " + dims_text(w.shape);
  }
  os << "dsa       layer " << l;
  if (!problem.empty()) os << ": " << problem << "\n";
  else if (present == 0)
    os << (is_shared ? " is shared: no indexer of its own, as expected\n"
                     : " has no indexer weights (self_attn.indexer.*): a run of it is refused\n");
  else
    os << (is_shared ? " is shared by the config but has indexer weights: " : "'s indexer agrees with the config: ")
       << found << "\n";
  return problem;
}

std::string describe_safetensors(const std::string& path, std::ostream& os, int layer, size_t max_tensors) {
  const SafetensorsCheckpoint ck(path);
  const auto names = ck.names();
  os << "file      " << path << " (safetensors, " << ck.shard_count() << " file" << (ck.shard_count() == 1 ? "" : "s")
     << ", " << names.size() << " tensors)\n";
  std::map<std::string, int> types;
  std::set<int> layers;
  size_t shown = 0, hidden = 0;
  os << "tensors   (name, dtype, shape, bytes)\n";
  for (const auto& n : names) {
    const int l = layer_of(n);
    if (n.find("kv_a_proj_with_mqa") != std::string::npos && l >= 0) layers.insert(l);
    if (layer >= 0 && l != layer) continue;
    if (shown == max_tensors && layer < 0) {
      ++hidden;
      continue;
    }
    const StTensorInfo& t = ck.info(n);  // opens the shard holding it
    ++types[st_dtype_name(t.dtype)];
    char line[256];
    std::snprintf(line, sizeof line, "  %-56s %-8s %-16s %s\n", n.c_str(), st_dtype_name(t.dtype),
                  dims_text(t.shape).c_str(), human_bytes(t.end - t.begin).c_str());
    os << line;
    ++shown;
  }
  if (hidden) os << "  ... " << hidden << " more (inspect PATH --layer N lists one layer)\n";
  std::string tt;
  for (auto& [k, n] : types) tt += (tt.empty() ? "" : ", ") + k + " x" + std::to_string(n);
  os << "types     " << tt << (hidden ? " (of the tensors listed)" : "") << "\n";
  os << "MLA       " << layers.size() << " attention layers";
  if (!layers.empty()) os << " (" << *layers.begin() << ".." << *layers.rbegin() << ")";
  os << "\n";
  return layers.empty() ? std::string() : config_lines(path, os, layer, &ck);
}

}  // namespace

std::string describe_weights(const std::string& path, std::ostream& os, int layer, size_t max_tensors) {
  if (is_gguf_path(path)) return describe_gguf(path, os, layer, max_tensors);
  if (is_safetensors_path(path)) return describe_safetensors(path, os, layer, max_tensors);
  throw UsageError(path + ": not a .gguf, a .safetensors file or a directory of safetensors");
}

}  // namespace mla
