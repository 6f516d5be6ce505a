// The inputs of a run: the layer-0 activations, the batch layout and, per layer, the paged latent cache
// holding each sequence's context. Synthetic inputs look like real ones (outlier channels, a cache the
// model's own kv path produced).
#pragma once
#include <string>
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/tensor.h"
#include "core/model/weights.h"

namespace mla {

struct Inputs {
  Tensor x;                      // [T, H]: h of layer 0 when layers start at h, else the attention input x
  Batch batch;
  std::vector<Tensor> kv_cache;  // per layer [num_blocks, 64, L+R]; context rows filled, new rows zero
  // DSA models only (empty otherwise): per layer the indexer's paged key cache [num_blocks, 64, Di] (idx_k of each
  // cached token), pages and slots as kv_cache's.
  std::vector<Tensor> index_cache;
};

// Gives a DSA model's run an index cache per layer when it has none (zeros: right when nothing is cached), and checks
// the one it has against the model and the batch; `who` names the source for errors. Nothing for other models.
void complete_index_cache(Inputs& in, const MlaConfig& cfg, int layers, const std::string& who);

// Seeded hidden states N(0,1) with a few outlier channels 20-100x larger; bf16-exact.
Tensor synthetic_hidden(int64_t tokens, int64_t hidden, uint64_t seed, uint64_t stream);

}  // namespace mla
