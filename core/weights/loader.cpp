// Weight loading: synthetic (optionally through a quantized format), safetensors (HF naming) and GGUF
// (llama.cpp naming), each projection checked against the config (checkpoint_layer.cpp reads a checkpoint's layer)
// and dequantized to FP32.
#include "core/weights/loader.h"

#include <cmath>
#include <iostream>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include "core/model/errors.h"
#include "core/model/progress_hook.h"
#include "core/weights/checkpoint_layer.h"
#include "core/weights/gguf.h"
#include "core/weights/quantize.h"
#include "core/weights/safetensors.h"

namespace mla {

namespace fs = std::filesystem;

namespace {

// The progress ticks of a load, counted in layers: within layer l, the passes over its projections (quantizing,
// dequantizing), each weighted by its elements, make up the fraction past l.
class LoadTicks {
 public:
  explicit LoadTicks(int layers) : layers_(layers) {}
  // Layer `l` (0-based, of the run) begins; its passes add up to `units` elements (0: set by the first pass's caller).
  void layer(int l, double units) {
    if (l != layer_) {
      layer_ = l;
      units_ = 0;
      done_ = 0;
    }
    if (units_ == 0) units_ = units;
  }
  void pass(const std::string& what, double elements) {
    if (progress_wanted())
      progress_tick("layers", "weights: layer " + std::to_string(layer_ + 1) + "/" + std::to_string(layers_) + " " +
                    what, layer_ + (units_ > 0 ? std::min(1.0, done_ / units_) : 0.0), layers_,
                    units_ > 0 ? elements / units_ : 0.0);
    done_ += elements;
  }

 private:
  int layers_, layer_ = -1;
  double units_ = 0, done_ = 0;
};

// kv_b_proj [N*(P+V), L] from llama.cpp's k_b [N, L, P] and v_b [N, V, L] (already FP32).
Tensor kv_b_from_split(const Tensor& k_b, const Tensor& v_b, const MlaConfig& c) {
  const int64_t N = c.heads, L = c.kv_lora_rank, P = c.qk_nope, V = c.v_head;
  Tensor out({N * (P + V), L});
  for (int64_t h = 0; h < N; ++h) {
    for (int64_t p = 0; p < P; ++p)
      for (int64_t l = 0; l < L; ++l) out.data[(h * (P + V) + p) * L + l] = k_b.data[(h * L + l) * P + p];
    for (int64_t v = 0; v < V; ++v)
      for (int64_t l = 0; l < L; ++l) out.data[(h * (P + V) + P + v) * L + l] = v_b.data[(h * V + v) * L + l];
  }
  return out;
}

struct FormatCounter {
  std::map<std::string, int> counts;
  void add(WeightFormat f) { ++counts[weight_format_name(f)]; }
  std::string text() const {
    std::string s;
    for (auto& [k, n] : counts) s += (s.empty() ? "" : ", ") + k + " x" + std::to_string(n);
    return s;
  }
};

std::string injection_needs(const DequantBugs& bugs) {
  std::string s;
  if (bugs.fp8_scale_transpose) s += " fp8-scale-transpose needs --weight-format fp8 (or an FP8 block-scaled checkpoint);";
  if (bugs.nvfp4_nibble_swap) s += " nvfp4-nibble-swap needs --weight-format nvfp4, nvfp4-ct or gguf-nvfp4;";
  if (bugs.nvfp4_global_recip) s += " nvfp4-global-recip needs --weight-format nvfp4-ct (compressed-tensors);";
  return s;
}

}  // namespace

FormatChoice parse_format_choice(const std::string& text) {
  FormatChoice c;
  const auto colon = text.find(':');
  c.format = parse_weight_format(text.substr(0, colon));
  if (colon != std::string::npos) {
    const std::string n = text.substr(colon + 1);
    if (c.format != WeightFormat::WeightFormat_fp8 || n.empty() || n.size() > 5 ||
        n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) <= 0)
      throw UsageError("--weight-format '" + text + "': only fp8 takes a block size (fp8:N, N > 0)");
    c.fp8_block = std::stoi(n);
  }
  return c;
}

LayerRange parse_layer_range(const std::string& text) {
  LayerRange r;
  const auto bad = [&](const std::string& why) {
    return UsageError("--layer-range '" + text + "': " + why + " (expected A:B, layers A..B-1, or A)");
  };
  const auto to_int = [&](const std::string& s) {
    if (s.empty() || s.size() > 7 || s.find_first_not_of("0123456789") != std::string::npos)
      throw bad("'" + s + "' is not a non-negative integer");
    return std::stoi(s);
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    r.begin = to_int(text);
    r.end = r.begin + 1;
  } else {
    r.begin = to_int(text.substr(0, colon));
    r.end = to_int(text.substr(colon + 1));
    if (r.end <= r.begin) throw bad("B must be greater than A");
  }
  return r;
}

bool engine_dequantizes(const std::string& engine, const WeightSpec& ws) {
  return engine == "cuda" && (!ws.format.empty() || !ws.synthetic());
}

DequantBugs dequant_bugs(const std::vector<Injection>& injections) {
  DequantBugs b;
  b.fp8_scale_transpose = has_injection(injections, "fp8-scale-transpose");
  b.nvfp4_nibble_swap = has_injection(injections, "nvfp4-nibble-swap");
  b.nvfp4_global_recip = has_injection(injections, "nvfp4-global-recip");
  return b;
}

WeightFormat injection_weight_format(const std::string& name) {
  if (name == "fp8-scale-transpose") return WeightFormat::WeightFormat_fp8;
  if (name == "nvfp4-nibble-swap") return WeightFormat::WeightFormat_nvfp4;
  if (name == "nvfp4-global-recip") return WeightFormat::WeightFormat_nvfp4_ct;
  throw UsageError("'" + name + "' is not a weight injection");
}

LoadedWeights load_weights(const WeightSpec& ws, const MlaConfig& cfg, const RunSpec& spec, uint64_t weight_seed,
                           const std::vector<Injection>& injections, bool keep_packed) {
  LoadedWeights out;
  const bool input_norm = spec.graph_shape().input_norm;
  LayerRange range{0, spec.layers};
  if (!ws.layer_range.empty()) {
    range = parse_layer_range(ws.layer_range);
    if (range.count() != spec.layers)
      throw UsageError("--layer-range " + ws.layer_range + " holds " + std::to_string(range.count()) +
                       " layers but the run has --layers " + std::to_string(spec.layers));
  }
  out.first_layer = range.begin;
  const DequantBugs bugs = dequant_bugs(injections);
  std::optional<WeightFormat> requant;
  int64_t fp8_block = 128;
  if (!ws.format.empty()) {
    const FormatChoice fc = parse_format_choice(ws.format);
    requant = fc.format;
    fp8_block = fc.fp8_block;
  }
  FormatCounter formats;
  bool touched = false;
  LoadTicks ticks(spec.layers);
  const std::string fmt_name = ws.format.empty() ? std::string("f32") : ws.format;

  // Per layer: the projections as stored (or re-quantized), dequantized with the injected bugs.
  const auto finish_layer = [&](LayerSource src, LayerWeights& w, int layer) {
    std::map<std::string, PackedWeight> kept;
    double units = 0;  // a re-quantized projection is passed over three times, the others once
    for (const auto& [field, pw] : src.linear)
      units += static_cast<double>(pw.rows) * pw.cols * (requant && pw.format != *requant ? 3 : 1);
    ticks.layer(layer - range.begin, units);
    if (src.split_kv_b) {
      const bool hit = bugs.touches(src.k_b.format) || bugs.touches(src.v_b.format);
      touched = touched || hit;
      formats.add(src.k_b.format);
      formats.add(src.v_b.format);
      Tensor kv_b = kv_b_from_split(dequantize(src.k_b, bugs), dequantize(src.v_b, bugs), cfg);
      if (keep_packed) {
        kept["attn_k_b"] = std::move(src.k_b);
        kept["attn_v_b"] = std::move(src.v_b);
      }
      if (requant) {
        src.linear["kv_b_proj"] = quantize(kv_b, *requant, "layer " + std::to_string(layer) + " kv_b_proj", fp8_block);
      } else {
        w.kv_b_proj = std::move(kv_b);
      }
    }
    for (const auto& p : kPackedProjections) {
      auto it = src.linear.find(p.field);
      if (it == src.linear.end()) continue;
      PackedWeight pw = std::move(it->second);
      const double numel = static_cast<double>(pw.rows) * pw.cols;
      if (requant && pw.format != *requant) {
        ticks.pass(std::string(p.field) + ": quantizing to " + fmt_name, 2 * numel);
        pw = quantize(dequantize(pw), *requant, pw.origin.empty() ? "layer " + std::to_string(layer) + " " + p.field : pw.origin,
                      fp8_block);
      }
      formats.add(pw.format);
      touched = touched || bugs.touches(pw.format);
      ticks.pass(std::string(p.field) + ": dequantizing", numel);
      w.*(p.member) = dequantize(pw, bugs);
      if (auto bad = nonfinite_scales(pw))
        std::cerr << "warning: " << ws.source << ": layer " << layer << " " << p.field << ": " << *bad << "\n";
      if (keep_packed) kept[p.field] = std::move(pw);
    }
    for (auto& [field, t] : src.norms) {
      if (field == "input_norm") w.input_norm = std::move(t);
      else if (field == "q_a_norm") w.q_a_norm = std::move(t);
      else if (field == "kv_a_norm") w.kv_a_norm = std::move(t);
    }
    for (auto& [name, t] : src.indexer) w.*weight_field(name) = std::move(t);
    const bool shared = layer < static_cast<int>(cfg.index_shared.size()) && cfg.index_shared[layer];
    if (cfg.has_dsa() && w.idx_wq_b.empty() && !shared)
      throw UsageError(ws.source + ": layer " + std::to_string(layer) + ": the model config '" + cfg.name +
                       "' has DSA's indexer, and this checkpoint format gives no indexer weights");
    if (keep_packed) out.packed.push_back(std::move(kept));
  };

  const std::string range_text = ws.layer_range.empty() && range.begin == 0
                                     ? std::to_string(spec.layers) + " layer" + (spec.layers == 1 ? "" : "s")
                                     : range.count() == 1 ? "layer " + std::to_string(range.begin)
                                                          : "layers " + std::to_string(range.begin) + ".." +
                                                                std::to_string(range.end - 1);
  if (ws.synthetic()) {
    uint64_t seed = weight_seed;
    if (ws.source.size() > 10) {
      const std::string s = ws.source.substr(10);
      if (s.find_first_not_of("0123456789") != std::string::npos || s.size() > 19)
        throw UsageError("--weights " + ws.source + ": the seed must be a non-negative integer");
      seed = std::stoull(s);
    }
    auto all = synthetic_weights(cfg, range.end, input_norm, seed);
    out.layers.resize(spec.layers);
    for (int l = 0; l < spec.layers; ++l) {
      LayerWeights& src = all[range.begin + l];
      if (!requant && !keep_packed) {
        out.layers[l] = std::move(src);
        continue;
      }
      LayerSource ls;
      const WeightFormat f = requant.value_or(WeightFormat::WeightFormat_f32);
      double units = 0;  // quantized here, dequantized in finish_layer
      for (const auto& p : kPackedProjections) units += 2.0 * static_cast<double>((src.*(p.member)).numel());
      ticks.layer(l, units);
      for (const auto& p : kPackedProjections)
        if (!(src.*(p.member)).empty()) {
          ticks.pass(std::string(p.field) + ": quantizing to " + fmt_name,
                     static_cast<double>((src.*(p.member)).numel()));
          ls.linear[p.field] =
              quantize(src.*(p.member), f, "synthetic layer " + std::to_string(range.begin + l) + " " + p.field, fp8_block);
        }
      ls.norms["q_a_norm"] = std::move(src.q_a_norm);
      ls.norms["kv_a_norm"] = std::move(src.kv_a_norm);
      ls.norms["input_norm"] = std::move(src.input_norm);
      for (const char* name : {"indexer.wq_b", "indexer.wk", "indexer.k_norm", "indexer.k_norm_bias",
                               "indexer.weights_proj"})
        if (!(src.*weight_field(name)).empty()) ls.indexer[name] = std::move(src.*weight_field(name));
      finish_layer(std::move(ls), out.layers[l], range.begin + l);
    }
    out.description = "synthetic (seed " + std::to_string(seed) + ")" +
                      (requant ? " quantized to " + ws.format : std::string()) + ", " +
                      range_text;
  } else if (is_gguf_path(ws.source)) {
    const GgufFile g(ws.source);
    out.layers.resize(spec.layers);
    for (int l = 0; l < spec.layers; ++l) {
      ticks.layer(l, 0);
      ticks.pass("reading", 0);
      finish_layer(gguf_layer(g, range.begin + l, cfg, input_norm), out.layers[l], range.begin + l);
    }
    out.description = ws.source + " (GGUF: " + formats.text() + "), " + range_text;
  } else if (is_safetensors_path(ws.source)) {
    const SafetensorsCheckpoint ck(ws.source);
    std::set<int> present;
    const std::string prefix = hf_layer_prefix(ck, &present);
    const StQuantInfo qi = st_quant_info(ws.source);
    out.layers.resize(spec.layers);
    for (int l = 0; l < spec.layers; ++l) {
      const int layer = range.begin + l;
      if (!present.count(layer))
        throw UsageError(ws.source + ": no layer " + std::to_string(layer) + " (" + prefix + std::to_string(layer) +
                         ".self_attn.*); the checkpoint has " + std::to_string(present.size()) + " MLA layers" +
                         (present.empty() ? "" : ", " + std::to_string(*present.begin()) + ".." + std::to_string(*present.rbegin())));
      ticks.layer(l, 0);
      ticks.pass("reading", 0);
      finish_layer(st_layer(ck, prefix, layer, cfg, qi, input_norm), out.layers[l], layer);
    }
    out.description = ws.source + " (safetensors, " + std::to_string(ck.shard_count()) + " file" +
                      (ck.shard_count() == 1 ? "" : "s") + ": " + formats.text() + "), " + range_text;
  } else {
    std::error_code ec;
    throw UsageError("--weights '" + ws.source + "': " +
                     (fs::exists(ws.source, ec) ? "not a .gguf, a .safetensors file or a directory of them"
                                                : "no such file (expected synthetic[:SEED], a .gguf, a .safetensors "
                                                  "file or a checkpoint directory)"));
  }
  if (bugs.any() && !touched)
    throw UsageError("the weight injection cannot act: this run's weights are " +
                     (formats.counts.empty() ? std::string("unquantized FP32") : formats.text()) + ";" + injection_needs(bugs));
  // Non-finite weights (stored so, or made so by a NaN/Inf block scale) are reported at load: the runs compute with
  // them as they are, and the first divergence will show where they reach.
  for (size_t l = 0; l < out.layers.size(); ++l)
    for (const auto& line : nonfinite_weights(out.layers[l], out.first_layer + static_cast<int>(l)))
      std::cerr << "warning: " << ws.source << ": " << line << "\n";
  return out;
}

std::optional<std::string> nonfinite_scales(const PackedWeight& w) {
  if (!std::isfinite(w.global_scale))
    return "its global scale is " + std::string(std::isnan(w.global_scale) ? "NaN" : "Inf");
  int64_t per_row = 0;  // scales per row of the grid
  std::function<bool(size_t)> bad;
  switch (w.format) {
    case WeightFormat::WeightFormat_fp8:
      per_row = (w.cols + w.block_cols - 1) / std::max<int64_t>(w.block_cols, 1);
      bad = [&](size_t i) {
        float f;
        std::memcpy(&f, w.scales.data() + 4 * i, 4);
        return !std::isfinite(f);
      };
      break;
    case WeightFormat::WeightFormat_nvfp4:
    case WeightFormat::WeightFormat_nvfp4_ct:
      per_row = w.cols / 16;
      bad = [&](size_t i) { return (w.scales[i] & 0x7F) == 0x7F; };  // E4M3: the NaN pattern (no Inf)
      break;
    case WeightFormat::WeightFormat_mxfp4:
      per_row = w.cols / 32;
      bad = [&](size_t i) { return w.scales[i] == 0xFF; };  // E8M0: NaN
      break;
    default:
      return std::nullopt;  // GGUF blocks: their scales sit inside the blocks; the dequantized values say where
  }
  const size_t n = w.format == WeightFormat::WeightFormat_fp8 ? w.scales.size() / 4 : w.scales.size();
  int64_t count = 0, first = -1;
  for (size_t i = 0; i < n; ++i)
    if (bad(i)) {
      ++count;
      if (first < 0) first = static_cast<int64_t>(i);
    }
  if (count == 0 || per_row <= 0) return std::nullopt;
  return std::to_string(count) + " of " + std::to_string(n) + " block scales are NaN or Inf (the first: block row " +
         std::to_string(first / per_row) + ", block column " + std::to_string(first % per_row) + ")";
}

std::vector<std::string> nonfinite_weights(const LayerWeights& w, int layer) {
  static const std::pair<const char*, const Tensor LayerWeights::*> names[] = {
      {"input_layernorm", &LayerWeights::input_norm}, {"q_a_proj", &LayerWeights::q_a_proj},
      {"q_a_layernorm", &LayerWeights::q_a_norm},     {"q_b_proj", &LayerWeights::q_b_proj},
      {"kv_a_proj_with_mqa", &LayerWeights::kv_a_proj}, {"kv_a_layernorm", &LayerWeights::kv_a_norm},
      {"kv_b_proj", &LayerWeights::kv_b_proj},       {"o_proj", &LayerWeights::o_proj},
      {"indexer.wq_b", &LayerWeights::idx_wq_b},     {"indexer.wk", &LayerWeights::idx_wk},
      {"indexer.k_norm.weight", &LayerWeights::idx_k_norm}, {"indexer.k_norm.bias", &LayerWeights::idx_k_norm_bias},
      {"indexer.weights_proj", &LayerWeights::idx_weights_proj}};
  std::vector<std::string> out;
  for (const auto& [name, field] : names) {
    const Tensor& t = w.*field;
    // A pass that only counts (exponent bits all set), in parallel and in vector lanes; the names come after.
    int64_t bad = 0;
    const int64_t n = t.numel();
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      uint32_t b;
      std::memcpy(&b, &t.data[i], 4);
      bad += (b & 0x7f800000u) == 0x7f800000u;
    }
    if (bad == 0) continue;
    int64_t nan = 0, inf = 0, first = -1;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = t.data[i];
      if (std::isfinite(v)) continue;
      (std::isnan(v) ? nan : inf)++;
      if (first < 0) first = i;
    }
    if (nan + inf == 0) continue;
    const int64_t cols = t.rank() == 2 ? t.dim(1) : std::max<int64_t>(t.numel(), 1);
    out.push_back("layer " + std::to_string(layer) + " " + name + " holds " + std::to_string(nan) + " NaN and " +
                  std::to_string(inf) + " Inf values (the first at row " + std::to_string(first / cols) + ", column " +
                  std::to_string(first % cols) + ")");
  }
  return out;
}

}  // namespace mla
