// The reference's all_reduce (the sum of every rank's o_proj partial), against the double-precision naive loops of
// tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, AllReduceSumsEveryRanksPartial) {
  const auto cfg = preset("tiny");
  const int64_t H = cfg.hidden, T = 5;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    for (int tp : {1, 2, 4}) {
      SCOPED_TRACE("tp " + std::to_string(tp));
      std::vector<Tensor> partials;
      for (int r = 0; r < tp; ++r) partials.push_back(randn({T, H}, rng));
      std::vector<const Tensor*> ptrs;
      Ref sum({T, H});
      for (auto& p : partials) {
        ptrs.push_back(&p);
        for (int64_t i = 0; i < p.numel(); ++i) sum.data[i] += at(p, i);
      }
      expect_close(ref::all_reduce(ptrs), sum, "all_reduce");
    }
  }
}

}  // namespace
