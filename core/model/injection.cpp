// Injection parsing and the zoo table (docs/bugs.md).
#include "core/model/injection.h"

#include <algorithm>
#include <climits>

#include "core/model/errors.h"
#include "core/model/stage_graph.h"

namespace mla {

const std::vector<ZooEntry>& bug_zoo() {
  static const std::vector<ZooEntry> zoo = {
      {"rope-neox", {"q_pe_rope", "k_pe_rope"}, "token 0 exact; error only in rope channels, grows with position"},
      {"rope-mscale", {"q_pe_rope", "k_pe_rope"}, "pure scale: cosine ~ 1, norm ratio ~ get_mscale(s, mscale)"},
      {"position-offset", {"q_pe_rope", "k_pe_rope"}, "every token off, token 0 too"},
      {"softmax-scale", {"attn_out", "lse", "attn_latent"}, "token 0 exact (causal), others off"},
      {"causal-off", {"attn_out", "lse"}, "last token exact, earlier tokens off", "prefill", "mha"},
      {"kv-b-split", {"k_nope", "v"}, "every head off; norms plausible, sketches differ (layout)", "", "mha"},
      {"kv-norm-skip", {"kv_c_norm"}, "content kept, scale per token off"},
      {"q-norm-eps", {}, "benign: must not be flagged at bf16 tolerance"},
      {"tp-head-offset", {"q_nope", "q_pe"}, "only the heads of ranks >= 1", "", "", 2},
      {"allreduce-skip", {"o"}, "o_partial agrees on every rank, o does not", "", "", 2},
      {"wuk-transpose", {"q_latent"}, "every head off; absorbed form only", "", "absorbed"},
      {"lse-base2", {"attn_out", "lse"}, "only tokens with cached context", "chunked", "mha"},
      {"page-off-by-one", {"attn_latent", "lse"}, "only sequences longer than one page (64)", "decode", "absorbed"},
      {"decode-empty-cache", {"attn_latent", "lse", "attn_out"}, "every token off; the step's cache rows unseen", "",
       "absorbed"},
      {"residual-drop", {"h_out"}, "h_out = o: the residual add forgotten (a residual stage: layers >= 2)"},
      {"kv-norm-no-weight", {"kv_c_norm"}, "per-channel factors 1/weight, constant over tokens"},
      {"q-norm-width", {"q_c"}, "content kept, scale per token off (mean square over kv_lora_rank lanes)", "", "", 1,
       false, false, true},
      {"o-proj-half-heads", {"o_partial"}, "the reference minus half the heads' terms (energy ~1/2)"},
      {"v-up-head", {"attn_out"}, "a single head (the last) off, norms plausible", "", "absorbed"},
      {"sliding-window", {"attn_out", "lse"}, "error from position 16 on (each token sees its last 16 keys)", "prefill",
       "mha"},
      {"kv-a-rows-tile", {"kv_c", "k_pe"}, "token rows from T / 32 * 32 on exact zeros (never written)"},
      {"kv-norm-weight-wrap", {"kv_c_norm"}, "channels L/2..L-1 off, each by its own factor; the first half exact"},
      // Planted in every projection weight of the run's format: the first projection diverges (q_a_proj,
      // or q_proj without q LoRA).
      {"fp8-scale-transpose", {"q_a", "q_nope", "q_pe"}, "blocks off, block-shaped error (128x128)", "", "", 1, true},
      {"nvfp4-nibble-swap", {"q_a", "q_nope", "q_pe"}, "content off, norms similar", "", "", 1, true},
      {"nvfp4-global-recip", {"q_a", "q_nope", "q_pe"}, "pure scale", "", "", 1, true},
      // DSA's indexer and selection (models with index_topk).
      {"index-rope-layout", {"idx_q"}, "the indexer's rope lanes paired as the other DSA model's; token 0 exact", "",
       "", 1, false, true},
      {"index-k-norm-skip", {"idx_k"}, "the indexer's keys without their LayerNorm", "", "", 1, false, true},
      {"index-weights-skip", {"idx_scores"}, "scores summed over heads without their weights", "", "", 1, false, true},
      {"index-causal-leak", {"idx_scores"}, "scores of keys a token cannot see; selects future keys", "prefill", "", 1,
       false, true},
      {"topk-off-by-one", {"topk"}, "one key fewer than index_topk selected; scores right", "", "", 1, false, true},
  };
  return zoo;
}

const ZooEntry* find_zoo_entry(const std::string& name) {
  for (auto& e : bug_zoo())
    if (e.name == name) return &e;
  return nullptr;
}

namespace {
// `text` as a whole integer (nothing after it), else a UsageError for the injection `item` saying `what` it must be.
int64_t whole_number(const std::string& text, const std::string& item, const std::string& what) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError("--inject " + item + ": " + what);
}

// A UsageError for the injection `item` unless `stage` names a stage.
void check_stage(const std::string& stage, const std::string& item) {
  try {
    parse_stage(stage);
  } catch (const UsageError& e) {
    throw UsageError("--inject " + item + ": " + e.what());
  }
}
}  // namespace

std::vector<Injection> parse_injections(const std::string& text) {
  std::vector<Injection> out;
  size_t pos = 0;
  while (pos < text.size()) {
    auto comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() : comma + 1;
    if (item.empty()) continue;
    Injection inj;
    inj.text = item;
    const auto colon = item.find(':');
    inj.name = item.substr(0, colon);
    std::string arg = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (const auto at = arg.rfind('@'); at != std::string::npos) {
      try {
        inj.rank = std::stoi(arg.substr(at + 1));
      } catch (const std::exception&) {
        throw UsageError("--inject " + item + ": '@" + arg.substr(at + 1) + "' is not a rank number");
      }
      if (inj.rank < 0) throw UsageError("--inject " + item + ": the rank after '@' must be >= 0");
      arg = arg.substr(0, at);
    }
    if (inj.name == "nan-at") {
      const auto c2 = arg.find(':');
      if (c2 == std::string::npos || c2 == 0)
        throw UsageError("--inject " + item + ": expected nan-at:PROBE:INDEX[@rank]");
      inj.target = arg.substr(0, c2);
      try {
        inj.index = std::stoll(arg.substr(c2 + 1));
      } catch (const std::exception&) {
        throw UsageError("--inject " + item + ": INDEX must be an integer");
      }
      if (inj.index < 0) throw UsageError("--inject " + item + ": INDEX must be >= 0");
      // Every probe name of either attention form, with and without q LoRA and input norm.
      static const std::vector<std::string> probes = {"h", "x", "q_a", "q_c", "q_nope", "q_pe", "kv_c", "k_pe",
                                                      "kv_c_norm", "q_pe_rope", "k_pe_rope", "kv_cache", "k_nope",
                                                      "v", "attn_out", "lse", "q_latent", "attn_latent", "o_partial",
                                                      "o", "h_out"};
      if (std::find(probes.begin(), probes.end(), inj.target) == probes.end()) {
        std::string names;
        for (const auto& n : probes) names += " " + n;
        throw UsageError("--inject " + item + ": '" + inj.target + "' is not a probe (probes:" + names + ")");
      }
    } else if (inj.name == "hang-at" || inj.name == "crash-at" || inj.name == "fault-at") {
      const bool fault = inj.name == "fault-at";
      if (arg.empty())
        throw UsageError("--inject " + item + ": expected " + inj.name + (fault ? ":STAGE[:LAYER]" : ":STAGE") +
                         "[@rank]");
      if (const auto c2 = arg.find(':'); fault && c2 != std::string::npos) {
        const int64_t layer = whole_number(arg.substr(c2 + 1), item, "LAYER must be a layer number");
        if (layer < 0) throw UsageError("--inject " + item + ": LAYER must be >= 0");
        if (layer > INT_MAX) throw UsageError("--inject " + item + ": LAYER must be a layer number");
        inj.layer = static_cast<int>(layer);
        arg = arg.substr(0, c2);
      }
      inj.target = arg;
      check_stage(arg, item);
    } else if (inj.name == "slow-at") {
      const auto c2 = arg.find(':');
      if (c2 == std::string::npos || c2 == 0)
        throw UsageError("--inject " + item + ": expected slow-at:STAGE:MS[@rank] (STAGE * for every stage)");
      inj.target = arg.substr(0, c2);
      inj.ms = whole_number(arg.substr(c2 + 1), item, "MS must be an integer (milliseconds)");
      if (inj.ms < 0 || inj.ms > 3600000)
        throw UsageError("--inject " + item + ": MS must be 0 .. 3600000 (an hour)");
      if (inj.target != "*") check_stage(inj.target, item);
    } else if (!find_zoo_entry(inj.name)) {
      std::string names;
      for (auto& e : bug_zoo()) names += " " + e.name;
      throw UsageError("unknown injection '" + inj.name + "' (known:" + names +
                       " nan-at:PROBE:INDEX hang-at:STAGE[@rank] crash-at:STAGE[@rank] fault-at:STAGE[:LAYER][@rank] "
                       "slow-at:STAGE:MS[@rank])");
    } else if (!arg.empty()) {
      throw UsageError("--inject " + item + ": '" + inj.name + "' takes no argument");
    }
    out.push_back(inj);
  }
  if (out.empty() && !text.empty()) throw UsageError("--inject '" + text + "': no injection named (NAME[,NAME...])");
  return out;
}

bool is_weight_injection(const Injection& inj) {
  const ZooEntry* z = find_zoo_entry(inj.name);
  return z && z->needs_quantized;
}

std::vector<Injection> engine_injections(const std::vector<Injection>& list) {
  std::vector<Injection> out;
  for (const auto& i : list)
    if (!is_weight_injection(i)) out.push_back(i);
  return out;
}

bool has_injection(const std::vector<Injection>& list, const std::string& name) {
  return find_injection(list, name) != nullptr;
}

const Injection* find_injection(const std::vector<Injection>& list, const std::string& name) {
  for (auto& i : list)
    if (i.name == name) return &i;
  return nullptr;
}

}  // namespace mla
