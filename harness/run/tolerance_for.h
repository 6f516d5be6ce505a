// Tolerance models for dumps compared after the fact (compare, golden check).
#pragma once
#include <string>

#include "harness/compare/compare.h"

namespace mla {

// mode: "auto" (calibrate unless the candidate is FP32), "calibrate", or "exact" (the FP32 floor).
ToleranceModel tolerance_for(const Dump& candidate, const Dump& reference, const std::string& mode, double k);

}  // namespace mla
