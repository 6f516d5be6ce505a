// Child processes for engine runs: a candidate that crashes or hangs must not take the harness down.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace mla {

struct ChildResult {
  int exit_code = -1;   // when it exited
  int signal = 0;       // when a signal ended it
  bool timed_out = false;
  double seconds = 0;
  std::string output;   // stdout + stderr, last 64 KiB
  std::string describe() const;
};

// Runs argv[0] with argv, capturing output; kills the process group after `timeout_s` (0: none). `env`: NAME=VALUE
// entries added to (or replacing) this process's environment for the child. `on_line`: hears each whole line of the
// output as it comes (without its newline, on the calling thread); a line it returns true for is its own and stays
// out of `output`. Safe to call from several threads at once (nothing is allocated between fork and exec).
ChildResult run_child(const std::vector<std::string>& argv, double timeout_s, const std::vector<std::string>& env = {},
                      const std::function<bool(const std::string&)>& on_line = nullptr);

// Path of the running mla-bisect binary (/proc/self/exe).
std::string self_exe();

}  // namespace mla
