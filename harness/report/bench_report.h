// `mla-bisect bench`'s result as text (tables per stage, the ceilings, the probe overhead) and as JSON.
#pragma once
#include <iosfwd>

#include <nlohmann/json.hpp>

#include "harness/run/bench.h"

namespace mla {

void print_bench(const BenchResult& r, std::ostream& os);
nlohmann::json bench_to_json(const BenchResult& r);

}  // namespace mla
