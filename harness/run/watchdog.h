// Per-stage watchdog: a sink wrapper whose thread ends the process (exit 3) when no stage starts or
// finishes within the timeout, after closing the dump with a status that names the rank and the stage.
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "core/probe/probe.h"

namespace mla {

class WatchdogSink : public ProbeSink {
 public:
  WatchdogSink(ProbeSink& inner, double timeout_s);
  ~WatchdogSink() override;
  void stage_begin(int layer, Stage stage, int rank) override;
  void waiting(int layer, Stage stage, int rank) override;
  void waiting_over() override;
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override {
    inner_.record_weight(layer, spec, rank, rec);
  }
  void finish(const std::string& status) override;

 private:
  void watch();
  ProbeSink& inner_;
  double timeout_s_;
  std::mutex mu_;
  std::string where_ = "before the first stage";
  std::string begun_ = where_;  // the stage last begun (where_ while no wait for device work is reported)
  std::chrono::steady_clock::time_point last_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace mla
