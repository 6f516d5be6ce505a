// Options shared by every command that runs an engine (run, bench, bisect, golden, zoo).
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "harness/model/batch.h"
#include "harness/model/config.h"
#include "probes/probe.h"
#include "harness/weights/loader.h"

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

  RunSpec to_spec() const;   // throws UsageError
  WeightSpec weight_spec() const;
  std::vector<std::string> to_args() const;  // the same options as command-line arguments (for child runs)
  ProbePlan to_plan() const;
};

void add_run_options(CLI::App& app, RunOptions& o);
// bisect and zoo start their own runs: one process per rank is `run --rank`. They take --rank and --rendezvous
// only to refuse them with a UsageError that says what to do instead (per-rank `run`s, then `compare`).
void refuse_rank_options(CLI::App& app);
std::vector<std::string> split_list(const std::string& s, char sep = ',');

}  // namespace mla::cli
