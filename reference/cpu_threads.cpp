// Eigen's thread count: physical cores from /proc/cpuinfo, restricted to this process's affinity mask.
#include "reference/cpu_threads.h"

#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include <Eigen/Core>

namespace mla::ref {

namespace {
// The value after "key<spaces>:" on a /proc/cpuinfo line, or -1 when the line is another key.
int field(const std::string& line, const char* key) {
  if (line.rfind(key, 0) != 0) return -1;
  const auto colon = line.find(':');
  if (colon == std::string::npos) return -1;
  return std::atoi(line.c_str() + colon + 1);
}
}  // namespace

int physical_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const bool have_mask = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
  const int logical = have_mask ? CPU_COUNT(&allowed) : 0;

  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<int, int>> cores;  // (physical id, core id) of the CPUs we may use
  int processor = -1, package = 0, core = -1;
  const auto flush = [&] {
    if (processor >= 0 && core >= 0 && (!have_mask || CPU_ISSET(processor, &allowed))) cores.insert({package, core});
    processor = -1, package = 0, core = -1;
  };
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) flush();
    else if (int v = field(line, "processor"); v >= 0) processor = v;
    else if (int v = field(line, "physical id"); v >= 0) package = v;
    else if (int v = field(line, "core id"); v >= 0) core = v;
  }
  flush();
  if (!cores.empty()) return static_cast<int>(cores.size());
  return logical > 0 ? logical : 1;  // no topology in /proc/cpuinfo (some VMs, non-x86)
}

int set_eigen_threads() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!std::getenv("OMP_NUM_THREADS")) Eigen::setNbThreads(physical_cores());
  });
  return Eigen::nbThreads();
}

}  // namespace mla::ref
