// What compare.cpp and comparable.cpp share (harness/compare): a dump's rank count and its contents in words.
#pragma once
#include <string>

#include "probes/dump.h"

namespace mla::compare_detail {

// The effective tp of a dump: its tp attribute, or more where the records say so (in-memory dumps made without
// provenance carry the default tp 1).
int ranks_of(const Dump& d);
// What a dump holds, for a message: its HDF5 file's top-level groups where it has a file, else its layers.
std::string groups_text(const Dump& d);

}  // namespace mla::compare_detail
