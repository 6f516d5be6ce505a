// The report of a comparison: its counts, its exit code and its verdict line. The comparison that fills it is
// compare_dumps.cpp; a probe's metrics and verdict are in metrics.cpp, what is comparable and expected in
// comparable.cpp.
#include "harness/compare/compare.h"

#include <sstream>

#include "core/model/errors.h"

namespace mla {

int CompareReport::divergent_weights() const {
  int n = 0;
  for (const auto& r : weights) n += r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite;
  return n;
}

int CompareReport::divergent() const {
  int n = 0;
  for (const auto& r : results) n += r.verdict == Verdict::Verdict_diverge || r.verdict == Verdict::Verdict_nonfinite;
  return n;
}

std::vector<const ProbeResult*> CompareReport::missing(bool allowed) const {
  std::vector<const ProbeResult*> out;
  for (const auto& r : results)
    if (r.verdict == Verdict::Verdict_missing && r.missing_allowed == allowed) out.push_back(&r);
  return out;
}

int CompareReport::exit_code() const {
  if (stopped_early()) return ExitCode_engine;
  if (matched == 0) return ExitCode_usage;
  if (first_divergence >= 0 || first_weight >= 0 || missing_fails()) return ExitCode_divergence;
  return ExitCode_ok;
}

namespace {
std::string name_list(const std::vector<const ProbeResult*>& v, size_t max_items = 8) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + v[i]->label();
  if (v.size() > max_items) s += ", ... " + std::to_string(v.size() - max_items) + " more";
  return s;
}
}  // namespace

std::string CompareReport::verdict_line() const {
  std::ostringstream os;
  os << matched << " of " << expected << " probes matched";
  const auto miss = missing(false), allowed = missing(true);
  if (!miss.empty()) os << ", " << miss.size() << " missing (" << name_list(miss) << ")";
  if (!allowed.empty()) os << ", " << allowed.size() << " missing but allowed (" << name_list(allowed) << ")";
  if (miss.empty() && allowed.empty()) os << ", none missing";
  const int div = divergent();
  if (div > 0)
    os << ", " << div << " beyond tolerance (first: " << results[first_divergence].label() << ")";
  else if (matched > 0)
    os << ", " << (miss.empty() && allowed.empty() ? "every probe" : "every matched probe") << " within its tolerance";
  if (!weights.empty()) {
    const int wd = divergent_weights();
    os << "; " << weights.size() << " weight" << (weights.size() == 1 ? "" : "s") << " compared, ";
    if (wd > 0) os << wd << " beyond tolerance (first: " << weights[first_weight].label() << ")";
    else os << "every one within its tolerance";
  }
  switch (exit_code()) {
    case ExitCode_engine:
      os << ": INCOMPLETE (a dump stopped early: "
         << (a_status != "complete" ? "candidate " + a_status : "reference " + b_status) << ")";
      break;
    case ExitCode_usage: os << ": NOTHING COMPARED"; break;
    case ExitCode_divergence: os << ": FAIL"; break;
    default: os << ": PASS"; break;
  }
  return os.str();
}

}  // namespace mla
