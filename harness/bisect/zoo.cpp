// Scoring one zoo case: localized means the first divergence is one of the probes BUGS.md names.
#include "harness/bisect/zoo.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "harness/report/compare_report.h"

namespace mla {

ZooRow run_zoo_case(const ZooCase& c) {
  ZooRow row;
  row.c = c;
  try {
    BisectOptions o = c.options;
    o.inject = c.inject;
    const BisectReport rep = run_bisect(o);
    row.seconds = rep.seconds;
    row.found = rep.first ? rep.first->name : "-";
    row.pattern = rep.first ? rep.diagnosis.pattern : "";
    if (c.expected.empty()) {
      row.ok = rep.exit_code == 0;
      row.verdict = row.ok ? "clean" : "FALSE ALARM";
    } else if (rep.exit_code == 1) {
      row.ok = std::find(c.expected.begin(), c.expected.end(), row.found) != c.expected.end();
      row.verdict = row.ok ? "localized" : "wrong probe";
    } else {
      row.verdict = rep.exit_code == 0 ? "MISSED" : "engine failed: " + rep.headline;
    }
  } catch (const std::exception& e) {
    row.verdict = std::string("error: ") + e.what();
  }
  return row;
}

void print_zoo(std::ostream& os, const std::vector<ZooRow>& rows) {
  char line[1024];
  std::snprintf(line, sizeof line, "%-22s %-9s %-3s %-22s %-12s %-12s %s\n", "injection", "mode", "tp", "expected",
                "found", "verdict", "pattern named");
  os << line;
  int ok = 0, missed = 0, false_alarm = 0;
  for (const auto& r : rows) {
    std::string exp;
    for (auto& e : r.c.expected) exp += (exp.empty() ? "" : "|") + e;
    if (exp.empty()) exp = "(none)";
    std::snprintf(line, sizeof line, "%-22s %-9s %-3d %-22s %-12s %-12s %s\n",
                  (r.c.inject.empty() ? "clean seed " + std::to_string(r.c.options.spec.seed) : r.c.inject).c_str(),
                  mode_name(r.c.options.spec.mode), r.c.options.spec.tp, exp.c_str(), r.found.c_str(),
                  r.verdict.c_str(), r.pattern.substr(0, 90).c_str());
    os << line;
    ok += r.ok;
    missed += !r.ok && !r.c.expected.empty();
    false_alarm += !r.ok && r.c.expected.empty();
  }
  os << "\n" << ok << " of " << rows.size() << " as expected; " << missed << " injected bugs missed or mislocated, "
     << false_alarm << " clean or benign runs flagged\n";
}

}  // namespace mla
