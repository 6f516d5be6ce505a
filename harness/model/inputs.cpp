// Synthetic inputs.
#include "harness/model/inputs.h"

#include <algorithm>
#include <cmath>
#include <random>

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
