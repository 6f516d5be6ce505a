// A self-contained HTML report of a bisect (no scripts, no external files): the verdict, the error profile
// across the graph, the per-token error and a token x head heat map of the divergent probe.
#pragma once
#include <string>

#include "harness/bisect/bisect.h"

namespace mla {

std::string bisect_to_html(const BisectReport& rep);

}  // namespace mla
