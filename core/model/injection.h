// The bug zoo (docs/bugs.md): named injections an engine can plant in its own computation, and what the harness
// is expected to find for each. Only the zoo's scorer reads the expectations; localization never does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mla {

struct Injection {
  std::string name;    // e.g. "rope-neox", "nan-at", "hang-at"
  std::string target;  // probe (nan-at) or stage (hang-at, crash-at, fault-at, slow-at; slow-at also "*")
  int64_t index = 0;   // nan-at: flat index into the rank's local tensor
  int64_t ms = 0;      // slow-at: milliseconds of sleep at the stage's entry
  int rank = -1;       // @rank; -1 = every rank (nan-at: rank 0)
  int layer = -1;      // fault-at: the layer it acts in; -1 = the first to reach the stage (the fault ends the run)
  std::string text;    // as given
};

// "rope-neox,nan-at:q_c:17,hang-at:rope@1" -> injections; throws UsageError for unknown names or bad syntax.
std::vector<Injection> parse_injections(const std::string& text);
bool has_injection(const std::vector<Injection>& list, const std::string& name);
const Injection* find_injection(const std::vector<Injection>& list, const std::string& name);

// kv-a-rows-tile: the row tile kv_a_proj is wrongly launched over whole tiles of (the zoo runs it at 40 tokens: rows
// 32..39 never written).
constexpr int64_t kRowsTileBug = 32;

struct ZooEntry {
  std::string name;
  std::vector<std::string> expected;  // probes where the first divergence may be found ({} = benign)
  std::string pattern;                // the symptom, for the zoo table
  std::string mode;                   // "" any, or the mode it needs (decode, chunked)
  std::string form;                   // "" any, or the attention form it needs
  int min_tp = 1;                     // 2 for sharding bugs
  bool needs_quantized = false;       // needs --weight-format (a weight injection)
  bool needs_dsa = false;             // a bug of DSA's indexer: needs a model with index_topk (the zoo: tiny-dsa)
  bool needs_q_lora = false;          // planted in the q LoRA's norm: needs a model with q_lora_rank
};
const std::vector<ZooEntry>& bug_zoo();

// sliding-window: the window (keys) a sliding-window flag left on masks to; both engines plant this one.
constexpr int kSlidingWindowBug = 16;
const ZooEntry* find_zoo_entry(const std::string& name);

// Weight injections (needs_quantized: fp8-scale-transpose, nvfp4-*) are planted by the weight loader as a
// wrong dequantization (core/weights/loader.h), so every engine gets them through its weights; engines
// are given the others only.
bool is_weight_injection(const Injection& inj);
std::vector<Injection> engine_injections(const std::vector<Injection>& list);

}  // namespace mla
