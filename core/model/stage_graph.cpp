// Builds the per-layer stage list and probe table from the config and the run's shape.
#include "core/model/stage_graph.h"

#include <algorithm>

#include "core/model/errors.h"

namespace mla {

namespace {
struct StageName {
  Stage stage;
  const char* name;
};
constexpr StageName kStageNames[] = {
    {Stage::Stage_layer_input, "layer_input"}, {Stage::Stage_input_norm, "input_norm"},
    {Stage::Stage_q_a_proj, "q_a_proj"},       {Stage::Stage_q_a_norm, "q_a_norm"},
    {Stage::Stage_q_b_proj, "q_b_proj"},       {Stage::Stage_q_proj, "q_proj"},
    {Stage::Stage_kv_a_proj, "kv_a_proj"},     {Stage::Stage_kv_a_norm, "kv_a_norm"},
    {Stage::Stage_rope, "rope"},               {Stage::Stage_cache_write, "cache_write"},
    {Stage::Stage_indexer_q, "indexer_q"},     {Stage::Stage_indexer_k, "indexer_k"},
    {Stage::Stage_indexer_weights, "indexer_weights"}, {Stage::Stage_index_scores, "index_scores"},
    {Stage::Stage_topk, "topk"},
    {Stage::Stage_kv_b_proj, "kv_b_proj"},     {Stage::Stage_attention_mha, "attention_mha"},
    {Stage::Stage_q_absorb, "q_absorb"},       {Stage::Stage_attention_mqa, "attention_mqa"},
    {Stage::Stage_v_up, "v_up"},               {Stage::Stage_o_proj, "o_proj"},
    {Stage::Stage_all_reduce, "all_reduce"},   {Stage::Stage_residual, "residual"},
};
}  // namespace

const char* stage_name(Stage s) {
  for (auto& e : kStageNames)
    if (e.stage == s) return e.name;
  return "?";
}

Stage parse_stage(const std::string& name) {
  for (auto& e : kStageNames)
    if (name == e.name) return e.stage;
  throw UsageError("unknown stage '" + name + "'");
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Mode_prefill: return "prefill";
    case Mode::Mode_decode: return "decode";
    case Mode::Mode_chunked: return "chunked";
  }
  return "?";
}

Mode parse_mode(const std::string& s) {
  if (s == "prefill") return Mode::Mode_prefill;
  if (s == "decode") return Mode::Mode_decode;
  if (s == "chunked") return Mode::Mode_chunked;
  throw UsageError("unknown mode '" + s + "' (expected prefill, decode or chunked)");
}

const char* form_name(AttentionForm f) { return f == AttentionForm::AttentionForm_mha ? "mha" : "absorbed"; }

AttentionForm parse_form(const std::string& s) {
  if (s == "mha") return AttentionForm::AttentionForm_mha;
  if (s == "absorbed" || s == "mqa") return AttentionForm::AttentionForm_absorbed;
  throw UsageError("unknown attention form '" + s + "' (expected mha or absorbed)");
}

const char* contract_name(Contract c) {
  switch (c) {
    case Contract::Contract_replicated: return "replicated";
    case Contract::Contract_heads: return "heads";
    case Contract::Contract_partial: return "partial";
    case Contract::Contract_rows: return "rows";
    case Contract::Contract_columns: return "columns";
  }
  return "?";
}

AttentionForm default_form(Mode m) {
  return m == Mode::Mode_decode ? AttentionForm::AttentionForm_absorbed : AttentionForm::AttentionForm_mha;
}

const ProbeSpec* StageGraph::find(const std::string& name) const {
  for (auto& p : probes)
    if (p.name == name) return &p;
  return nullptr;
}

const StageSpec* StageGraph::find_stage(Stage s) const {
  for (auto& st : stages)
    if (st.stage == s) return &st;
  return nullptr;
}

StageGraph build_graph(const MlaConfig& c, const GraphShape& g) {
  const int64_t T = g.tokens, H = c.hidden, N = c.heads, Lq = c.q_lora_rank, L = c.kv_lora_rank;
  const int64_t P = c.qk_nope, R = c.qk_rope, V = c.v_head;
  StageGraph G;
  auto stage = [&](Stage s, std::vector<std::string> in, std::vector<std::string> out) {
    G.stages.push_back({s, std::move(in), std::move(out)});
  };
  auto probe = [&](std::string name, Stage s, Contract ct, std::vector<int64_t> shape, int heads_axis = -1,
                   int rope_from = -1) {
    ProbeSpec p{std::move(name), s, ct, std::move(shape), heads_axis, rope_from, static_cast<int>(G.probes.size())};
    G.probes.push_back(std::move(p));
  };
  using S = Stage;
  const auto rep = Contract::Contract_replicated, hd = Contract::Contract_heads;

  if (g.input_norm) {
    stage(S::Stage_layer_input, {}, {"h"});
    probe("h", S::Stage_layer_input, rep, {T, H});
    stage(S::Stage_input_norm, {"h"}, {"x"});
    probe("x", S::Stage_input_norm, rep, {T, H});
  } else {
    stage(S::Stage_layer_input, {}, {"x"});
    probe("x", S::Stage_layer_input, rep, {T, H});
  }
  if (c.has_q_lora()) {
    stage(S::Stage_q_a_proj, {"x"}, {"q_a"});
    probe("q_a", S::Stage_q_a_proj, rep, {T, Lq});
    stage(S::Stage_q_a_norm, {"q_a"}, {"q_c"});
    probe("q_c", S::Stage_q_a_norm, rep, {T, Lq});
    stage(S::Stage_q_b_proj, {"q_c"}, {"q_nope", "q_pe"});
    probe("q_nope", S::Stage_q_b_proj, hd, {T, N, P}, 1);
    probe("q_pe", S::Stage_q_b_proj, hd, {T, N, R}, 1, 0);
  } else {
    stage(S::Stage_q_proj, {"x"}, {"q_nope", "q_pe"});
    probe("q_nope", S::Stage_q_proj, hd, {T, N, P}, 1);
    probe("q_pe", S::Stage_q_proj, hd, {T, N, R}, 1, 0);
  }
  stage(S::Stage_kv_a_proj, {"x"}, {"kv_c", "k_pe"});
  probe("kv_c", S::Stage_kv_a_proj, rep, {T, L});
  probe("k_pe", S::Stage_kv_a_proj, rep, {T, R}, -1, 0);
  stage(S::Stage_kv_a_norm, {"kv_c"}, {"kv_c_norm"});
  probe("kv_c_norm", S::Stage_kv_a_norm, rep, {T, L});
  stage(S::Stage_rope, {"q_pe", "k_pe"}, {"q_pe_rope", "k_pe_rope"});
  probe("q_pe_rope", S::Stage_rope, hd, {T, N, R}, 1, 0);
  probe("k_pe_rope", S::Stage_rope, rep, {T, R}, -1, 0);
  stage(S::Stage_cache_write, {"kv_c_norm", "k_pe_rope"}, {"kv_cache"});
  probe("kv_cache", S::Stage_cache_write, rep, {T, L + R}, -1, static_cast<int>(L));
  // DSA: every rank runs the whole indexer (its weights are replicated). Key s of a token's sequence is its cached
  // token s, or new token s − context; idx_scores holds 0 for the keys a token does not see, topk the selected keys
  // in ascending order, −1 past the last when a token sees fewer than index_topk.
  std::vector<std::string> selected;
  if (c.has_dsa()) {
    const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
    stage(S::Stage_indexer_q, {"q_c"}, {"idx_q"});
    probe("idx_q", S::Stage_indexer_q, rep, {T, Hi, Di}, 1);
    stage(S::Stage_indexer_k, {"x"}, {"idx_k"});
    probe("idx_k", S::Stage_indexer_k, rep, {T, Di});
    stage(S::Stage_indexer_weights, {"x"}, {"idx_weights"});
    probe("idx_weights", S::Stage_indexer_weights, rep, {T, Hi}, 1);
    stage(S::Stage_index_scores, {"idx_q", "idx_k", "idx_weights"}, {"idx_scores"});
    probe("idx_scores", S::Stage_index_scores, rep, {T, std::max<int64_t>(g.keys, 1)});
    stage(S::Stage_topk, {"idx_scores"}, {"topk"});
    probe("topk", S::Stage_topk, rep, {T, c.index_topk});
    selected = {"topk"};
  }
  auto with_selection = [&](std::vector<std::string> in) {
    in.insert(in.end(), selected.begin(), selected.end());
    return in;
  };
  if (g.form == AttentionForm::AttentionForm_mha) {
    stage(S::Stage_kv_b_proj, {"kv_c_norm"}, {"k_nope", "v"});
    probe("k_nope", S::Stage_kv_b_proj, hd, {T, N, P}, 1);
    probe("v", S::Stage_kv_b_proj, hd, {T, N, V}, 1);
    stage(S::Stage_attention_mha, with_selection({"q_nope", "q_pe_rope", "k_nope", "k_pe_rope", "v"}),
          {"attn_out", "lse"});
    probe("attn_out", S::Stage_attention_mha, hd, {T, N, V}, 1);
    probe("lse", S::Stage_attention_mha, hd, {T, N}, 1);
  } else {
    stage(S::Stage_q_absorb, {"q_nope"}, {"q_latent"});
    probe("q_latent", S::Stage_q_absorb, hd, {T, N, L}, 1);
    stage(S::Stage_attention_mqa, with_selection({"q_latent", "q_pe_rope"}), {"attn_latent", "lse"});
    probe("attn_latent", S::Stage_attention_mqa, hd, {T, N, L}, 1);
    probe("lse", S::Stage_attention_mqa, hd, {T, N}, 1);
    stage(S::Stage_v_up, {"attn_latent"}, {"attn_out"});
    probe("attn_out", S::Stage_v_up, hd, {T, N, V}, 1);
  }
  stage(S::Stage_o_proj, {"attn_out"}, {"o_partial"});
  probe("o_partial", S::Stage_o_proj, Contract::Contract_partial, {T, H});
  stage(S::Stage_all_reduce, {"o_partial"}, {"o"});
  probe("o", S::Stage_all_reduce, rep, {T, H});
  if (g.input_norm) {
    stage(S::Stage_residual, {"h", "o"}, {"h_out"});
    probe("h_out", S::Stage_residual, rep, {T, H});
  }
  return G;
}

std::vector<ProbeSpec> build_weights(const MlaConfig& c, const GraphShape& g) {
  const int64_t H = c.hidden, N = c.heads, Lq = c.q_lora_rank, L = c.kv_lora_rank, R = c.qk_rope, P = c.qk_nope,
                V = c.v_head;
  std::vector<ProbeSpec> w;
  auto weight = [&](std::string name, Stage s, Contract ct, std::vector<int64_t> shape) {
    w.push_back(ProbeSpec{std::move(name), s, ct, std::move(shape), -1, -1, static_cast<int>(w.size())});
  };
  using S = Stage;
  const auto rep = Contract::Contract_replicated;
  if (g.input_norm) weight("input_layernorm", S::Stage_input_norm, rep, {1, H});
  if (c.has_q_lora()) {
    weight("q_a_proj", S::Stage_q_a_proj, rep, {Lq, H});
    weight("q_a_layernorm", S::Stage_q_a_norm, rep, {1, Lq});
    weight("q_b_proj", S::Stage_q_b_proj, Contract::Contract_rows, {N * (P + R), Lq});
  } else {
    weight("q_proj", S::Stage_q_proj, Contract::Contract_rows, {N * (P + R), H});
  }
  weight("kv_a_proj_with_mqa", S::Stage_kv_a_proj, rep, {L + R, H});
  weight("kv_a_layernorm", S::Stage_kv_a_norm, rep, {1, L});
  weight("kv_b_proj", g.form == AttentionForm::AttentionForm_mha ? S::Stage_kv_b_proj : S::Stage_q_absorb,
         Contract::Contract_rows, {N * (P + V), L});
  weight("o_proj", S::Stage_o_proj, Contract::Contract_columns, {H, N * V});
  if (c.has_dsa()) {
    const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
    weight("indexer.wq_b", S::Stage_indexer_q, rep, {Hi * Di, Lq});
    weight("indexer.wk", S::Stage_indexer_k, rep, {Di, H});
    weight("indexer.k_norm", S::Stage_indexer_k, rep, {1, Di});
    weight("indexer.k_norm_bias", S::Stage_indexer_k, rep, {1, Di});
    weight("indexer.weights_proj", S::Stage_indexer_weights, rep, {Hi, H});
  }
  return w;
}

std::vector<int64_t> local_shape(const ProbeSpec& p, int tp) {
  auto s = p.shape;
  if (p.contract == Contract::Contract_heads && p.heads_axis >= 0) s[p.heads_axis] /= tp;
  if (p.contract == Contract::Contract_rows && !s.empty()) s[0] /= tp;
  if (p.contract == Contract::Contract_columns && s.size() > 1) s[1] /= tp;
  return s;
}

}  // namespace mla
