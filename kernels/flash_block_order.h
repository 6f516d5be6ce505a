// attention_mha version 4's block order (kernels/attention_flash_wgmma.cu), plain C++ so that the CPU tests hold it.
//
// A block computes one query block of one head. Heads go in groups of head_group; within a group the query blocks
// come longest first (on the causal diagonal the last query block walks the most keys, so it starts first), the
// group's heads side by side. The blocks on the GPU at once then read the K and V of a few heads, which stay in L2;
// one query block of every head at once would read every head's K and V, which together do not fit, again for
// every wave of blocks.
#pragma once
#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define MLA_FLASH_ORDER_FN __host__ __device__ inline
#else
#define MLA_FLASH_ORDER_FN inline
#endif

namespace mla::cuda {

struct FlashBlock {
  int head = 0;
  int qblock = 0;  // query rows [qblock · block rows, (qblock + 1) · block rows) of its sequence
};

// Block `id` of heads · n_qblocks (one sequence's grid plane).
MLA_FLASH_ORDER_FN FlashBlock flash_block(int id, int n_qblocks, int heads, int head_group) {
  const int g0 = id / (head_group * n_qblocks) * head_group;  // the group's first head
  const int gh = head_group < heads - g0 ? head_group : heads - g0;  // heads in this group (the last may have fewer)
  const int rem = id - g0 * n_qblocks;
  return {g0 + rem % gh, n_qblocks - 1 - rem / gh};
}

// Heads per group: as many as keep their K and V (`keys` rows of P + V bf16 lanes a head) within half of L2, the
// rest of it left to the shared k_pe, Q and the outputs; at least 1, at most `heads`.
inline int flash_head_group(int64_t l2_bytes, int64_t keys, int P, int V, int heads) {
  const int64_t per_head = std::max<int64_t>(1, keys) * (P + V) * 2;
  return static_cast<int>(std::clamp<int64_t>(l2_bytes / 2 / per_head, 1, std::max(1, heads)));
}

}  // namespace mla::cuda

#undef MLA_FLASH_ORDER_FN
