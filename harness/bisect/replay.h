// Replay: a dump captured from another system (HF transformers, vLLM, SGLang, one's own kernels) against the FP32
// reference run on exactly the captured inputs with the checkpoint's weights for that layer; first divergence,
// isolation on the candidate's own inputs to the divergent stage, drill-down and diagnosis, as bisect reports them.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "harness/bisect/bisect.h"

namespace mla {

struct ReplayOptions {
  std::string capture;       // the captured dump (FILE.h5, or the set FILE.rank0.h5 ... of a per-rank capture)
  std::string weights;       // checkpoint: a directory of safetensors with config.json, a .safetensors or a .gguf
  int layer = -1;            // the checkpoint layer the capture's layer 0 is; -1: the capture's layer_index, else
                             // the first layer of its run_options.layer_range, else 0
  std::string reference_out; // where the reference dump is written ("" = nowhere)
  double k = 4.0;            // tolerance = k x calibrated noise floor
  std::map<std::string, double> overrides;
  bool progress = false;     // a line per step on stderr
};

// Which stage fields of two configs differ ("heads 128 vs 64", ...); empty when they describe the same attention.
std::vector<std::string> config_differences(const MlaConfig& capture, const MlaConfig& checkpoint);

// Throws UsageError (exit 2) for a capture that cannot be replayed: no inputs, no probes, a config that disagrees
// with the checkpoint's, a checkpoint without the layer, zero probes matching the reference's graph.
BisectReport run_replay(const ReplayOptions& opt);

}  // namespace mla
