// What `mla-bisect bench` asks of an engine that queues work on a device (Engine::timing()): the device's own
// clock around each stage, the host time spent building probe records, and the device's limits measured now.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/stage_graph.h"

namespace mla {

struct StageTiming {
  Stage stage = Stage::Stage_layer_input;
  int layer = 0, rank = 0;
  double start_s = 0, end_s = 0;  // device clock, seconds after the first stage timed on the same device
  int device = 0;                 // start_s/end_s compare only between timings of the same device
};

struct DeviceCeiling {
  std::string what;               // e.g. "cuBLAS bf16 GEMM 8192^3"
  double flops = 0, bytes = 0;    // per run; bytes count read + written
  std::vector<double> samples_s;  // one per timed run
};

class EngineTiming {
 public:
  virtual ~EngineTiming() = default;
  // While on, each run_stage is bracketed by device events; take_stage_timings waits for the device and returns
  // the stages run since the last take, in call order.
  virtual void set_device_timing(bool on) = 0;
  virtual std::vector<StageTiming> take_stage_timings() = 0;
  // Host seconds spent building records from results the device computed (folding them, copying them into the
  // record's vectors): in all since the engine was made, and for the last record built.
  struct ProbeBuildSeconds {
    double total = 0, last = 0;
  };
  virtual ProbeBuildSeconds probe_build_seconds() const = 0;
  // The device's own limits, timed now.
  virtual std::vector<DeviceCeiling> measure_ceilings(int repeats) = 0;
  // Whether probes of tensors with `rows` token rows are held and launched together (Engine::flush_probes: at the
  // end of the layer, and with the CUDA engine's probe_launch=attention also before the attention) rather than after
  // their stage.
  virtual bool holds_probes_of(int64_t rows) const {
    (void)rows;
    return false;
  }
};

}  // namespace mla
