// Tables of element types and weight formats.
#include "core/weights/formats.h"

#include <algorithm>
#include <cctype>

#include "core/model/errors.h"

namespace mla {

namespace {
struct StDtypeRow {
  StDtype t;
  const char* name;
  int bits;
};
constexpr StDtypeRow kStDtypes[] = {
    {StDtype::StDtype_F64, "F64", 64},         {StDtype::StDtype_F32, "F32", 32},
    {StDtype::StDtype_F16, "F16", 16},         {StDtype::StDtype_BF16, "BF16", 16},
    {StDtype::StDtype_I64, "I64", 64},         {StDtype::StDtype_I32, "I32", 32},
    {StDtype::StDtype_I16, "I16", 16},         {StDtype::StDtype_I8, "I8", 8},
    {StDtype::StDtype_U8, "U8", 8},            {StDtype::StDtype_BOOL, "BOOL", 8},
    {StDtype::StDtype_F8_E4M3, "F8_E4M3", 8},  {StDtype::StDtype_F8_E5M2, "F8_E5M2", 8},
    {StDtype::StDtype_F8_E8M0, "F8_E8M0", 8},  {StDtype::StDtype_F4, "F4", 4},
    {StDtype::StDtype_U16, "U16", 16},         {StDtype::StDtype_U32, "U32", 32},
    {StDtype::StDtype_U64, "U64", 64},
};

constexpr int64_t K = ggml::QK_K;
// gguf-py's GGML_QUANT_SIZES (llama.cpp's type_traits): (block size, bytes per block).
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "F32", 1, 4},
    {1, "F16", 1, 2},
    {2, "Q4_0", 32, 2 + 16},
    {3, "Q4_1", 32, 2 + 2 + 16},
    {6, "Q5_0", 32, 2 + 4 + 16},
    {7, "Q5_1", 32, 2 + 2 + 4 + 16},
    {8, "Q8_0", 32, 2 + 32},
    {9, "Q8_1", 32, 4 + 4 + 32},
    {10, "Q2_K", K, 2 + 2 + K / 16 + K / 4},
    {11, "Q3_K", K, 2 + K / 4 + K / 8 + 12},
    {12, "Q4_K", K, 2 + 2 + K / 2 + 12},
    {13, "Q5_K", K, 2 + 2 + K / 2 + K / 8 + 12},
    {14, "Q6_K", K, 2 + K / 2 + K / 4 + K / 16},
    {15, "Q8_K", K, 4 + K + K / 8},
    {16, "IQ2_XXS", K, 2 + K / 4},
    {17, "IQ2_XS", K, 2 + K / 4 + K / 32},
    {18, "IQ3_XXS", K, 2 + K / 4 + K / 8},
    {19, "IQ1_S", K, 2 + K / 8 + K / 16},
    {20, "IQ4_NL", 32, 2 + 16},
    {21, "IQ3_S", K, 2 + K / 4 + K / 8 + K / 32 + 4},
    {22, "IQ2_S", K, 2 + K / 4 + K / 16},
    {23, "IQ4_XS", K, 2 + 2 + K / 2 + K / 64},
    {24, "I8", 1, 1},
    {25, "I16", 1, 2},
    {26, "I32", 1, 4},
    {27, "I64", 1, 8},
    {28, "F64", 1, 8},
    {29, "IQ1_M", K, K / 8 + K / 16 + K / 32},
    {30, "BF16", 1, 2},
    {34, "TQ1_0", K, 2 + 4 * 13},
    {35, "TQ2_0", K, 2 + 64},
    {39, "MXFP4", 32, 1 + 16},
    {40, "NVFP4", 64, 4 + 32},
    {41, "Q1_0", 128, 2 + 16},
};

struct FormatRow {
  WeightFormat f;
  const char* name;
  uint32_t ggml;  // ~0u: not a ggml type
  int64_t k_multiple;
  bool quantizable = true;  // false: read from GGUF files only
};
constexpr uint32_t kNone = ~0u;
constexpr FormatRow kFormats[] = {
    {WeightFormat::WeightFormat_f32, "f32", ggml::F32, 1},
    {WeightFormat::WeightFormat_f16, "f16", ggml::F16, 1},
    {WeightFormat::WeightFormat_bf16, "bf16", ggml::BF16, 1},
    {WeightFormat::WeightFormat_fp8, "fp8", kNone, 1},
    {WeightFormat::WeightFormat_nvfp4, "nvfp4", kNone, 16},
    {WeightFormat::WeightFormat_nvfp4_ct, "nvfp4-ct", kNone, 16},
    {WeightFormat::WeightFormat_mxfp4, "mxfp4", kNone, 32},
    {WeightFormat::WeightFormat_q8_0, "q8_0", ggml::Q8_0, 32},
    {WeightFormat::WeightFormat_q4_0, "q4_0", ggml::Q4_0, 32},
    {WeightFormat::WeightFormat_q4_1, "q4_1", ggml::Q4_1, 32},
    {WeightFormat::WeightFormat_q5_0, "q5_0", ggml::Q5_0, 32},
    {WeightFormat::WeightFormat_q5_1, "q5_1", ggml::Q5_1, 32},
    {WeightFormat::WeightFormat_q2_k, "q2_k", ggml::Q2_K, K},
    {WeightFormat::WeightFormat_q3_k, "q3_k", ggml::Q3_K, K},
    {WeightFormat::WeightFormat_q4_k, "q4_k", ggml::Q4_K, K},
    {WeightFormat::WeightFormat_q5_k, "q5_k", ggml::Q5_K, K},
    {WeightFormat::WeightFormat_q6_k, "q6_k", ggml::Q6_K, K},
    {WeightFormat::WeightFormat_gguf_mxfp4, "gguf-mxfp4", ggml::MXFP4, 32},
    {WeightFormat::WeightFormat_gguf_nvfp4, "gguf-nvfp4", ggml::NVFP4, 64},
    {WeightFormat::WeightFormat_iq1_s, "iq1_s", ggml::IQ1_S, K, false},
    {WeightFormat::WeightFormat_iq1_m, "iq1_m", ggml::IQ1_M, K, false},
    {WeightFormat::WeightFormat_iq2_xxs, "iq2_xxs", ggml::IQ2_XXS, K, false},
    {WeightFormat::WeightFormat_iq2_xs, "iq2_xs", ggml::IQ2_XS, K, false},
    {WeightFormat::WeightFormat_iq2_s, "iq2_s", ggml::IQ2_S, K, false},
    {WeightFormat::WeightFormat_iq3_xxs, "iq3_xxs", ggml::IQ3_XXS, K, false},
    {WeightFormat::WeightFormat_iq3_s, "iq3_s", ggml::IQ3_S, K, false},
    {WeightFormat::WeightFormat_iq4_nl, "iq4_nl", ggml::IQ4_NL, 32, false},
    {WeightFormat::WeightFormat_iq4_xs, "iq4_xs", ggml::IQ4_XS, K, false},
    {WeightFormat::WeightFormat_tq1_0, "tq1_0", ggml::TQ1_0, K, false},
    {WeightFormat::WeightFormat_tq2_0, "tq2_0", ggml::TQ2_0, K, false},
};

const FormatRow& row(WeightFormat f) {
  for (const auto& r : kFormats)
    if (r.f == f) return r;
  return kFormats[0];
}
}  // namespace

std::optional<StDtype> st_dtype_from_name(std::string_view name) {
  for (const auto& r : kStDtypes)
    if (name == r.name) return r.t;
  return std::nullopt;
}
const char* st_dtype_name(StDtype t) {
  for (const auto& r : kStDtypes)
    if (r.t == t) return r.name;
  return "?";
}
int st_dtype_bits(StDtype t) {
  for (const auto& r : kStDtypes)
    if (r.t == t) return r.bits;
  return 0;
}
std::string st_dtype_names() {
  std::string s;
  for (const auto& r : kStDtypes) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (t.id == id) return &t;
  return nullptr;
}
std::string ggml_type_name(uint32_t id) {
  const auto* t = ggml_type_info(id);
  return t ? t->name : "type " + std::to_string(id);
}

const char* weight_format_name(WeightFormat f) { return row(f).name; }

WeightFormat parse_weight_format(const std::string& s) {
  std::string low = s;
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return std::tolower(c); });
  if (low == "fp32") low = "f32";
  if (low == "fp16") low = "f16";
  if (low == "fp8-block" || low == "f8_e4m3") low = "fp8";
  std::string names;
  for (const auto& r : kFormats)
    if (r.quantizable) names += (names.empty() ? "" : ", ") + std::string(r.name);
  for (const auto& r : kFormats) {
    if (low != r.name) continue;
    if (r.quantizable) return r.f;
    throw UsageError("weight format '" + s + "' is read from GGUF files only: --weight-format cannot quantize into it "
                     "(it can: " + names + ")");
  }
  throw UsageError("unknown weight format '" + s + "' (known: " + names + ")");
}

std::vector<WeightFormat> all_weight_formats() {
  std::vector<WeightFormat> v;
  for (const auto& r : kFormats)
    if (r.quantizable) v.push_back(r.f);
  return v;
}

std::vector<WeightFormat> gguf_only_weight_formats() {
  std::vector<WeightFormat> v;
  for (const auto& r : kFormats)
    if (!r.quantizable) v.push_back(r.f);
  return v;
}

bool is_quantizable(WeightFormat f) { return row(f).quantizable; }

bool is_gguf_block_format(WeightFormat f) {
  const auto& r = row(f);
  return r.ggml != kNone && r.ggml != ggml::F32 && r.ggml != ggml::F16 && r.ggml != ggml::BF16;
}
uint32_t ggml_type_of(WeightFormat f) { return row(f).ggml; }
std::optional<WeightFormat> weight_format_of_ggml(uint32_t ggml_type) {
  for (const auto& r : kFormats)
    if (r.ggml == ggml_type) return r.f;
  return std::nullopt;
}
int64_t weight_format_k_multiple(WeightFormat f) { return row(f).k_multiple; }

}  // namespace mla
