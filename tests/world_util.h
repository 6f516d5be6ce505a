// The tiny model with seeded synthetic weights and inputs for one run spec: what the comparison and calibration
// tests run the reference on.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/synthetic_inputs.h"

namespace mla::test {

struct TinyWorld {
  MlaConfig cfg = *find_preset("tiny");
  RunSpec spec;
  std::vector<LayerWeights> weights;
  Inputs inputs;
  explicit TinyWorld(RunSpec s, uint64_t weight_seed = 3) : spec(std::move(s)) {
    weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, weight_seed);
    inputs = synthetic_inputs(cfg, spec, weights);
  }
};

}  // namespace mla::test
