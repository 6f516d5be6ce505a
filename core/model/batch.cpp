// Token layout and block table of a step.
#include "core/model/batch.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "core/model/errors.h"

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

namespace {
// A JSON integer within T's range; nlohmann would convert 1e20 or 2.5 to an int without a word (1e20: undefined
// behaviour). A uint64 takes a negative integer's 64 bits (seeds written as signed).
template <class T> T integer_value(const nlohmann::json& v, const char* key) {
  using L = std::numeric_limits<T>;
  const auto bad = [&] {
    return UsageError(std::string("run options: '") + key + "' must be an integer from " + std::to_string(L::min()) +
                      " to " + std::to_string(L::max()) + ", got " + v.dump());
  };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(L::max())) throw bad();
    return static_cast<T>(u);
  }
  if (!v.is_number_integer()) throw bad();
  const int64_t i = v.get<int64_t>();
  if constexpr (L::is_signed) {
    if (i < static_cast<int64_t>(L::min()) || i > static_cast<int64_t>(L::max())) throw bad();
  }
  return static_cast<T>(i);
}

template <class T> T integer_field(const nlohmann::json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  return it == j.end() ? fallback : integer_value<T>(*it, key);
}
}  // namespace

RunSpec run_spec_from_json(const nlohmann::json& j) {
  RunSpec s;
  if (!j.is_object()) throw UsageError("run options are not a JSON object: " + j.dump());
  try {
    if (j.contains("mode")) s.mode = parse_mode(j.at("mode").get<std::string>());
    s.form = j.contains("form") ? parse_form(j.at("form").get<std::string>()) : default_form(s.mode);
    s.tp = integer_field(j, "tp", s.tp);
    s.layers = integer_field(j, "layers", s.layers);
    s.tokens = integer_field(j, "tokens", s.tokens);
    s.batch = integer_field(j, "batch", s.batch);
    if (const auto it = j.find("context"); it != j.end()) {
      if (!it->is_array()) throw UsageError("run options: 'context' must be an array of integers, got " + it->dump());
      s.context.clear();
      for (const auto& c : *it) s.context.push_back(integer_value<int>(c, "context"));
    }
    s.seed = integer_field(j, "seed", s.seed);
    s.position_offset = integer_field(j, "position_offset", s.position_offset);
    s.input_norm = j.value("input_norm", s.input_norm);
    s.keys = integer_field(j, "keys", s.keys);
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
