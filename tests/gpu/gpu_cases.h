// The run shapes the GPU equivalence tests sweep: tiny (every mode, form and tp 1/2/8, page boundaries,
// s_q 1 and 2, YaRN, neox, no q LoRA, stacked layers) and the real DeepSeek-V3 and GLM-5 dims at small T.
#pragma once
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace mla::gputest {

inline Case make_case(std::string name, std::string model, Mode mode, AttentionForm form, int tp, int tokens,
                      int batch = 1, std::vector<int> context = {}) {
  Case c;
  c.name = std::move(name);
  c.model = std::move(model);
  c.mode = mode;
  c.form = form;
  c.tp = tp;
  c.tokens = tokens;
  c.batch = batch;
  c.context = std::move(context);
  return c;
}

constexpr auto kPrefill = Mode::Mode_prefill;
constexpr auto kDecode = Mode::Mode_decode;
constexpr auto kChunked = Mode::Mode_chunked;
constexpr auto kMha = AttentionForm::AttentionForm_mha;
constexpr auto kAbsorbed = AttentionForm::AttentionForm_absorbed;

inline void no_q_lora_neox(MlaConfig& c) {
  c.q_lora_rank = 0;
  c.rope_style = RopeStyle::RopeStyle_neox;
}

inline std::vector<Case> tiny_cases() {
  std::vector<Case> v;
  v.push_back(make_case("tiny_prefill_tp1", "tiny", kPrefill, kMha, 1, 16));
  auto off = make_case("tiny_prefill_tp2_offset", "tiny", kPrefill, kMha, 2, 12);
  off.position_offset = 100;  // rope at large positions, causal mask unchanged
  v.push_back(off);
  v.push_back(make_case("tiny_prefill_tp8", "tiny", kPrefill, kMha, 8, 9));
  v.push_back(make_case("tiny_prefill_absorbed_tp1", "tiny", kPrefill, kAbsorbed, 1, 10));
  auto qp = make_case("tiny_qproj_neox_2layers_tp2", "tiny", kPrefill, kMha, 2, 7);
  qp.tweak = no_q_lora_neox;
  qp.layers = 2;
  qp.input_norm = true;
  v.push_back(qp);
  v.push_back(make_case("tiny_decode_sq1_tp1", "tiny", kDecode, kAbsorbed, 1, 1, 4, {0, 1, 63, 65}));
  v.push_back(make_case("tiny_decode_sq2_tp8", "tiny", kDecode, kAbsorbed, 8, 2, 2, {64, 130}));
  v.push_back(make_case("tiny_decode_mha_sq2_tp2", "tiny", kDecode, kMha, 2, 2, 2, {17, 64}));
  v.push_back(make_case("tiny_chunked_tp2", "tiny", kChunked, kMha, 2, 3, 2, {5, 70}));
  auto deep = make_case("tiny_decode_3layers_tp8", "tiny", kDecode, kAbsorbed, 8, 1, 2, {40, 128});
  deep.layers = 3;
  v.push_back(deep);
  return v;
}

inline std::vector<Case> big_cases() {
  std::vector<Case> v;
  v.push_back(make_case("dsv3_prefill_tp1", "deepseek-v3", kPrefill, kMha, 1, 6));
  v.push_back(make_case("dsv3_decode_sq2_tp8", "deepseek-v3", kDecode, kAbsorbed, 8, 2, 2, {33, 80}));
  v.push_back(make_case("dsv3_chunked_tp2", "deepseek-v3", kChunked, kMha, 2, 3, 1, {70}));
  v.push_back(make_case("glm5_prefill_tp8", "glm-5", kPrefill, kMha, 8, 5));
  v.push_back(make_case("glm5_decode_sq1_tp1", "glm-5", kDecode, kAbsorbed, 1, 1, 2, {1, 100}));
  v.push_back(make_case("glm5_chunked_tp1", "glm-5", kChunked, kMha, 1, 4, 1, {65}));
  return v;
}

// DSA (the indexer, its scores, top-k and the sparse attention): tiny-dsa (12 keys a token) with more keys than
// that in prefill, decode (ragged contexts across pages) and chunked prefill, at tp 1 and 2; and GLM-5's dims
// (32 indexer heads of 128 lanes, 2048 keys a token) at contexts of 4096 and 16384 keys, decode and chunked prefill
// (the MHA form over a cached context), at tp 8 so that the CPU references stay fast.
inline std::vector<Case> dsa_cases() {
  std::vector<Case> v;
  v.push_back(make_case("tiny_dsa_prefill_t40_tp1", "tiny-dsa", kPrefill, kMha, 1, 40));
  v.push_back(make_case("tiny_dsa_prefill_absorbed_t40_tp2", "tiny-dsa", kPrefill, kAbsorbed, 2, 40));
  v.push_back(make_case("tiny_dsa_decode_sq1_tp1", "tiny-dsa", kDecode, kAbsorbed, 1, 1, 3, {5, 100, 300}));
  v.push_back(make_case("tiny_dsa_decode_sq2_tp2", "tiny-dsa", kDecode, kAbsorbed, 2, 2, 2, {11, 130}));
  v.push_back(make_case("tiny_dsa_chunked_tp2", "tiny-dsa", kChunked, kMha, 2, 8, 2, {30, 90}));
  v.push_back(make_case("glm5_dsa_decode_ctx4096_tp8", "glm-5", kDecode, kAbsorbed, 8, 1, 2, {4096, 3000}));
  v.push_back(make_case("glm5_dsa_decode_ctx16384_tp8", "glm-5", kDecode, kAbsorbed, 8, 1, 1, {16384}));
  v.push_back(make_case("glm5_dsa_chunked_ctx4096_tp8", "glm-5", kChunked, kMha, 8, 32, 1, {4096}));
  v.push_back(make_case("glm5_dsa_chunked_ctx16384_tp8", "glm-5", kChunked, kMha, 8, 16, 1, {16384}));
  return v;
}

// Shapes that cross the fast kernels' tiles: the flash kernel's query tiles (64 or 128 rows) and 64-key
// tiles (several of each, the causal diagonal, a ragged last tile), the split-KV decode's pages and splits
// (empty splits of short sequences, an empty context) and the context path of chunked prefill. Tiny dims keep
// the CPU references fast; tweaked so that both flash instantiations and both load paths run: the preset
// itself (V 12: scalar loads, D 192 / V 128 kernel), tiny_vec (V 16: cp.async) and tiny_wide (D 208, V 136:
// the D 256 / V 256 kernel). One real-dims decode covers the 4-group, 32-row split kernel.
inline void tiny_vec(MlaConfig& c) { c.v_head = 16; }
inline void tiny_wide(MlaConfig& c) {
  c.qk_nope = 200;
  c.v_head = 136;
}

inline std::vector<Case> long_cases() {
  std::vector<Case> v;
  v.push_back(make_case("tiny_prefill_t300_tp1", "tiny", kPrefill, kMha, 1, 300));
  auto vec = make_case("tiny_vec_prefill_t300_tp2", "tiny", kPrefill, kMha, 2, 300);
  vec.tweak = tiny_vec;
  v.push_back(vec);
  auto wide = make_case("tiny_wide_prefill_t200_tp1", "tiny", kPrefill, kMha, 1, 200);
  wide.tweak = tiny_wide;
  v.push_back(wide);
  auto wide_ch = make_case("tiny_wide_chunked_t150_tp2", "tiny", kChunked, kMha, 2, 150, 2, {200, 67});
  wide_ch.tweak = tiny_wide;
  v.push_back(wide_ch);
  v.push_back(make_case("tiny_chunked_t150_tp2", "tiny", kChunked, kMha, 2, 150, 2, {200, 67}));
  v.push_back(make_case("tiny_decode_sq2_long_tp1", "tiny", kDecode, kAbsorbed, 1, 2, 3, {0, 700, 1500}));
  v.push_back(make_case("dsv3_decode_long_tp1", "deepseek-v3", kDecode, kAbsorbed, 1, 1, 4, {100, 1000, 2000, 4000}));
  return v;
}

// The numbered fallbacks (each kernel keeps its simple version 1 as a fallback and a check): version 1 of
// attention_mha and attention_mqa on the tiny cases and on the long tiny ones.
inline std::vector<Case> fallback_cases() {
  std::vector<Case> v;
  for (auto c : tiny_cases()) v.push_back(c);
  for (auto c : long_cases())
    if (c.model == "tiny") v.push_back(c);
  for (auto& c : v) {
    c.name = "v1_" + c.name;
    c.engine_options = "mha_kernel=1,mqa_kernel=1";
  }
  return v;
}

// The attention_mqa versions the default does not pick: the suites above run version 3 on an H200 (wgmma and TMA);
// version 2 (mqa_kernel=2, mma.sync) runs every absorbed case of them without DSA (page boundaries, ragged
// contexts, an empty context, empty and many splits, s_q 1 and 2, tp 1, 2 and 8, three stacked layers), plus
// DeepSeek-V3 dims at s_q 4 with 16 heads a rank (tp 8: one full 64-row block of version 3) and one sequence over
// many splits — which the default runs too (MqaDefault).
inline std::vector<Case> mqa_extra_cases() {
  return {make_case("dsv3_decode_sq4_tp8", "deepseek-v3", kDecode, kAbsorbed, 8, 4, 2, {1000, 63}),
          make_case("dsv3_decode_sq1_splits_tp1", "deepseek-v3", kDecode, kAbsorbed, 1, 1, 1, {3001})};
}
inline std::vector<Case> mqa_version_cases() {
  std::vector<Case> v;
  for (const auto& list : {tiny_cases(), long_cases(), big_cases()})
    for (auto c : list)
      if (c.form == kAbsorbed && c.model != "glm-5" && c.model != "tiny-dsa") v.push_back(c);
  for (auto c : mqa_extra_cases()) v.push_back(c);
  for (auto& c : v) {
    c.name = "mqa2_" + c.name;
    c.engine_options = "mqa_kernel=2";
  }
  return v;
}

inline std::string case_name(const testing::TestParamInfo<Case>& info) { return info.param.name; }

}  // namespace mla::gputest
