// The stage graph (docs/architecture.md) as data: stages in order, the probes each writes, their global shapes
// and how tensor-parallel ranks hold them. Runner, dumps, compare and reports all read this table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/config.h"

namespace mla {

enum class Mode { Mode_prefill, Mode_decode, Mode_chunked };
enum class AttentionForm { AttentionForm_mha, AttentionForm_absorbed };
// How ranks hold a probe: the same on every rank, a block of heads each, or a partial sum. Weights (build_weights)
// are held whole (replicated), as a block of rows each (column-parallel q_b_proj, kv_b_proj) or as a block of
// columns each (row-parallel o_proj).
enum class Contract { Contract_replicated, Contract_heads, Contract_partial, Contract_rows, Contract_columns };

enum class Stage {
  Stage_layer_input,  // h (or x) enters the layer
  Stage_input_norm,   // x = RMSNorm(h; input_layernorm)
  Stage_q_a_proj,
  Stage_q_a_norm,
  Stage_q_b_proj,
  Stage_q_proj,  // no q LoRA
  Stage_kv_a_proj,
  Stage_kv_a_norm,
  Stage_rope,
  Stage_cache_write,  // [kv_c_norm | k_pe_rope] rows into the paged latent cache
  // DSA (configs with index_topk): the lightning indexer, its scores and the keys it selects (docs/mla.md)
  Stage_indexer_q,        // idx_q from q_c
  Stage_indexer_k,        // idx_k from x, its rows written into the paged index cache
  Stage_indexer_weights,  // idx_weights from x
  Stage_index_scores,     // idx_scores of every key each token sees
  Stage_topk,             // the index_topk keys of highest score; attention then reads only those
  Stage_kv_b_proj,    // MHA form
  Stage_attention_mha,
  Stage_q_absorb,  // absorbed form
  Stage_attention_mqa,
  Stage_v_up,
  Stage_o_proj,
  Stage_all_reduce,
  Stage_residual,
};

const char* stage_name(Stage s);
Stage parse_stage(const std::string& name);  // throws UsageError
const char* mode_name(Mode m);
Mode parse_mode(const std::string& s);
const char* form_name(AttentionForm f);
AttentionForm parse_form(const std::string& s);
const char* contract_name(Contract c);
AttentionForm default_form(Mode m);  // prefill, chunked: mha; decode: absorbed (as vLLM routes them)

struct ProbeSpec {
  std::string name;
  Stage stage;                 // the stage that writes it
  Contract contract;
  std::vector<int64_t> shape;  // global (unsharded)
  int heads_axis = -1;         // axis of heads (Contract_heads and per-head maps), -1 if none
  int rope_from = -1;          // channels >= rope_from of the last axis are rope lanes (-1: none)
  int order = 0;               // global position in the graph (per layer), set by build_graph
};

struct StageSpec {
  Stage stage;
  std::vector<std::string> inputs;   // tensor names read (probes of earlier stages or inputs)
  std::vector<std::string> outputs;  // probe names written
};

struct GraphShape {
  int64_t tokens = 0;         // T: new tokens in this step, over all sequences
  Mode mode = Mode::Mode_prefill;
  AttentionForm form = AttentionForm::AttentionForm_mha;
  bool input_norm = false;    // the layer starts at h (stacked layers, real checkpoints)
  int64_t keys = 0;           // DSA: the most keys one token's sequence holds (its context + new tokens)
};

struct StageGraph {
  std::vector<StageSpec> stages;  // in execution order, for one layer
  std::vector<ProbeSpec> probes;  // in graph order
  const ProbeSpec* find(const std::string& name) const;
  const StageSpec* find_stage(Stage s) const;
};

StageGraph build_graph(const MlaConfig& cfg, const GraphShape& g);

// The weights a layer computes with, one spec each, named as checkpoints name them (input_layernorm, q_a_proj,
// q_a_layernorm, q_b_proj or q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj), in the order the
// stages use them. Shapes are the checkpoint's [out, in]; a norm's weight is one row [1, D]. `stage` is the first
// stage that reads it (kv_b_proj: kv_b_proj in the MHA form, q_absorb in the absorbed form).
std::vector<ProbeSpec> build_weights(const MlaConfig& cfg, const GraphShape& g);

// Rank r's slice of a global probe shape: heads axis divided by tp (weights: rows or columns), everything else whole.
std::vector<int64_t> local_shape(const ProbeSpec& p, int tp);

}  // namespace mla
