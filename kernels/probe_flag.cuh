// The probe capture's done flag (probe_capture.cuh): a value written to mapped host memory once everything before
// it on a stream is done, by a stream memory operation (cuStreamWriteValue32: the copy engine's front end writes it,
// no SM needed) or by a one-thread kernel (the engine's option probe_flag=kernel, and a driver without the memory
// operation).
#pragma once
#include <cuda_runtime.h>

namespace mla::cuda {

// cuStreamWriteValue32 as the driver gives it.
using StreamWriteValue32 = int (*)(cudaStream_t, unsigned long long, unsigned, unsigned);

// The driver's cuStreamWriteValue32, looked up through the runtime (no link to the driver library); nullptr where
// the driver lacks it.
StreamWriteValue32 find_stream_write_value32();

// Writes `value` to `flag` (mapped host memory, its device address) once everything before it on `stream` is done:
// by `write` where it is given and the device accepts it, else by a one-thread kernel.
void launch_set_flag(unsigned* flag, unsigned value, StreamWriteValue32 write, cudaStream_t stream);

}  // namespace mla::cuda
