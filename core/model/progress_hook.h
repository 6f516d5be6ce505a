// How far long work below the report layer is (loading and quantizing weights, a Runner's stages and weight records,
// hashing weights for the calibration cache, reading and comparing dumps), for the progress lines of the command that
// runs it. That command installs a ProgressHook on its thread (harness/report/progress.h: ProgressTicks, which prints
// a line when one is due); the work calls progress_tick, which costs a thread-local check where none is installed.
// Ticks from other threads (OpenMP workers, a replay's layer threads) reach no hook.
#pragma once
#include <cstddef>
#include <string>

namespace mla {

class ProgressHook {
 public:
  virtual ~ProgressHook() = default;
  // `what` is under way (the labels of the phases around it, then the tick's words); `fraction` of its count done,
  // in [0, 1]; `eta_s`: the seconds left at the count's pace so far, < 0 where there is no estimate yet.
  virtual void tick(const std::string& what, double fraction, double eta_s) = 0;
};

// This thread's hook, or nullptr.
ProgressHook* progress_hook();
inline bool progress_wanted() { return progress_hook() != nullptr; }

// Installs `hook` on this thread for the scope's life (nullptr: none), the earlier one after.
class ProgressHookScope {
 public:
  explicit ProgressHookScope(ProgressHook* hook);
  ~ProgressHookScope();
  ProgressHookScope(const ProgressHookScope&) = delete;
  ProgressHookScope& operator=(const ProgressHookScope&) = delete;

 private:
  ProgressHook* prev_;
};

// A phase of work on this thread: the ticks inside it read "label: what"; nested phases join their labels. Its start
// is a tick of its own (no fraction), so a line due then names it.
class ProgressPhase {
 public:
  explicit ProgressPhase(const std::string& label);
  ~ProgressPhase();
  ProgressPhase(const ProgressPhase&) = delete;
  ProgressPhase& operator=(const ProgressPhase&) = delete;

 private:
  size_t prev_size_;
};

// `done` of `total` units of a count (`counter` names it within the phase) are finished; `what` says what is under
// way now. The count's pace, and so the estimate, is measured from its first tick, and again from a tick whose `done`
// is below the last one's (a new count of the same name): tick with done = 0 as a count begins.
// `unit`: how much of the count the work now under way is, for progress_within.
void progress_tick(const char* counter, const std::string& what, double done, double total, double unit = 0);

// The work under way (the unit of this thread's last tick) is `fraction` (0..1) done: that tick again, moved on by
// that share of its unit. Loops inside one long unit (a large weight quantized row by row) call it every so often.
void progress_within(double fraction);

}  // namespace mla
