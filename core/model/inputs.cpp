// Synthetic inputs.
#include "core/model/inputs.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/model/errors.h"

namespace mla {

Tensor synthetic_hidden(int64_t tokens, int64_t hidden, uint64_t seed, uint64_t stream) {
  Tensor x({tokens, hidden});
  fill_normal(x.ptr(), x.numel(), seed, stream, 1.0f);
  // Real residual streams carry a few huge channels; bugs hide behind inputs that are too tame.
  std::mt19937_64 rng(seed * 1000003 + stream);
  const int outliers = static_cast<int>(std::max<int64_t>(2, hidden / 512));
  std::uniform_int_distribution<int64_t> pick(0, hidden - 1);
  std::uniform_real_distribution<double> mag(20.0, 100.0);
  for (int k = 0; k < outliers; ++k) {
    const int64_t c = pick(rng);
    const float m = static_cast<float>(mag(rng));
    for (int64_t t = 0; t < tokens; ++t) x.data[t * hidden + c] *= m;
  }
  round_in_place(x, Precision::Precision_bf16);
  return x;
}

}  // namespace mla

namespace mla {

void complete_index_cache(Inputs& in, const MlaConfig& cfg, int layers, const std::string& who) {
  if (!cfg.has_dsa()) {
    if (!in.index_cache.empty())
      throw UsageError(who + ": holds an index cache (DSA's indexer keys), but model '" + cfg.name +
                       "' has no indexer (no index_topk)");
    return;
  }
  const int64_t nb = in.batch.num_blocks, Di = cfg.index_head_dim;
  bool any_context = false;
  for (int c : in.batch.context_lens) any_context = any_context || c > 0;
  if (in.index_cache.empty()) {
    if (any_context)
      throw UsageError(who + ": model '" + cfg.name + "' selects keys with DSA's indexer, and the context's indexer "
                       "keys (index_cache) are not given");
    in.index_cache.assign(std::max(layers, 1), Tensor({nb, kPageSize, Di}));
    return;
  }
  for (size_t l = 0; l < in.index_cache.size(); ++l) {
    const auto& s = in.index_cache[l].shape;
    if (s != std::vector<int64_t>{nb, kPageSize, Di})
      throw UsageError(who + ": index_cache of layer " + std::to_string(l) + " is " + shape_string(s) +
                       ", but model '" + cfg.name + "' and the batch make it [" + std::to_string(nb) + ", " +
                       std::to_string(kPageSize) + ", " + std::to_string(Di) + "] (num_blocks, page, index_head_dim)");
  }
  if (static_cast<int>(in.index_cache.size()) < layers)
    throw UsageError(who + ": holds index caches for " + std::to_string(in.index_cache.size()) + " layers, the run " +
                     std::to_string(layers));
}

}  // namespace mla
