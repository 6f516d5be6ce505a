// The host side of the Hopper kernels (attention_mqa version 3, attention_mha version 4): whether a GPU runs their
// sm_90a code, and the TMA descriptors (tensor maps) of the bf16 tensors they load.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace mla::cuda {

// True where the device is compute capability 9.0, the kernels were built for sm_90a (a one-thread probe kernel
// says so) and the driver has cuTensorMapEncodeTiled; checked once per device.
bool sm90a_available(int device);

// A bf16 tensor of `rank` (2 or 3) dimensions, dims[0] the innermost (contiguous) one, strides_bytes[i] the step of
// dims[i + 1], as a TMA map of boxes box[] with the 128-byte swizzle (box[0] = 64 lanes); what lies past a dimension
// reads as zeros. `what` names the tensor in the error when the driver refuses it.
CUtensorMap tensor_map_bf16(const void* base, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                            const uint32_t* box, const char* what);

}  // namespace mla::cuda
