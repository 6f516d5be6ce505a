// One error-check header: every CUDA / cuBLAS / NCCL call goes through these and reports statement,
// function, file and line as an EngineError (exit 3).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/model/errors.h"

#ifdef MLA_WITH_NCCL
#include <nccl.h>
#endif

namespace mla::cuda {

[[noreturn]] inline void fail(const std::string& what, const char* stmt, const char* func, const char* file, int line) {
  throw EngineError(what + " in `" + stmt + "` (" + func + ", " + file + ":" + std::to_string(line) + ")");
}

}  // namespace mla::cuda

#define MLA_CHECK_IMPL(cond, what, stmt) \
  do {                                   \
    if (!(cond)) ::mla::cuda::fail(what, stmt, __func__, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK(x)                                                                         \
  do {                                                                                        \
    const cudaError_t mla_err_ = (x);                                                         \
    MLA_CHECK_IMPL(mla_err_ == cudaSuccess, std::string("CUDA error ") + cudaGetErrorName(mla_err_) + ": " + \
                   cudaGetErrorString(mla_err_), #x);                                          \
  } while (0)

#define CUBLAS_CHECK(x)                                                                       \
  do {                                                                                        \
    const cublasStatus_t mla_st_ = (x);                                                       \
    MLA_CHECK_IMPL(mla_st_ == CUBLAS_STATUS_SUCCESS, std::string("cuBLAS error ") + cublasGetStatusName(mla_st_), #x); \
  } while (0)

#ifdef MLA_WITH_NCCL
#define NCCL_CHECK(x)                                                                         \
  do {                                                                                        \
    const ncclResult_t mla_nr_ = (x);                                                         \
    MLA_CHECK_IMPL(mla_nr_ == ncclSuccess, std::string("NCCL error: ") + ncclGetErrorString(mla_nr_), #x); \
  } while (0)
#endif

// After a kernel launch: the launch itself (bad configuration) is checked at once.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
