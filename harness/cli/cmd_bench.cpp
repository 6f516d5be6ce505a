// `mla-bisect bench`: times the layer; filled in below.
#include "harness/cli/commands.h"

namespace mla::cli {
void setup_bench(CLI::App&, int&) {}
}  // namespace mla::cli
