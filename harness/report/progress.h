// Progress lines on stderr for the commands that take more than a few seconds: "[12.3 s] what", one line per phase
// (never a carriage-return bar), whether or not stderr is a terminal, so logs and CI show where the time goes.
#pragma once
#include <chrono>
#include <string>

namespace mla {

class ProgressLog {
 public:
  // on = false (--quiet): every call prints nothing.
  explicit ProgressLog(bool on = true) : on_(on), t0_(std::chrono::steady_clock::now()) {}
  bool on() const { return on_; }
  double seconds() const;                 // since construction
  void step(const std::string& what) const;  // "[12.3 s] what"

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

std::string fmt_seconds(double s);  // "12.3 s"

}  // namespace mla
