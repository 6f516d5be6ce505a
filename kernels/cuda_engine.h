// The CUDA engine's factory (plain C++ header: the harness includes it without nvcc).
#pragma once
#include <map>
#include <memory>
#include <string>

#include "core/engine/engine.h"
#include "core/engine/engine_timing.h"

namespace mla {

// Throws UsageError when no CUDA device is visible (exit 2), naming what the runtime said.
std::unique_ptr<Engine> make_cuda_engine(const std::map<std::string, std::string>& options);

// Number of visible CUDA devices; 0 when there is no driver or no device (never throws).
int cuda_device_count();

}  // namespace mla
