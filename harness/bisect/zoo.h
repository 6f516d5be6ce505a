// The bug zoo runner: every injection against the clean reference, plus clean runs that must not be flagged.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "harness/bisect/bisect.h"

namespace mla {

struct ZooCase {
  std::string inject;                 // "" = clean
  std::vector<std::string> expected;  // probes; {} = must not be flagged
  std::string expected_pattern;
  BisectOptions options;
};

struct ZooRow {
  ZooCase c;
  std::string found;     // probe of the first divergence, or "-"
  std::string pattern;   // diagnosis
  std::string verdict;   // "localized", "MISSED", "FALSE ALARM", "clean", "wrong probe", "error: ..."
  bool ok = false;
  double seconds = 0;
};

ZooRow run_zoo_case(const ZooCase& c);
void print_zoo(std::ostream& os, const std::vector<ZooRow>& rows);

}  // namespace mla
