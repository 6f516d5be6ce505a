// How numbers and index lists are written in the comparison's words: its verdicts, drill-downs, diagnoses and
// weight descriptions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mla {

// "0-3, 7, 9-12" for a sorted list.
std::string ranges(const std::vector<int64_t>& v, size_t max_items = 12);
// A number in `precision` significant digits ("nan", "inf" spelled out).
std::string fmt_num(double v, int precision = 3);
// `v` as one word of a POSIX shell command: as it is when nothing in it needs quoting, else in single quotes.
std::string shell_quote(const std::string& v);

}  // namespace mla
