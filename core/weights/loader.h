// From --weights / --weight-format / --layer-range to the per-layer FP32 LayerWeights a run uses: synthetic
// weights (optionally quantized into a format and back), or a checkpoint (safetensors file or directory,
// GGUF) mapped by name (HF and GGUF tensor names), checked against the model config, dequantized.
// The quantized-weight injections (docs/bugs.md) are planted here, as wrong dequantization.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/injection.h"
#include "core/model/weights.h"
#include "core/weights/checkpoint_config.h"
#include "core/weights/dequant.h"

namespace mla {

struct WeightSpec {
  std::string source = "synthetic";  // synthetic, synthetic:SEED, or a checkpoint path
  std::string format;                // --weight-format ("" = as stored; synthetic: bf16-exact FP32); fp8:N sets
                                     // the fp8 block to NxN (default 128, DeepSeek's weight_block_size)
  std::string layer_range;           // --layer-range a:b (checkpoint layers a..b-1); "" = from 0
  bool synthetic() const { return source == "synthetic" || source.rfind("synthetic:", 0) == 0; }
};

struct LayerRange {
  int begin = 0, end = 0;  // [begin, end)
  int count() const { return end - begin; }
};
// "a:b" (b > a >= 0) or "a" (one layer). Throws UsageError.
LayerRange parse_layer_range(const std::string& text);

// One line per weight of `w` that holds NaN or Inf: how many, and where the first sits ("layer 3 q_a_proj holds 2 NaN
// and 0 Inf values (the first at row 5, column 17)"); empty when every value is finite.
std::vector<std::string> nonfinite_weights(const LayerWeights& w, int layer);
// The block scales of a stored weight that are NaN or Inf (fp8 F32 scale_inv, nvfp4 E4M3, mxfp4 E8M0, the global
// scale): "3 of 64 block scales are NaN or Inf (the first: block row 0, block column 2)"; nullopt when none is, or
// for formats whose scales sit inside their blocks (GGUF: the dequantized values say where).
std::optional<std::string> nonfinite_scales(const PackedWeight& w);

// The projections of LayerWeights by the field names LoadedWeights::packed keeps them under (a GGUF checkpoint's
// split kv_b also keeps attn_k_b and attn_v_b there).
struct PackedProjection {
  const char* field;
  Tensor LayerWeights::*member;
};
inline constexpr PackedProjection kPackedProjections[] = {
    {"q_a_proj", &LayerWeights::q_a_proj}, {"q_b_proj", &LayerWeights::q_b_proj},
    {"kv_a_proj", &LayerWeights::kv_a_proj}, {"kv_b_proj", &LayerWeights::kv_b_proj},
    {"o_proj", &LayerWeights::o_proj},
};

struct LoadedWeights {
  std::vector<LayerWeights> layers;  // FP32 [out, in], global; what the reference computes with
  // Per layer, the stored form of each projection by LayerWeights field name (q_a_proj, ...), when
  // keep_packed was asked: what an engine that dequantizes on its own side uploads.
  std::vector<std::map<std::string, PackedWeight>> packed;
  int first_layer = 0;
  std::string description;  // one line: where the weights came from, formats, layers
};

// Layers [range.begin, range.begin + spec.layers) (range from ws.layer_range). input_layernorm is loaded when
// the run's graph starts at h. Weight injections (fp8-scale-transpose, nvfp4-nibble-swap, nvfp4-global-recip)
// in `injections` select the wrong dequantization for every weight of the format they corrupt; an injection
// that touches no weight of the run is a UsageError saying which --weight-format it needs.
LoadedWeights load_weights(const WeightSpec& ws, const MlaConfig& cfg, const RunSpec& spec, uint64_t weight_seed,
                           const std::vector<Injection>& injections = {}, bool keep_packed = false);


// Whether a run of `engine` takes the projections as stored and dequantizes them on its own side (cuda, for a
// --weight-format or a checkpoint): load_weights with keep_packed, and the Runner's set_packed_weights.
bool engine_dequantizes(const std::string& engine, const WeightSpec& ws);

// --weight-format text: a format name, and for fp8 an optional ":N" block size.
struct FormatChoice {
  WeightFormat format = WeightFormat::WeightFormat_f32;
  int64_t fp8_block = 128;
};
FormatChoice parse_format_choice(const std::string& text);

// The dequantization bugs the injections ask for.
DequantBugs dequant_bugs(const std::vector<Injection>& injections);
// The format a weight injection needs (for the zoo and error messages): fp8, nvfp4, nvfp4-ct.
WeightFormat injection_weight_format(const std::string& name);

}  // namespace mla
