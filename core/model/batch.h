// A step's token layout and paged latent cache: sequences concatenated, each with its cached
// context and its new tokens; cache pages of 64 rows [kv_c_norm (L) | k_pe_rope (R)] reached through a block table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/model/config.h"
#include "core/model/stage_graph.h"
#include "core/model/tensor.h"

namespace mla {

constexpr int kPageSize = 64;

struct Batch {
  std::vector<int> new_lens;      // [B] new tokens (s_q) per sequence
  std::vector<int> context_lens;  // [B] cached tokens before this step
  std::vector<int> positions;     // [T] position of each new token
  std::vector<int> token_seq;     // [T] sequence of each new token
  std::vector<int> block_table;   // [B, max_blocks] page ids, row-major; unused slots point to a spare page
  int max_blocks = 0;
  int num_blocks = 0;

  int num_seqs() const { return static_cast<int>(new_lens.size()); }
  int tokens() const { return static_cast<int>(positions.size()); }
  int first_token(int b) const;  // index of sequence b's first new token
  // Row of the cache holding sequence b's token at `pos`: {page, slot}.
  int page(int b, int pos) const { return block_table[b * max_blocks + pos / kPageSize]; }
  // The keys new token t sees (causal): its sequence's cached tokens and its new tokens up to t itself, numbered
  // 0 .. keys_seen(t) − 1 in cache order.
  int keys_seen(int t) const { return context_lens[token_seq[t]] + (t - first_token(token_seq[t])) + 1; }
  int longest_context() const;  // the most cached tokens one sequence holds before the step
};

// What a run is: mode, form, sizes. `tokens` is new tokens per sequence.
struct RunSpec {
  Mode mode = Mode::Mode_prefill;
  AttentionForm form = AttentionForm::AttentionForm_mha;
  int tp = 1;
  int layers = 1;
  int tokens = 16;
  int batch = 1;
  std::vector<int> context;  // per sequence (one value: the same for all); empty: 0
  uint64_t seed = 0;
  int position_offset = 0;   // first position of a prefill
  bool input_norm = false;   // layers start at h with input_layernorm (always when layers > 1)
  // DSA's idx_scores width where `context` does not give it: a step whose sequences differ in new tokens runs as
  // batch 1 of their T tokens with no context of its own, its real layout (contexts included) in the dump's /inputs;
  // its width is then the inputs' longest context plus T. 0: the longest `context` plus tokens.
  int keys = 0;

  GraphShape graph_shape() const;
  void validate(const MlaConfig& cfg) const;  // throws UsageError
};

// RunSpec as JSON (a dump's run_options): {"mode", "form", "tp", "layers", "tokens", "batch", "context",
// "seed", "position_offset", "input_norm"}, and "keys" where set. from_json ignores other keys and throws UsageError on a bad value.
nlohmann::json run_spec_to_json(const RunSpec& spec);
RunSpec run_spec_from_json(const nlohmann::json& j);

// Builds positions and a shuffled block table (seeded) so pages are never contiguous by accident.
Batch make_batch(const RunSpec& spec);

}  // namespace mla
