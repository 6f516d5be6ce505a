// Progress lines on stderr for the commands that take more than a few seconds: "[12.3 s] what", one line per phase
// (never a carriage-return bar), whether or not stderr is a terminal, so logs and CI show where the time goes.
// Within a long phase, the ticks of the work below (core/model/progress_hook.h) print a line when one is due:
// kProgressEvery seconds after the log's last line, with the fraction done and an estimate of the time left. Where
// one unit of work outlasts that (a large weight recorded in full, one long stage), a heartbeat says what is still
// under way kProgressSilence seconds after the last line.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "core/model/progress_hook.h"

namespace mla {

constexpr double kProgressEvery = 2.5;    // seconds between the lines of one phase's ticks
constexpr double kProgressSilence = 4.0;  // seconds without a line before the heartbeat's

class ProgressLog {
 public:
  // on = false (--quiet): every call prints nothing.
  explicit ProgressLog(bool on = true) : on_(on), t0_(std::chrono::steady_clock::now()) {}
  bool on() const { return on_; }
  double seconds() const;                    // since construction
  void step(const std::string& what) const;  // "[12.3 s] what"; safe from several threads
  // "[12.3 s] what (40%), ~6 s left" (fraction < 0: none; eta_s < 0: no estimate).
  void step(const std::string& what, double fraction, double eta_s) const;
  // Whether a tick's line is due: on, and kProgressEvery seconds since this log's last line (or its start).
  bool due() const { return on_ && seconds() - last_line_.load() >= kProgressEvery; }
  // What is under way, as the latest tick says, printed or not: what the heartbeat repeats.
  void note(const std::string& what, double fraction, double eta_s) const;
  // When `silence` seconds have passed since the last line: the latest note again, the estimate brought up to now,
  // and how long it has been under way. Returns whether it printed.
  bool heartbeat(double silence = kProgressSilence) const;

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
  mutable std::atomic<double> last_line_{0};
  mutable std::mutex mu_;  // the latest note
  mutable std::string note_;
  mutable double note_fraction_ = -1, note_eta_ = -1, note_at_ = 0;
};

// Prints the ticks of this thread's work through `log` while it lives (installed as the thread's ProgressHook when
// the log is on): "[12.3 s] what (40%), ~6 s left" when a line is due; and runs the log's heartbeat from a thread of
// its own, so a unit of work longer than the ticks' spacing is not a silence either.
class ProgressTicks : public ProgressHook {
 public:
  explicit ProgressTicks(const ProgressLog& log);
  ~ProgressTicks() override;
  ProgressTicks(const ProgressTicks&) = delete;
  ProgressTicks& operator=(const ProgressTicks&) = delete;
  void tick(const std::string& what, double fraction, double eta_s) override;

 private:
  const ProgressLog& log_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;
  ProgressHookScope scope_;
};

std::string fmt_seconds(double s);  // "12.3 s"
// " (40%), ~6 s left" (", ~2.5 min left" from 100 s on); without the estimate where eta_s < 0, "" where fraction < 0.
std::string fmt_fraction_eta(double fraction, double eta_s);

}  // namespace mla
