// Token layout and block table of a step.
#include "harness/model/batch.h"

#include <algorithm>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "harness/model/errors.h"

namespace mla {

int Batch::first_token(int b) const {
  int t = 0;
  for (int i = 0; i < b; ++i) t += new_lens[i];
  return t;
}

int Batch::longest_context() const {
  int most = 0;
  for (int c : context_lens) most = std::max(most, c);
  return most;
}

GraphShape RunSpec::graph_shape() const {
  GraphShape g;
  g.tokens = static_cast<int64_t>(tokens) * batch;
  g.mode = mode;
  g.form = form;
  g.input_norm = input_norm || layers > 1;
  const int longest_context = context.empty() ? 0 : *std::max_element(context.begin(), context.end());
  g.keys = keys > 0 ? keys : static_cast<int64_t>(longest_context) + tokens;
  return g;
}

void RunSpec::validate(const MlaConfig& cfg) const {
  cfg.validate_tp(tp);
  if (tokens <= 0) throw UsageError("--tokens must be positive, got " + std::to_string(tokens));
  if (batch <= 0) throw UsageError("--batch must be positive, got " + std::to_string(batch));
  if (layers <= 0) throw UsageError("--layers must be positive, got " + std::to_string(layers));
  if (position_offset < 0) throw UsageError("--position-offset must be >= 0");
  if (keys < 0) throw UsageError("run options: keys must be >= 0, got " + std::to_string(keys));
  if (!context.empty() && static_cast<int>(context.size()) != 1 && static_cast<int>(context.size()) != batch)
    throw UsageError("--context has " + std::to_string(context.size()) + " values for --batch " +
                     std::to_string(batch) + " (give one value, or one per sequence)");
  for (int c : context)
    if (c < 0) throw UsageError("--context values must be >= 0, got " + std::to_string(c));
  if (mode == Mode::Mode_prefill)
    for (int c : context)
      if (c != 0) throw UsageError("--context is for decode and chunked modes; prefill starts with an empty cache");
  if (static_cast<int64_t>(tokens) * batch > (1 << 22))
    throw UsageError("--tokens x --batch is larger than 4M tokens");
}

nlohmann::json run_spec_to_json(const RunSpec& spec) {
  nlohmann::json j = {{"mode", mode_name(spec.mode)},   {"form", form_name(spec.form)},
                      {"tp", spec.tp},                  {"layers", spec.layers},
                      {"tokens", spec.tokens},          {"batch", spec.batch},
                      {"context", spec.context},        {"seed", spec.seed},
                      {"position_offset", spec.position_offset}, {"input_norm", spec.input_norm}};
  if (spec.keys > 0) j["keys"] = spec.keys;
  return j;
}

RunSpec run_spec_from_json(const nlohmann::json& j) {
  RunSpec s;
  if (!j.is_object()) throw UsageError("run options are not a JSON object: " + j.dump());
  try {
    if (j.contains("mode")) s.mode = parse_mode(j.at("mode").get<std::string>());
    s.form = j.contains("form") ? parse_form(j.at("form").get<std::string>()) : default_form(s.mode);
    s.tp = j.value("tp", s.tp);
    s.layers = j.value("layers", s.layers);
    s.tokens = j.value("tokens", s.tokens);
    s.batch = j.value("batch", s.batch);
    s.context = j.value("context", s.context);
    s.seed = j.value("seed", s.seed);
    s.position_offset = j.value("position_offset", s.position_offset);
    s.input_norm = j.value("input_norm", s.input_norm);
    s.keys = j.value("keys", s.keys);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("run options: ") + e.what());
  }
  return s;
}

Batch make_batch(const RunSpec& spec) {
  Batch b;
  const int B = spec.batch;
  b.new_lens.assign(B, spec.tokens);
  b.context_lens.assign(B, 0);
  for (int i = 0; i < B; ++i)
    if (!spec.context.empty()) b.context_lens[i] = spec.context.size() == 1 ? spec.context[0] : spec.context[i];
  int total_pages = 0;
  for (int i = 0; i < B; ++i) {
    const int len = b.context_lens[i] + b.new_lens[i];
    b.max_blocks = std::max(b.max_blocks, (len + kPageSize - 1) / kPageSize);
    total_pages += (len + kPageSize - 1) / kPageSize;
  }
  b.max_blocks += 1;  // one spare slot per row: out-of-range reads land on a real (spare) page
  b.num_blocks = total_pages + 1;
  std::vector<int> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(spec.seed * 7919 + 17);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int spare = ids.back();
  b.block_table.assign(static_cast<size_t>(B) * b.max_blocks, spare);
  int next = 0;
  for (int i = 0; i < B; ++i) {
    const int len = b.context_lens[i] + b.new_lens[i];
    for (int j = 0; j < (len + kPageSize - 1) / kPageSize; ++j) b.block_table[i * b.max_blocks + j] = ids[next++];
    for (int t = 0; t < b.new_lens[i]; ++t) {
      b.positions.push_back(spec.mode == Mode::Mode_prefill ? spec.position_offset + t : b.context_lens[i] + t);
      b.token_seq.push_back(i);
    }
  }
  return b;
}

}  // namespace mla
