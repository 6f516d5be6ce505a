// Rendering a CompareReport: terminal table (first divergence on top), JSON, JUnit XML.
#pragma once
#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/compare/compare.h"

namespace mla {

void print_compare(std::ostream& os, const CompareReport& rep, bool all_rows = true);
nlohmann::json compare_to_json(const CompareReport& rep);
nlohmann::json metrics_to_json(const Metrics& m);
// One testcase per probe; a divergence is a <failure> with the reason and the tolerance's origin.
std::string compare_to_junit(const CompareReport& rep, const std::string& suite_name);
void write_text_file(const std::string& path, const std::string& text);  // throws UsageError
std::string xml_escape(const std::string& s);
std::string fmt_num(double v, int precision = 3);

}  // namespace mla
