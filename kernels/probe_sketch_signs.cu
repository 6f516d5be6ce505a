// The sketch's sign-bit table (probe_stats.cuh): for each column of a probe's shard and each of the 32 sketch lanes,
// one bit that is set when the sketch coefficient is −1/sqrt(32) (sketch_sign of core/probe/probe_hash.h), laid out
// (sign_bit) so that one word gives a tensor-core lane of the tile kernel its fragments. Built on the device once per
// (probe, column offset, width) and kept by the probe capture; device_sketch_coeffs decodes it for the tests.
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/probe_stats.cuh"
#include "kernels/probe_stats_device.cuh"

namespace mla::cuda {

namespace {
using namespace probe_device;

// Word (colgroup, g) of the sign-bit table: bit sign_bit(j, i) = 1 when the entry of column 8·colgroup + i,
// sketch lane g + 8j is −1/sqrt(32).
__global__ void sketch_sign_bits_kernel(uint64_t key, int64_t col0, int64_t cols, uint32_t* out) {
  const int64_t words = (cols + 7) / 8 * 8;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t group = w / 8;
    const int g = static_cast<int>(w % 8);
    uint32_t bits = 0;
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 8; ++i) {
        const int64_t col = group * 8 + i;
        if (col < cols && !sketch_sign(key, col0 + col, g + 8 * j)) bits |= 1u << sign_bit(j, i);
      }
    out[w] = bits;
  }
}
}  // namespace

size_t sketch_sign_bits_words(int64_t cols) { return static_cast<size_t>((cols + 7) / 8 * 8); }

void launch_sketch_sign_bits(uint64_t key, int64_t col0, int64_t cols, uint32_t* bits, cudaStream_t stream) {
  if (cols == 0) return;
  sketch_sign_bits_kernel<<<128, 256, 0, stream>>>(key, col0, cols, bits);
  CUDA_CHECK_LAUNCH();
}

std::vector<float> device_sketch_coeffs(uint64_t key, int64_t col0, int64_t cols) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::vector<uint32_t> bits(sketch_sign_bits_words(cols));
  DeviceBuffer buf(dev, bits.size() * sizeof(uint32_t));
  launch_sketch_sign_bits(key, col0, cols, static_cast<uint32_t*>(buf.get()), nullptr);
  CUDA_CHECK(cudaMemcpy(bits.data(), buf.get(), bits.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  std::vector<float> coeffs(static_cast<size_t>(cols) * kSketchLanes);
  for (int64_t c = 0; c < cols; ++c)
    for (int k = 0; k < kSketchLanes; ++k) {
      const bool negative = (bits[(c / 8) * 8 + k % 8] >> sign_bit(k / 8, c % 8)) & 1u;
      coeffs[c * kSketchLanes + k] = negative ? -kSketchScale : kSketchScale;
    }
  return coeffs;
}

}  // namespace mla::cuda
