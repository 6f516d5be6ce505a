// The inputs of a run: the layer-0 activations, the batch layout and, per layer, the paged latent cache
// holding each sequence's context. Synthetic inputs look like real ones (outlier channels, a cache the
// model's own kv path produced).
#pragma once
#include <vector>

#include "harness/model/batch.h"
#include "harness/model/config.h"
#include "harness/model/tensor.h"
#include "harness/model/weights.h"

namespace mla {

struct Inputs {
  Tensor x;                      // [T, H]: h of layer 0 when layers start at h, else the attention input x
  Batch batch;
  std::vector<Tensor> kv_cache;  // per layer [num_blocks, 64, L+R]; context rows filled, new rows zero
};

// Seeded hidden states N(0,1) with a few outlier channels 20-100x larger; bf16-exact.
Tensor synthetic_hidden(int64_t tokens, int64_t hidden, uint64_t seed, uint64_t stream);

}  // namespace mla
