// Progress ticks of long work (see progress_hook.h).
#include "core/model/progress_hook.h"

#include <algorithm>
#include <chrono>
#include <map>

namespace mla {

namespace {

struct Pace {
  double t0 = 0, done0 = 0, last = 0;  // when the count (re)started, its done then, the last tick's done
};

struct LastTick {
  std::string counter, what;
  double done = 0, total = 0, unit = 0;
};

struct ThreadProgress {
  ProgressHook* hook = nullptr;
  LastTick last;                    // for progress_within
  std::string labels;               // of the phases around, joined by ": "
  std::map<std::string, Pace> pace;  // by labels and counter
};

thread_local ThreadProgress tp;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ProgressHook* progress_hook() { return tp.hook; }

ProgressHookScope::ProgressHookScope(ProgressHook* hook) : prev_(tp.hook) { tp.hook = hook; }

ProgressHookScope::~ProgressHookScope() { tp.hook = prev_; }

ProgressPhase::ProgressPhase(const std::string& label) : prev_size_(tp.labels.size()) {
  tp.labels += (tp.labels.empty() ? "" : ": ") + label;
  if (tp.hook) tp.hook->tick(tp.labels, -1, -1);  // a line due as the phase begins names it
}

ProgressPhase::~ProgressPhase() {
  // The counts of the phase end with it: the same labels later start their paces afresh.
  const std::string& mine = tp.labels;
  for (auto it = tp.pace.begin(); it != tp.pace.end();) {
    const std::string& k = it->first;
    const bool inner = k.size() > mine.size() && k.compare(0, mine.size(), mine) == 0 &&
                       (k[mine.size()] == '\n' || k[mine.size()] == ':');
    it = inner ? tp.pace.erase(it) : std::next(it);
  }
  tp.labels.resize(prev_size_);
  tp.last.unit = 0;  // what it was under way at is over
}

namespace {

void tick(const std::string& counter, const std::string& what, double done, double total) {
  const double t = now_s();
  Pace& p = tp.pace[tp.labels + "\n" + counter];
  if (p.t0 == 0 || done < p.last) p = {t, done, done};
  p.last = done;
  const double fraction = total > 0 ? std::min(1.0, std::max(0.0, done / total)) : -1;
  // At least a second of pace and a unit done before an estimate: a first unit's time says little.
  const double eta =
      total > 0 && done > p.done0 && t - p.t0 >= 1.0 ? (t - p.t0) / (done - p.done0) * (total - done) : -1;
  tp.hook->tick(tp.labels.empty() ? what : what.empty() ? tp.labels : tp.labels + ": " + what, fraction, eta);
}

}  // namespace

void progress_tick(const char* counter, const std::string& what, double done, double total, double unit) {
  if (!tp.hook) return;
  tp.last = {counter, what, done, total, unit};
  tick(counter, what, done, total);
}

void progress_within(double fraction) {
  if (!tp.hook || tp.last.unit <= 0) return;
  const LastTick& l = tp.last;
  tick(l.counter, l.what, l.done + std::min(1.0, std::max(0.0, fraction)) * l.unit, l.total);
}

}  // namespace mla
