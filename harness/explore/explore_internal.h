// What the explorer's files share (harness/explore/explore*.cpp): the gathered pair of one probe, and the helpers
// of the command line and the tables.
#pragma once
#include <cstddef>
#include <string>

#include "harness/explore/explore.h"

namespace mla {

struct Explorer::Sides {
  Gathered a, b;  // candidate, reference
  const DumpProbe* spec = nullptr;
  bool full() const { return a.full && b.full && a.data.numel() == b.data.numel() && a.data.numel() > 0; }
};

namespace explore_detail {

// A number argument; a UsageError naming `what` otherwise.
int to_int(const std::string& s, const std::string& what);
// `s` padded with spaces to `w` columns.
std::string pad(std::string s, size_t w);

}  // namespace explore_detail
}  // namespace mla
