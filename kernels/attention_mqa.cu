// attention_mqa: the absorbed form over the paged cache (causal, bottom-right: query i of s_q sees
// context + i + 1 rows).
//   version 3 (MqaArgs::kernel = 3; the default where it can run): split-KV on Hopper's wgmma with TMA loads
//     (attention_mqa_wgmma.cu).
//   version 2 (MqaArgs::kernel = 2; the default elsewhere): the same plan on mma.sync, plus a combine pass
//     (attention_mqa_split.cu).
//   version 1 (kernel = 1, the fallback the tests also run): the simple core of attention_core.cuh, then the
//     fp32 -> bf16 conversion.
#include "kernels/attention_core.cuh"
#include "kernels/attention_merge.cuh"
#include "kernels/attention_mqa.cuh"
#include "kernels/attention_mqa_split.cuh"
#include "kernels/tensor_map.cuh"

namespace mla::cuda {

namespace {
constexpr int kNopePL = 16, kPePL = 2, kVPL = 16;  // L ≤ 512, R ≤ 64
}

void launch_attention_mqa(const MqaArgs& a, RankContext& rc) {
  const int kernel = a.kernel != 0 ? a.kernel : sm90a_available(rc.device()) ? 3 : 2;
  if (kernel >= 2 && mqa_split_supports(a.L, a.R)) {
    MqaSplitParams p;
    p.q_latent = a.q_latent;
    p.q_pe = a.q_pe_rope;
    p.cache = a.cache;
    p.block_table = a.block_table;
    p.L = a.L;
    p.R = a.R;
    p.heads = a.Nl;
    p.tokens = a.T;
    p.scale = a.scale;
    p.out = a.attn_latent;
    p.lse = a.lse;
    p.cache_rows = a.cache_rows;
    if (kernel == 3) launch_attention_mqa_wgmma(p, rc);
    else launch_attention_mqa_split(p, rc);
    return;
  }
  const DeviceBatch& db = rc.batch();
  const int64_t rows = static_cast<int64_t>(a.T) * a.Nl;
  const int W = a.L + a.R;
  float* o = rc.scratch_as<float>("mqa.o", rows * a.L);
  float* l = rc.scratch_as<float>("mqa.lse", rows);
  AttnCoreParams p;
  p.q_nope = {a.q_latent, static_cast<int64_t>(a.Nl) * a.L, a.L};
  p.q_pe = {a.q_pe_rope, static_cast<int64_t>(a.Nl) * a.R, a.R};
  p.k_nope = {a.cache, W, 0};
  p.k_pe = {a.cache + a.L, W, 0};
  p.v = {a.cache, W, 0};
  p.nope_dim = a.L;
  p.pe_dim = a.R;
  p.v_dim = a.L;
  p.tokens = a.T;
  p.heads = a.Nl;
  p.scale = a.scale;
  p.token_seq = db.i32(db.token_seq);
  p.token_idx = db.i32(db.token_idx);
  p.seq_new_len = db.i32(db.seq_new_len);
  p.seq_key_len = db.i32(db.seq_total_len);
  p.block_table = a.block_table ? a.block_table : db.i32(db.block_table);
  p.max_blocks = db.max_blocks;
  p.causal = true;
  p.out = o;
  p.lse = l;
  launch_attention_core<kNopePL, kPePL, kVPL>(p, rc.stream(), "attention_mqa");
  launch_attention_merge(o, l, nullptr, nullptr, a.attn_latent, a.lse, rows, a.L, rc.stream());
}

}  // namespace mla::cuda
