// LSE merge of two partial attentions over disjoint key sets (lse = ln(e^a + e^b), out = e^(a-lse)·out_a +
// e^(b-lse)·out_b), and the final conversion of
// an fp32 attention output to bf16.
#pragma once
#include <cuda_runtime.h>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

// rows = T·Nl. o1 [rows, Dv], lse1 [rows] (natural log); o2/lse2 the second part or nullptr (then out = o1).
// m = max(lse1, lse2); w1 = e^(lse1−m) / (e^(lse1−m) + e^(lse2−m)); out = w1·o1 + (1−w1)·o2;
// lse = m + log(e^(lse1−m) + e^(lse2−m)); both parts empty: out 0, lse −inf.
// base2 = true plants lse-base2 (docs/bugs.md): the natural-log LSEs are read as base 2 (2^x and log2 in place of
// e^x and log), the SGLang/FlashInfer merge bug. Only rows with two non-empty parts change.
void launch_attention_merge(const float* o1, const float* lse1, const float* o2, const float* lse2, bf16* out,
                            float* lse, int64_t rows, int Dv, cudaStream_t stream, bool base2 = false);

}  // namespace mla::cuda
