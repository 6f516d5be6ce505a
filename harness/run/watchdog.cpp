// The watchdog thread.
#include "harness/run/watchdog.h"

#include <unistd.h>

#include <cstdio>

#include "core/model/errors.h"

namespace mla {

WatchdogSink::WatchdogSink(ProbeSink& inner, double timeout_s)
    : inner_(inner), timeout_s_(timeout_s), last_(std::chrono::steady_clock::now()) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
}

WatchdogSink::~WatchdogSink() {
  done_ = true;
  if (thread_.joinable()) thread_.join();
}

void WatchdogSink::stage_begin(int layer, Stage stage, int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    where_ = begun_ = "rank " + std::to_string(rank) + " at layer " + std::to_string(layer) + " stage " +
                      stage_name(stage);
    last_ = std::chrono::steady_clock::now();
  }
  inner_.stage_begin(layer, stage, rank);
}

void WatchdogSink::waiting(int layer, Stage stage, int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);  // the hang is there, not at the last stage begun; no progress yet
    where_ = "rank " + std::to_string(rank) + " at layer " + std::to_string(layer) + " stage " + stage_name(stage) +
             " (waiting for its device work)";
  }
  inner_.waiting(layer, stage, rank);
}

void WatchdogSink::waiting_over() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    where_ = begun_;
  }
  inner_.waiting_over();
}

void WatchdogSink::record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = std::chrono::steady_clock::now();
  }
  inner_.record(layer, spec, rank, rec);
}

void WatchdogSink::finish(const std::string& status) {
  done_ = true;
  inner_.finish(status);
}

void WatchdogSink::watch() {
  while (!done_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string where;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count() < timeout_s_) continue;
      where = where_;
    }
    char msg[512];
    std::snprintf(msg, sizeof msg, "stopped: watchdog: %s made no progress for %.1f s (hung)", where.c_str(), timeout_s_);
    std::fprintf(stderr, "\nerror: %s\n", msg + 9);
    // The main thread is stuck inside the engine: closing the dump from here races with nothing.
    try {
      inner_.finish(msg);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: could not close the dump: %s\n", e.what());
    }
    std::fflush(stderr);
    _exit(ExitCode_engine);
  }
}

}  // namespace mla
