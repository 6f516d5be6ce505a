// The device's own limits, measured in the benchmark's run: a cuBLAS bf16 GEMM of 8192³ on random
// data and a large device-to-device copy (bytes read + written), each timed with events, warm-up first.
#pragma once
#include <string>
#include <vector>

namespace mla::cuda {

struct CeilingRun {
  std::string what;
  double flops = 0, bytes = 0;    // per run; bytes count read + written
  std::vector<double> samples_s;  // one per timed run
};

std::vector<CeilingRun> measure_device_ceilings(int device, int repeats);

}  // namespace mla::cuda
