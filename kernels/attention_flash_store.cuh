// The epilogue the flash kernels of attention_mha share (attention_flash.cu, attention_flash_wgmma.cu).
#pragma once
#include <cuda_bf16.h>

#include <cmath>

#include "kernels/attention_flash.cuh"

namespace mla::cuda {

// A query row's results from a warp's O accumulators, shared by the flash kernels: `o` is the row's 16-row MMA atom
// (n-tiles of 8 columns; hf: the row is the fragment's g (0) or g + 8 (1)), `l` the row's sum of exponentials
// (summed over its quad), the output O / l (0 where l is 0: no visible key) at token q_row0 + row, head `h`, as bf16
// or fp32 (FlashParams::out_bf16 / out_f32), two columns a store where `pair` (V even), and the lse, lse_of(l) where
// l > 0 else −inf, by the quad's lane t4 = 0.
template <int NV, class LseOf>
__device__ __forceinline__ void store_row(const FlashParams& p, int h, int64_t q_row0, int row,
                                          const float (&o)[NV][4], int hf, float l, bool pair, int t4, LseOf lse_of) {
  const float inv = l > 0.f ? 1.0f / l : 0.f;
  const int64_t tok = q_row0 + row;
  const int64_t base = (tok * p.heads + h) * p.V;
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    const int col = v * 8 + 2 * t4;
    if (col >= p.V) continue;
    const float x0 = o[v][2 * hf] * inv, x1 = o[v][2 * hf + 1] * inv;
    if (p.out_bf16) {
      if (pair) {
        *reinterpret_cast<__nv_bfloat162*>(p.out_bf16 + base + col) = __floats2bfloat162_rn(x0, x1);
      } else {
        p.out_bf16[base + col] = __float2bfloat16_rn(x0);
        if (col + 1 < p.V) p.out_bf16[base + col + 1] = __float2bfloat16_rn(x1);
      }
    } else {
      if (pair) {
        *reinterpret_cast<float2*>(p.out_f32 + base + col) = make_float2(x0, x1);
      } else {
        p.out_f32[base + col] = x0;
        if (col + 1 < p.V) p.out_f32[base + col + 1] = x1;
      }
    }
  }
  if (t4 == 0) p.lse[tok * p.heads + h] = l > 0.f ? lse_of(l) : -INFINITY;
}

}  // namespace mla::cuda
