// The element types of weight files: safetensors dtypes, ggml type ids with their block sizes,
// and the storage formats of one linear weight (WeightFormat, the names --weight-format takes).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mla {

// safetensors dtypes. F4 is packed two per byte; its shape counts elements.
enum class StDtype {
  StDtype_F64, StDtype_F32, StDtype_F16, StDtype_BF16, StDtype_I64, StDtype_I32, StDtype_I16, StDtype_I8,
  StDtype_U8, StDtype_BOOL, StDtype_F8_E4M3, StDtype_F8_E5M2, StDtype_F8_E8M0, StDtype_F4,
  StDtype_U16, StDtype_U32, StDtype_U64,  // rarely written; the reference implementation reads them
};
std::optional<StDtype> st_dtype_from_name(std::string_view name);
const char* st_dtype_name(StDtype t);
int st_dtype_bits(StDtype t);
std::string st_dtype_names();  // "F64, F32, ..." for error messages

// ggml type ids as GGUF stores them (the full table, so that files with types we cannot
// dequantize still parse and inspect). block: elements per block; type_size: bytes per block.
struct GgmlTypeInfo {
  uint32_t id;
  const char* name;
  int64_t block;
  int64_t type_size;
};
const GgmlTypeInfo* ggml_type_info(uint32_t id);  // nullptr for an unknown id
std::string ggml_type_name(uint32_t id);           // "Q4_K", or "type 99" when unknown
namespace ggml {
constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11,
                   Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19,
                   IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35,
                   MXFP4 = 39, NVFP4 = 40;
constexpr int64_t QK_K = 256;
}  // namespace ggml

// How one linear weight is stored. The safetensors formats carry scales beside the elements; the GGUF
// ones are self-contained blocks. Plain F32/F16/BF16 are the same bytes in both files.
enum class WeightFormat {
  WeightFormat_f32, WeightFormat_f16, WeightFormat_bf16,
  WeightFormat_fp8,       // E4M3 [N, K] + F32 scale_inv [ceil(N/128), ceil(K/128)] (DeepSeek), multiplied
  WeightFormat_nvfp4,     // ModelOpt: U8 [N, K/2] + E4M3 [N, K/16] + weight_scale_2 (multiplied)
  WeightFormat_nvfp4_ct,  // compressed-tensors: same, with weight_global_scale as a divisor
  WeightFormat_mxfp4,     // U8 [N, K/2] + E8M0 [N, K/32]
  WeightFormat_q8_0, WeightFormat_q4_0, WeightFormat_q4_1, WeightFormat_q5_0, WeightFormat_q5_1,
  WeightFormat_q2_k, WeightFormat_q3_k, WeightFormat_q4_k, WeightFormat_q5_k, WeightFormat_q6_k,
  WeightFormat_gguf_mxfp4, WeightFormat_gguf_nvfp4,
  // Read from GGUF files only (the "dynamic" quant mixes use them for some tensors): dequantized, never
  // produced by --weight-format (their quantizers search codebooks with importance data).
  WeightFormat_iq1_s, WeightFormat_iq1_m, WeightFormat_iq2_xxs, WeightFormat_iq2_xs, WeightFormat_iq2_s,
  WeightFormat_iq3_xxs, WeightFormat_iq3_s, WeightFormat_iq4_nl, WeightFormat_iq4_xs,
  WeightFormat_tq1_0, WeightFormat_tq2_0,
};
const char* weight_format_name(WeightFormat f);  // the --weight-format spelling: "q4_k", "nvfp4-ct", ...
// A --weight-format name, case-insensitive. Throws UsageError listing them, or, for a format read from GGUF files
// only, saying so.
WeightFormat parse_weight_format(const std::string& s);
std::vector<WeightFormat> all_weight_formats();     // what --weight-format can quantize into
std::vector<WeightFormat> gguf_only_weight_formats();  // the IQ and TQ types: dequantized, never produced
bool is_quantizable(WeightFormat f);                // in all_weight_formats()
bool is_gguf_block_format(WeightFormat f);
uint32_t ggml_type_of(WeightFormat f);                    // for F32/F16/BF16 and the GGUF block formats
std::optional<WeightFormat> weight_format_of_ggml(uint32_t ggml_type);
// Elements per block along the input dimension that the format needs K to be a multiple of (1: none).
int64_t weight_format_k_multiple(WeightFormat f);

}  // namespace mla
