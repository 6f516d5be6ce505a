// The rope kernel's two loops: two lane pairs a thread with 4- and 8-byte accesses (an even R/2 and 8-byte aligned
// tensors) and one pair a thread (an odd R/2, or tensors at an odd element offset) give the same bits, and both are
// the reference's rotation: cos and sin of the double angle rounded to float, each product rounded, no fused
// multiply-add, the result rounded to bf16 once.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/model/tensor.h"  // to_bf16_bits, from_bf16_bits
#include "kernels/rope.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace mla::gputest {
namespace {

// Runs launch_rope on x placed `offset` elements past a 256-byte aligned allocation (offset 1: misaligned).
std::vector<uint16_t> run_rope(const std::vector<uint16_t>& x, const std::vector<int>& pos,
                               const std::vector<double>& inv, int64_t T, int64_t rows, int R, bool neox, int offset) {
  const size_t n = x.size();
  void *dx = nullptr, *dy = nullptr, *dpos = nullptr, *dinv = nullptr;
  EXPECT_EQ(cudaMalloc(&dx, (n + 8) * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dy, (n + 8) * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dpos, pos.size() * sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dinv, inv.size() * sizeof(double)), cudaSuccess);
  auto* xb = static_cast<uint16_t*>(dx) + offset;
  auto* yb = static_cast<uint16_t*>(dy) + offset;
  EXPECT_EQ(cudaMemcpy(xb, x.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dpos, pos.data(), pos.size() * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dinv, inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice), cudaSuccess);
  cuda::launch_rope(reinterpret_cast<const cuda::bf16*>(xb), reinterpret_cast<cuda::bf16*>(yb), T, rows, R,
                    static_cast<const int*>(dpos), static_cast<const double*>(dinv), 1.25, neox, nullptr);
  std::vector<uint16_t> y(n);
  EXPECT_EQ(cudaMemcpy(y.data(), yb, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (void* p : {dx, dy, dpos, dinv}) cudaFree(p);
  return y;
}

TEST(CudaRope, BothLoopsGiveTheReferencesRotation) {
  MLA_REQUIRE_GPU();
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const int R : {64, 8, 6}) {  // DeepSeek's width, tiny's, and an odd number of pairs (R/2 = 3)
    for (const bool neox : {false, true}) {
      const int64_t T = 37, rows = 5, half = R / 2;
      std::vector<uint16_t> x(static_cast<size_t>(T * rows * R));
      for (auto& v : x) v = to_bf16_bits(normal(gen));
      std::vector<int> pos(T);
      for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int>(t * 977 + 3);
      std::vector<double> inv(half);
      for (int64_t p = 0; p < half; ++p) inv[p] = std::pow(10000.0, -2.0 * p / R);
      const auto wide = run_rope(x, pos, inv, T, rows, R, neox, 0);
      const auto narrow = run_rope(x, pos, inv, T, rows, R, neox, 1);
      int64_t differ = 0, off = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t p = 0; p < half; ++p) {
            const int64_t base = (t * rows + r) * R;
            const int64_t a = base + (neox ? p : 2 * p), b = base + (neox ? p + half : 2 * p + 1);
            const double angle = static_cast<double>(pos[t]) * inv[p];
            const float c = static_cast<float>(std::cos(angle) * 1.25), s = static_cast<float>(std::sin(angle) * 1.25);
            const float va = from_bf16_bits(x[a]), vb = from_bf16_bits(x[b]);
            const volatile float ac = va * c, bs = vb * s, as = va * s, bc = vb * c;  // each product rounded
            const uint16_t ya = to_bf16_bits(ac - bs), yb = to_bf16_bits(as + bc);
            differ += (wide[a] != narrow[a]) + (wide[b] != narrow[b]);
            // cos and sin in double may differ in their last bit or two between the host's library and the device's.
            // That moves the float cos or sin only when it lies within ~2^-52 of a float rounding boundary (about
            // 2^-28 of values), and then the bf16 result by one step at most: a count of one in a thousand is far
            // above that chance and far below a wrong rotation, which is off almost everywhere.
            for (const auto& [got, want] : {std::pair{wide[a], ya}, std::pair{wide[b], yb}})
              if (got != want) {
                ++off;
                EXPECT_LE(std::abs(static_cast<int>(got) - static_cast<int>(want)), 1) << "R " << R << " t " << t;
              }
          }
      EXPECT_EQ(differ, 0) << "R " << R << (neox ? " neox" : " interleaved") << ": the two loops differ";
      EXPECT_LE(off, T * rows * R / 1000) << "R " << R << (neox ? " neox" : " interleaved");
    }
  }
}

}  // namespace
}  // namespace mla::gputest
