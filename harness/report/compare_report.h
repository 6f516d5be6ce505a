// Rendering a CompareReport: terminal table (first divergence on top, the verdict line that counts matched and
// missing probes at the end), JSON, JUnit XML; and the drill-down and diagnosis of the first divergence
// (harness/compare/diagnose.h).
#pragma once
#include <iosfwd>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/compare/compare.h"
#include "harness/compare/diagnose.h"

namespace mla {

// `findings` (optional) is printed under the first divergence.
void print_compare(std::ostream& os, const CompareReport& rep, bool all_rows = true, const Findings* findings = nullptr);
void print_findings(std::ostream& os, const Findings& f);
// "WEIGHT DIFFERS: layer 0 q_a_proj (used by stage q_a_proj) on rank 1: ...", its pattern, evidence and tolerance.
void print_weight_difference(std::ostream& os, const ProbeResult& weight);
// {"schema_version": 1, "verdict", "verdict_line", "exit_code", "expected", "matched", "missing": [{layer, probe,
// stage, reason, allowed}], "first_divergence", "probes", ...}; with `findings`, also "diagnosis" and "drill_down".
nlohmann::json compare_to_json(const CompareReport& rep, const Findings* findings = nullptr);
nlohmann::json findings_to_json(const Findings& f);  // {"diagnosis": {...}, "drill_down": {...}}
nlohmann::json metrics_to_json(const Metrics& m);
// One testcase per weight and per probe: a divergence and a missing probe (unless allowed) are <failure>s with the
// reason. The first divergence is the first testcase and a suite property (first_divergence, its stage; first_weight).
std::string compare_to_junit(const CompareReport& rep, const std::string& suite_name);
void write_text_file(const std::string& path, const std::string& text);  // throws UsageError
std::string xml_escape(const std::string& s);

}  // namespace mla
