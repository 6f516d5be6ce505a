// Progress lines on stderr (see progress.h).
#include "harness/report/progress.h"

#include <cmath>
#include <cstdio>

namespace mla {

double ProgressLog::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void ProgressLog::step(const std::string& what) const { step(what, -1, -1); }

void ProgressLog::step(const std::string& what, double fraction, double eta_s) const {
  if (!on_) return;
  note(what, fraction, eta_s);
  const double t = seconds();
  last_line_.store(t);
  // One write per line: lines of processes sharing the stream (a bisect's children, ranks) do not interleave.
  std::fprintf(stderr, "[%.1f s] %s%s\n", t, what.c_str(), fmt_fraction_eta(fraction, eta_s).c_str());
  std::fflush(stderr);
}

void ProgressLog::note(const std::string& what, double fraction, double eta_s) const {
  if (!on_) return;
  const double t = seconds();
  const std::lock_guard<std::mutex> lock(mu_);
  if (what != note_) note_at_ = t;  // the same words again: still the same thing under way
  note_ = what;
  note_fraction_ = fraction;
  note_eta_ = eta_s < 0 ? -1 : t + eta_s;  // kept as the time it should end
}

bool ProgressLog::heartbeat(double silence) const {
  if (!on_) return false;
  const double t = seconds();
  if (t - last_line_.load() < silence) return false;
  std::string what;
  double fraction, eta, since;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    if (note_.empty()) return false;
    what = note_;
    fraction = note_fraction_;
    eta = note_eta_ < 0 || note_eta_ <= t ? -1 : note_eta_ - t;
    since = t - note_at_;
  }
  last_line_.store(t);
  std::fprintf(stderr, "[%.1f s] %s%s; still at it after %.1f s\n", t, what.c_str(),
               fmt_fraction_eta(fraction, eta).c_str(), since);
  std::fflush(stderr);
  return true;
}

ProgressTicks::ProgressTicks(const ProgressLog& log) : log_(log), scope_(log.on() ? this : nullptr) {
  if (!log.on()) return;
  heartbeat_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; })) log_.heartbeat();
  });
}

ProgressTicks::~ProgressTicks() {
  if (!heartbeat_.joinable()) return;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  heartbeat_.join();
}

void ProgressTicks::tick(const std::string& what, double fraction, double eta_s) {
  if (log_.due()) log_.step(what, fraction, eta_s);
  else log_.note(what, fraction, eta_s);
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::string fmt_fraction_eta(double fraction, double eta_s) {
  if (fraction < 0) return "";
  char buf[64];
  const int pct = static_cast<int>(std::floor(100 * fraction + 1e-9));
  if (eta_s < 0) std::snprintf(buf, sizeof buf, " (%d%%)", pct);
  else if (eta_s < 100) std::snprintf(buf, sizeof buf, " (%d%%), ~%.0f s left", pct, std::ceil(eta_s));
  else std::snprintf(buf, sizeof buf, " (%d%%), ~%.1f min left", pct, eta_s / 60);
  return buf;
}

}  // namespace mla
