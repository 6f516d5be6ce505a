// Options shared by every command that runs an engine (run, bench, bisect, golden, zoo).
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/engine/engine.h"
#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/stage_graph.h"
#include "core/weights/loader.h"
#include "core/probe/probe.h"

namespace mla::cli {

struct RunOptions {
  std::string model = "deepseek-v3";
  std::string mode = "prefill";
  std::string attention;  // empty: the mode's default
  int tokens = 0;         // 0: not given, the mode's (or the command's) default; the CLI refuses an explicit < 1
  int batch = 1;
  std::string context;    // "L" or "L1,L2,..."
  int tp = 1;
  int layers = 1;
  uint64_t seed = 0;
  uint64_t weight_seed = 0;
  std::string probe_level = "sketch";
  std::string full_probes;  // comma list
  std::string weights = "synthetic";  // --weights: synthetic[:SEED] or a checkpoint (.gguf, .safetensors, directory)
  std::string weight_format;          // --weight-format: quantize the weights into this format, then dequantize
  std::string layer_range;            // --layer-range A:B: checkpoint layers A..B-1
  bool model_from_weights = false;    // --model not given: the checkpoint of --weights gives the config

  // The model config: the preset or config.json of --model, else the checkpoint's (errors name --weights then).
  MlaConfig load_config() const;
  // What needs the run's stage graph: every --full-probes name must be a probe of one of `graphs` (a typo lists
  // the valid names). UsageError.
  void check_full_probes(const std::vector<StageGraph>& graphs) const;

  RunSpec to_spec() const;   // throws UsageError
  WeightSpec weight_spec() const;
  std::vector<std::string> to_args() const;  // the same options as command-line arguments (for child runs)
  ProbePlan to_plan() const;
  // The options as a run's dump records them (DumpMeta::run_options, harness/run/run_meta.h): the run spec,
  // weights, weight format, layer range, weight seed, probe levels, and `input` ("synthetic" or the --input dump).
  nlohmann::json dump_options(const RunSpec& spec, uint64_t weight_seed, const std::string& input) const;
};

void add_run_options(CLI::App& app, RunOptions& o);
// bisect and zoo start their own runs: one process per rank is `run --rank`. They take --rank and --rendezvous
// only to refuse them with a UsageError that says what to do instead (per-rank `run`s, then `compare`).
void refuse_rank_options(CLI::App& app);
std::vector<std::string> split_list(const std::string& s, char sep = ',');

// Validators of numeric options, on the text as given: a finite number (no nan or inf) at least `min` (above it
// when `strict`); `unit` names what it counts in the message ("seconds"). An integer >= 0 that fits 64 bits (a
// seed: "-1" must not wrap to 2^64-1).
CLI::Validator finite_number(double min, bool strict, const std::string& unit = "");
CLI::Validator non_negative_integer();

// Refuses (UsageError, exit 2) a run whose estimated peak memory (harness/run/memory_estimate.h) is more than this
// machine has: host memory, and for a device engine (`engine` non-null) the memory of each GPU. `local_rank` >= 0:
// one process per rank, on that GPU.
struct MemoryCheck {
  std::string engine = "reference";  // the engine's name
  Engine* device = nullptr;          // asked for its devices' free memory
  bool dump = false;                 // the run writes a dump
  bool quantized = false;            // --weight-format or a quantized checkpoint
  int local_rank = -1;
};
// Returns the host estimate in one line, for an allocation failure that still happens.
std::string check_run_memory(const MlaConfig& cfg, const RunSpec& spec, const ProbePlan& plan, const MemoryCheck& how);

}  // namespace mla::cli
