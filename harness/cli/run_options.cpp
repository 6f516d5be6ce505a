// Shared run options: parsing into RunSpec and ProbePlan.
#include "harness/cli/run_options.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <set>
#include <string>

#include "core/model/errors.h"
#include "harness/run/memory_estimate.h"
#include "core/weights/checkpoint_config.h"
#include "reference/cpu_threads.h"

namespace mla::cli {

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const auto next = s.find(sep, pos);
    const std::string item = s.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    if (!item.empty()) out.push_back(item);
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

CLI::Validator finite_number(double min, bool strict, const std::string& unit) {
  char bound[64];
  std::snprintf(bound, sizeof bound, "%s %g", strict ? ">" : ">=", min);
  const std::string want = std::string("a number ") + bound + (unit.empty() ? "" : " " + unit);
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        const char* b = v.c_str();
        char* end = nullptr;
        const double d = std::strtod(b, &end);
        if (v.empty() || end != b + v.size() || !std::isfinite(d) || (strict ? !(d > min) : !(d >= min)))
          return "must be " + want + ", got '" + v + "'";
        return "";
      },
      want, "finite");
}

CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        bool digits = !v.empty() && v.size() <= 20;
        for (char c : v) digits = digits && c >= '0' && c <= '9';
        if (digits && (v.size() < 20 || v <= "18446744073709551615")) return "";
        return "must be an integer from 0 to 18446744073709551615, got '" + v + "'";
      },
      "UINT64", "non-negative integer");
}

MlaConfig RunOptions::load_config() const {
  if (model_from_weights) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(weights, ec))
      throw UsageError("--weights '" + weights + "': no such file or directory (a checkpoint: a .gguf file, a "
                       ".safetensors file or a directory of them with config.json; or synthetic[:SEED])");
    if (fs::is_directory(weights, ec) && !fs::exists(fs::path(weights) / "config.json", ec))
      throw UsageError("--weights '" + weights + "': the directory has no config.json, which gives the model's "
                       "dimensions; put the checkpoint's HF config.json there, or pass --model PRESET|CONFIG.json");
  }
  return load_model_config(model);
}

void RunOptions::check_full_probes(const std::vector<StageGraph>& graphs) const {
  std::set<std::string> valid;
  std::vector<std::string> ordered;
  for (const auto& g : graphs)
    for (const auto& p : g.probes)
      if (valid.insert(p.name).second) ordered.push_back(p.name);
  // Weights too: all of them ("weights") or one by its checkpoint name.
  static const char* const weights[] = {"weights",        "input_layernorm",    "q_a_proj",       "q_a_layernorm",
                                        "q_b_proj",       "q_proj",             "kv_a_proj_with_mqa",
                                        "kv_a_layernorm", "kv_b_proj",          "o_proj"};
  for (const char* w : weights)
    if (valid.insert(w).second) ordered.push_back(w);
  for (const auto& n : split_list(full_probes)) {
    if (valid.count(n)) continue;
    std::string names;
    for (const auto& v : ordered) names += (names.empty() ? "" : ", ") + v;
    throw UsageError("--full-probes: '" + n + "' is not a probe of this run (mode " + mode + ", attention " +
                     (attention.empty() ? "default" : attention) + "); its probes: " + names);
  }
}

std::string check_run_memory(const MlaConfig& cfg, const RunSpec& spec, const ProbePlan& plan, const MemoryCheck& how) {
  MemoryEstimateInput in;
  in.cfg = &cfg;
  in.spec = &spec;
  in.plan = plan;
  in.dump = how.dump;
  in.engine = how.engine;
  in.quantized = how.quantized;
  in.per_process = how.local_rank >= 0;
  in.threads = how.engine == "reference" ? ref::set_eigen_threads() : 1;
  const MemoryEstimate host = estimate_host_memory(in);
  const MemoryAvailable have = available_host_memory();
  require_memory(host, have, "host memory");
  const std::string summary = memory_summary(host, have);
  if (!how.device) return summary;
  const Engine::DeviceMemory dm = how.device->device_memory(how.local_rank);
  if (dm.devices <= 0 || dm.free_bytes < 0) return summary;
  in.devices = dm.devices;
  require_memory(estimate_device_memory(in), {dm.free_bytes, "free on the GPU (cudaMemGetInfo)"},
                 "memory on each GPU (" + std::to_string(in.per_process ? 1 : (spec.tp + dm.devices - 1) / dm.devices) +
                     " of the " + std::to_string(spec.tp) + " ranks per GPU)");
  return summary;
}

void add_run_options(CLI::App& app, RunOptions& o) {
  app.add_option("--model", o.model, "Preset (deepseek-v2-lite, deepseek-v2, deepseek-v3, kimi-k2, glm-4.7-flash, "
                                      "glm-5, tiny, tiny-dsa) or a path to an HF config.json")->capture_default_str();
  app.add_option("--mode", o.mode, "prefill | decode | chunked")->capture_default_str();
  app.add_option("--attention", o.attention, "Attention form: mha (prefill form) or absorbed (MQA over the latent "
                                             "cache); default mha for prefill/chunked, absorbed for decode");
  // Omitted means the mode's default; 0 or less is refused, not read as "default" (a computed 0 in a script must
  // not silently run 64 tokens).
  app.add_option("--tokens", o.tokens, "New tokens per sequence, >= 1 (omitted: 64 prefill, 1 decode, 32 chunked)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              size_t used = 0;
              if (std::stoll(v, &used) >= 1 && used == v.size()) return "";
            } catch (const std::exception&) {
            }
            return "must be a positive number of tokens, got '" + v + "' (leave --tokens out for the mode's default)";
          },
          "POSITIVE", "positive"));
  app.add_option("--batch", o.batch, "Sequences in the step")->capture_default_str();
  app.add_option("--context", o.context, "Cached tokens per sequence before the step: one value or a comma list "
                                         "(default: 200 decode, 100 chunked, 0 prefill)");
  app.add_option("--tp", o.tp, "Tensor-parallel ranks (heads must divide)")->capture_default_str();
  app.add_option("--layers", o.layers, "Stacked layers (> 1: each starts at h with input_layernorm)")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the synthetic inputs (>= 0)")->capture_default_str()
      ->check(non_negative_integer());
  app.add_option("--weight-seed", o.weight_seed, "Seed of the synthetic weights (>= 0)")->capture_default_str()
      ->check(non_negative_integer());
  app.add_option("--probe-level", o.probe_level, "stats | sketch | full")->capture_default_str();
  app.add_option("--full-probes", o.full_probes, "Comma list of probes captured in full regardless of --probe-level ('weights': every weight, or a "
                 "weight's name, e.g. q_a_proj)");
  app.add_option("--weights", o.weights, "synthetic[:SEED], or a checkpoint: a .gguf file, a .safetensors file or a "
                                         "directory of them (config.json beside; sharded through "
                                         "model.safetensors.index.json). A checkpoint also gives the model config "
                                         "unless --model is given")
      ->capture_default_str();
  app.add_option("--weight-format", o.weight_format,
                 "Quantize the projection weights into this format and dequantize them for the reference: f32, f16, "
                 "bf16, fp8[:BLOCK], nvfp4, nvfp4-ct, mxfp4, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, "
                 "q6_k, gguf-mxfp4, gguf-nvfp4");
  app.add_option("--layer-range", o.layer_range, "Checkpoint layers A:B (A..B-1; sets --layers to B-A); only their "
                                                 "tensors are read");
  // After parsing: a checkpoint brings its config, and a layer range its layer count.
  app.parse_complete_callback([&app, &o] {
    o.model_from_weights = !app.count("--model") && !o.weight_spec().synthetic();
    if (o.model_from_weights) o.model = o.weights;
    if (!o.layer_range.empty()) {
      const LayerRange r = parse_layer_range(o.layer_range);
      if (app.count("--layers") && o.layers != r.count())
        throw UsageError("--layer-range " + o.layer_range + " holds " + std::to_string(r.count()) +
                         " layers but --layers is " + std::to_string(o.layers));
      o.layers = r.count();
    }
  });
}

void refuse_rank_options(CLI::App& app) {
  const std::string name = app.get_name();
  for (const char* opt : {"--rank", "--rendezvous"})
    app.add_option(opt)
        ->description("Not here: " + name + " runs every rank in its own child processes; for one process per rank "
                      "use `mla-bisect run --rank`")
        ->group("")  // hidden from --help
        ->each([name, opt](const std::string&) {
          throw UsageError(name + " " + opt + ": " + name + " starts its own runs, each with every rank in one "
                           "process. For one process per rank, launch `mla-bisect run --tp N --rank auto|R "
                           "--rendezvous PATH --out cand.h5` per rank (and the reference likewise, or in one "
                           "process), then `mla-bisect compare cand.h5 ref.h5`, which reads cand.rank0.h5 ... as "
                           "one dump");
        });
}

WeightSpec RunOptions::weight_spec() const {
  WeightSpec w;
  w.source = weights;
  w.format = weight_format;
  w.layer_range = layer_range;
  return w;
}

RunSpec RunOptions::to_spec() const {
  RunSpec s;
  s.mode = parse_mode(mode);
  s.form = attention.empty() ? default_form(s.mode) : parse_form(attention);
  s.tp = tp;
  s.layers = layers;
  s.batch = batch;
  s.seed = seed;
  s.tokens = tokens > 0 ? tokens
             : s.mode == Mode::Mode_prefill ? 64
             : s.mode == Mode::Mode_decode  ? 1
                                            : 32;
  if (tokens < 0) throw UsageError("--tokens must be a positive number of tokens, got " + std::to_string(tokens));
  if (!context.empty()) {
    const auto items = std::count(context.begin(), context.end(), ',') + 1;
    if (static_cast<size_t>(items) != split_list(context).size())
      throw UsageError("--context '" + context + "': an empty item; give one value for every sequence, or one value "
                       "for all (e.g. 200 or 40,200)");
  }
  for (const auto& c : split_list(context)) {
    try {
      size_t used = 0;
      const int v = std::stoi(c, &used);
      if (used != c.size()) throw std::invalid_argument(c);
      s.context.push_back(v);
    } catch (const std::exception&) {
      throw UsageError("--context: '" + c + "' is not an integer");
    }
    // Far beyond any model's context, and where the page arithmetic (int) would overflow.
    if (s.context.back() > (1 << 26))
      throw UsageError("--context: " + c + " cached tokens is more than the 67108864 a run may hold per sequence");
  }
  if (s.context.empty() && s.mode != Mode::Mode_prefill) s.context = {s.mode == Mode::Mode_decode ? 200 : 100};
  if (!weight_spec().synthetic()) s.input_norm = true;  // real checkpoints carry input_layernorm: start at h
  return s;
}

std::vector<std::string> RunOptions::to_args() const {
  std::vector<std::string> a = {"--model", model, "--mode", mode, "--batch", std::to_string(batch),
                                "--tp", std::to_string(tp), "--layers", std::to_string(layers),
                                "--seed", std::to_string(seed), "--weight-seed", std::to_string(weight_seed),
                                "--probe-level", probe_level};
  if (!attention.empty()) a.insert(a.end(), {"--attention", attention});
  if (tokens > 0) a.insert(a.end(), {"--tokens", std::to_string(tokens)});
  if (!context.empty()) a.insert(a.end(), {"--context", context});
  if (!full_probes.empty()) a.insert(a.end(), {"--full-probes", full_probes});
  if (weights != "synthetic") a.insert(a.end(), {"--weights", weights});
  if (!weight_format.empty()) a.insert(a.end(), {"--weight-format", weight_format});
  if (!layer_range.empty()) a.insert(a.end(), {"--layer-range", layer_range});
  return a;
}

nlohmann::json RunOptions::dump_options(const RunSpec& spec, uint64_t weight_seed_used, const std::string& input) const {
  nlohmann::json j = run_spec_to_json(spec);
  j["weights"] = weights;
  if (!weight_format.empty()) j["weight_format"] = weight_format;
  if (!layer_range.empty()) j["layer_range"] = layer_range;
  j["weight_seed"] = weight_seed_used;
  j["input"] = input;
  j["probe_level"] = probe_level;
  j["full_probes"] = full_probes;
  return j;
}

ProbePlan RunOptions::to_plan() const {
  ProbePlan p;
  p.level = parse_probe_level(probe_level);
  for (auto& n : split_list(full_probes)) p.full.insert(n);
  return p;
}

}  // namespace mla::cli
