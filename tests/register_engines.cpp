// The test programs make engines by name as mla-bisect does: register the same ones before any test runs.
#include "harness/cli/engines.h"

namespace {
const bool registered = (mla::register_engines(), true);
}  // namespace
