// Numbers and index lists in words (format.h).
#include "harness/compare/format.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace mla {

std::string ranges(const std::vector<int64_t>& v, size_t max_items) {
  std::ostringstream os;
  size_t items = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (items++ == max_items) {
      os << ", ...";
      break;
    }
    if (i) os << ", ";
    os << v[i];
    if (j > i) os << "-" << v[j];
    i = j;
  }
  return os.str();
}

std::string fmt_num(double v, int precision) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

std::string shell_quote(const std::string& v) {
  if (!v.empty() && v.find_first_of(" \t'\"$\\;&|<>()*?`!#~") == std::string::npos) return v;
  std::string q = "'";
  for (char c : v) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace mla
