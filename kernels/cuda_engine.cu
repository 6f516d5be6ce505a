// The CUDA engine. This version is the shell: device discovery and clear errors; the stages arrive in
// the CUDA engine issue (one .cu/.cuh per stage beside this file).
#include "kernels/cuda_engine.h"

#include <cuda_runtime.h>

#include "harness/model/errors.h"
#include "kernels/cuda_check.cuh"

namespace mla {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

namespace {
class CudaEngine : public Engine {
 public:
  explicit CudaEngine(const std::map<std::string, std::string>& options) : options_(options) {
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, 0));
  }
  std::string name() const override { return "cuda"; }
  std::string options() const override { return ""; }
  std::string dtype() const override { return "bf16"; }
  std::string device() const override { return prop_.name; }
  void prepare(const RunContext&) override { unimplemented("prepare"); }
  void run_stage(const StageSpec& st, int, int) override { unimplemented(stage_name(st.stage)); }
  Tensor download(int, const std::string&) override { unimplemented("download"); }
  void upload(int, const std::string&, const Tensor&) override { unimplemented("upload"); }

 private:
  [[noreturn]] void unimplemented(const std::string& what) const {
    throw UsageError("cuda engine: " + what + " is not implemented yet in this build");
  }
  std::map<std::string, std::string> options_;
  cudaDeviceProp prop_{};
};
}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const std::map<std::string, std::string>& options) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0)
    throw UsageError(std::string("--engine cuda: no CUDA device is available (") +
                     (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") +
                     "); use --engine reference or --candidate reference:precision=bf16 on a CPU-only machine");
  return std::make_unique<CudaEngine>(options);
}

}  // namespace mla
