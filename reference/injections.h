// Planted bugs of the reference engine (docs/bugs.md) that are not a parameter of a stage function: each is
// the wrong variant of one stage, written out so the zoo can plant it. Nothing else may call these.
#pragma once
#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/tensor.h"
#include "reference/stages.h"

namespace mla::ref::bug {

// kv-b-split: kv_b_proj's output split as [all heads' k_nope | all heads' v] instead of per head.
KvB kv_b_proj_split_by_block(const Tensor& kv_c_norm, const Tensor& w_kvb_local, const MlaConfig& cfg);

// wuk-transpose: W_UK_h's [P, L] memory read as [L, P].
Tensor q_absorb_wuk_transposed(const Tensor& q_nope, const Tensor& w_kvb_local, const MlaConfig& cfg);

// o-proj-half-heads: o_proj's reduction length K = Nl·V / 2 (a wrong K): only the first half of the heads summed.
Tensor o_proj_half_reduction(const Tensor& attn_out, const Tensor& w_o_local);

// v-up-head: v_up with the last local head reading head Nl-2's W_UV (an off-by-one in a head index).
Tensor v_up_last_head_from_previous(const Tensor& attn_latent, const Tensor& w_kvb_local, const MlaConfig& cfg);

// kv-a-rows-tile: kv_a_proj launched over whole tiles of `tile` rows (M = T / tile · tile): the tail rows of its
// outputs never written, left as the zeroing allocator gave them.
KvA kv_a_proj_whole_tiles(const Tensor& x, const Tensor& w_kva, const MlaConfig& cfg, int64_t tile);

// page-off-by-one: the block table as a kernel that reads block_table[b][j+1] for j >= 1 sees it.
Batch shift_block_table(const Batch& batch);

}  // namespace mla::ref::bug
