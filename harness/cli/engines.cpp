// The engine factory of the program: the reference, and the CUDA engine where it is compiled in.
#include "harness/cli/engines.h"

#include <memory>

#include "core/engine/engine.h"
#include "reference/reference_engine.h"

#ifdef MLA_WITH_CUDA
#include "kernels/cuda_engine.h"
#endif

namespace mla {

void register_engines() {
  register_engine(
      "reference", [](const auto& options) { return std::make_unique<ReferenceEngine>(options); }, true);
#ifdef MLA_WITH_CUDA
  register_engine("cuda", make_cuda_engine, true);
#else
  register_unavailable_engine("cuda", "this build has no CUDA engine (configure with -DMLA_WITH_CUDA=ON on a "
                                      "machine with the CUDA toolkit)");
#endif
}

}  // namespace mla
