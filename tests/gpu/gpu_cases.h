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

inline std::string case_name(const testing::TestParamInfo<Case>& info) { return info.param.name; }

}  // namespace mla::gputest
