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
  std::string pattern_words;          // the diagnosis must contain these words ("" = not scored)
  BisectOptions options;
};

struct ZooRow {
  ZooCase c;
  std::string found;     // probe of the first divergence, or "-"
  std::string pattern;   // diagnosis
  std::string verdict;   // "localized", "MISSED", "FALSE ALARM", "clean", "wrong probe", "error: ..."
  bool ok = false;       // localization as expected (the exit code)
  bool pattern_ok = false;  // localized and the diagnosis holds c.pattern_words
  // The cause: the first bug class confirmed by re-running the stage (or "weight NAME" for a weight measured to
  // differ), and how it scores against zoo_expected_classes: "right", "MISLEADING" (a confirmed cause not among
  // them), "none" (nothing confirmed), "-" (not scored).
  std::string cause, cause_verdict = "-";
  double seconds = 0;
};

// The words a right diagnosis of injection `inject` contains ("nan-at:..." by its name), "" for benign ones and
// names the zoo does not know. Only the zoo's scorer reads them: the diagnosis is never told the injection.
std::string zoo_pattern_words(const std::string& inject);

// The bug classes (harness/hypotheses) a right cause of injection `inject` names; "weight" accepts a weight measured to
// differ (the weight injections); empty for benign ones and those no class models (nan-at). Scorer only.
std::vector<std::string> zoo_expected_classes(const std::string& inject);

ZooRow run_zoo_case(const ZooCase& c);
// The table, then the counts: as expected, probe right and pattern right of the injected cases.
void print_zoo(std::ostream& os, const std::vector<ZooRow>& rows);

}  // namespace mla
