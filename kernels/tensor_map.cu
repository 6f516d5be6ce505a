// tensor_map.cuh: the sm_90a check and TMA descriptors.
#include "kernels/tensor_map.cuh"

#include <cudaTypedefs.h>

#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/wgmma.cuh"  // MLA_SM90A

namespace mla::cuda {

namespace {

// 1 when the kernels were compiled for sm_90a (MLA_SM90A, as the Hopper kernels are guarded).
__global__ void sm90a_probe_kernel(int* out) {
#ifdef MLA_SM90A
  *out = 1;
#else
  *out = 0;
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  });
  return fn;
}

}  // namespace

bool sm90a_available(int device) {
  static std::mutex mu;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(device);
  if (it != known.end()) return it->second;
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  bool ok = major == 9 && minor == 0 && encode_fn() != nullptr;
  if (ok) {
    int prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    CUDA_CHECK(cudaSetDevice(device));
    int* d = nullptr;
    int h = 0;
    CUDA_CHECK(cudaMalloc(&d, sizeof(int)));
    sm90a_probe_kernel<<<1, 1>>>(d);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d));
    CUDA_CHECK(cudaSetDevice(prev));
    ok = h == 1;
  }
  known[device] = ok;
  return ok;
}

CUtensorMap tensor_map_bf16(const void* base, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                            const uint32_t* box, const char* what) {
  const auto encode = encode_fn();
  if (!encode) throw EngineError(std::string(what) + ": the driver has no cuTensorMapEncodeTiled (TMA)");
  CUtensorMap map{};
  cuuint64_t d[3] = {}, st[2] = {};
  cuuint32_t bx[3] = {}, elem[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    bx[i] = box[i];
    if (i + 1 < rank) st[i] = strides_bytes[i];
  }
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank),
                            const_cast<void*>(base), d, st, bx, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string shape;
    for (int i = rank - 1; i >= 0; --i) shape += std::to_string(dims[i]) + (i ? " x " : "");
    throw EngineError(std::string(what) + ": cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                      ") for a bf16 tensor of " + shape);
  }
  return map;
}

}  // namespace mla::cuda
