// Progress lines on stderr (see progress.h).
#include "harness/report/progress.h"

#include <cstdio>

namespace mla {

double ProgressLog::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void ProgressLog::step(const std::string& what) const {
  if (!on_) return;
  // One write per line: lines of processes sharing the stream (a bisect's children, ranks) do not interleave.
  std::fprintf(stderr, "[%.1f s] %s\n", seconds(), what.c_str());
  std::fflush(stderr);
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace mla
