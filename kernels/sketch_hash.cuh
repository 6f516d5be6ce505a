// The probe hashes (core/probe/probe_hash.h) under the names the kernels use. They must stay bit-identical to the
// host's (tests/gpu/test_cuda_probe.cpp checks that on the device).
#pragma once
#include "core/probe/probe_hash.h"

namespace mla::cuda {

using mla::kSketchLanes;

MLA_HD inline float sketch_coeff_hd(uint64_t key, int64_t column, int lane) { return sketch_coeff_at(key, column, lane); }

}  // namespace mla::cuda
