// `mla-bisect inspect model.gguf|model.safetensors|dir`: what a weight file holds (metadata, tensors with
// types, shapes and sizes), the MLA layers found, the detected config, and whether layer 0 agrees with it.
#pragma once
#include <ostream>
#include <string>

namespace mla {

// layer >= 0: list only that layer's tensors (and check that layer). max_tensors bounds the listing otherwise.
// Returns what could not be loaded (the config, or the checked layer), "" when everything loads.
std::string describe_weights(const std::string& path, std::ostream& os, int layer = -1, size_t max_tensors = 200);

}  // namespace mla
