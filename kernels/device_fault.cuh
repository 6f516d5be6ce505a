// A device fault on purpose (the injection fault-at:STAGE): a one-thread kernel that writes to an address no
// allocation holds, so the device stops with an illegal-address error, as a broken kernel's stray write would stop
// it. The error is sticky: every later call on the device fails, and what survives is what reached the host before.
#pragma once
#include <cuda_runtime.h>

namespace mla::cuda {

void launch_device_fault(cudaStream_t stream);

}  // namespace mla::cuda
