// attention_mha: new tokens causal among themselves, the context (cache rows up-projected through kv_b,
// rounded to bf16 like any GEMM output here) without a mask, then the LSE merge. D = P + R and V may
// differ (192/128 DeepSeek, 256/256 GLM-5).
//   version 3 (default, MhaArgs::kernel = 3): version 2's flow with the 256-row, 32-rows-per-warp flash kernel
//     for D ≤ 192 / V ≤ 128 (wider dims run version 2's kernel).
//   version 2 (kernel = 2): the flash kernel of attention_flash.cu (tensor cores, 128-row blocks); with no
//     context it writes bf16 attn_out and lse directly, with context both parts go through the merge.
//   version 1 (kernel = 1, the fallback the tests also run): the simple core of attention_core.cuh twice.
#include "kernels/attention_core.cuh"
#include "kernels/attention_flash.cuh"
#include "kernels/attention_merge.cuh"
#include "kernels/attention_mha.cuh"
#include "kernels/kv_b_proj.cuh"

namespace mla::cuda {

namespace {
constexpr int kNopePL = 8, kPePL = 2, kVPL = 8;  // P ≤ 256, R ≤ 64, V ≤ 256

// rows [n, W] <- cache rows ctx_rows[i] (whole latent rows).
__global__ void gather_rows_kernel(const bf16* __restrict__ cache, const int64_t* __restrict__ ctx_rows,
                                   bf16* __restrict__ rows, int W) {
  const int64_t i = blockIdx.x;
  const bf16* src = cache + ctx_rows[i] * W;
  for (int d = threadIdx.x; d < W; d += blockDim.x) rows[i * W + d] = src[d];
}
}  // namespace

// Version 2. The batch's sequences are contiguous runs of new tokens (seq_new_start/len); their gathered
// context rows are contiguous too (seq_ctx_start/len).
void launch_attention_mha_flash(const MhaArgs& a, RankContext& rc) {
  const DeviceBatch& db = rc.batch();
  cudaStream_t s = rc.stream();
  const int64_t rows = static_cast<int64_t>(a.T) * a.Nl;
  FlashParams p;
  p.q_nope = {a.q_nope, static_cast<int64_t>(a.Nl) * a.P, a.P};
  p.q_pe = {a.q_pe_rope, static_cast<int64_t>(a.Nl) * a.R, a.R};
  p.k_nope = {a.k_nope, static_cast<int64_t>(a.Nl) * a.P, a.P};
  p.k_pe = {a.k_pe_rope, a.R, 0};
  p.v = {a.v, static_cast<int64_t>(a.Nl) * a.V, a.V};
  p.P = a.P;
  p.R = a.R;
  p.V = a.V;
  p.heads = a.Nl;
  p.seqs = db.seqs;
  p.max_q_len = db.max_new;
  p.scale = a.scale;
  p.seq_q_start = db.i32(db.seq_new_start);
  p.seq_q_len = db.i32(db.seq_new_len);
  p.seq_k_start = db.i32(db.seq_new_start);
  p.seq_k_len = db.i32(db.seq_new_len);
  p.causal = a.causal;
  p.window = a.window;
  p.version = a.kernel;  // 2 or 3 (attention_flash.cu)
  if (db.ctx_total == 0) {
    p.out_bf16 = a.attn_out;
    p.lse = a.lse;
    launch_attention_flash(p, s);
    return;
  }
  float* o1 = rc.scratch_as<float>("mha.o_new", rows * a.V);
  float* l1 = rc.scratch_as<float>("mha.lse_new", rows);
  p.out_f32 = o1;
  p.lse = l1;
  launch_attention_flash(p, s);

  const int W = a.L + a.R;
  const int64_t C = db.ctx_total;
  bf16* ctx = rc.scratch_as<bf16>("mha.ctx_rows", C * W);
  bf16* up = rc.scratch_as<bf16>("mha.ctx_kv", C * a.Nl * (a.P + a.V));
  float* o2 = rc.scratch_as<float>("mha.o_ctx", rows * a.V);
  float* l2 = rc.scratch_as<float>("mha.lse_ctx", rows);
  gather_rows_kernel<<<static_cast<unsigned>(C), 128, 0, s>>>(a.cache, db.i64(db.ctx_rows), ctx, W);
  CUDA_CHECK_LAUNCH();
  launch_kv_b_up(rc.cublas(), ctx, W, a.w_kvb, up, C, a.L, a.Nl, a.P, a.V);
  const int64_t up_row = static_cast<int64_t>(a.Nl) * (a.P + a.V);
  p.k_nope = {up, up_row, a.P + a.V};
  p.v = {up + a.P, up_row, a.P + a.V};
  p.k_pe = {ctx + a.L, W, 0};
  p.seq_k_start = db.i32(db.seq_ctx_start);
  p.seq_k_len = db.i32(db.seq_ctx_len);
  p.causal = false;
  p.window = 0;  // the context is never windowed (docs/bugs.md: sliding-window)
  p.out_f32 = o2;
  p.lse = l2;
  launch_attention_flash(p, s);
  launch_attention_merge(o1, l1, o2, l2, a.attn_out, a.lse, rows, a.V, s, a.lse_base2);
}

void launch_attention_mha(const MhaArgs& a, RankContext& rc) {
  if (a.kernel >= 2 && flash_supports(a.P, a.R, a.V)) {
    launch_attention_mha_flash(a, rc);
    return;
  }
  const DeviceBatch& db = rc.batch();
  cudaStream_t s = rc.stream();
  const int64_t rows = static_cast<int64_t>(a.T) * a.Nl;
  float* o1 = rc.scratch_as<float>("mha.o_new", rows * a.V);
  float* l1 = rc.scratch_as<float>("mha.lse_new", rows);

  AttnCoreParams p;
  p.q_nope = {a.q_nope, static_cast<int64_t>(a.Nl) * a.P, a.P};
  p.q_pe = {a.q_pe_rope, static_cast<int64_t>(a.Nl) * a.R, a.R};
  p.k_nope = {a.k_nope, static_cast<int64_t>(a.Nl) * a.P, a.P};
  p.k_pe = {a.k_pe_rope, a.R, 0};
  p.v = {a.v, static_cast<int64_t>(a.Nl) * a.V, a.V};
  p.nope_dim = a.P;
  p.pe_dim = a.R;
  p.v_dim = a.V;
  p.tokens = a.T;
  p.heads = a.Nl;
  p.scale = a.scale;
  p.token_seq = db.i32(db.token_seq);
  p.token_idx = db.i32(db.token_idx);
  p.seq_new_len = db.i32(db.seq_new_len);
  p.seq_key_len = db.i32(db.seq_new_len);
  p.seq_key_start = db.i32(db.seq_new_start);
  p.causal = a.causal;
  p.window = a.window;
  p.out = o1;
  p.lse = l1;
  launch_attention_core<kNopePL, kPePL, kVPL>(p, s, "attention_mha");

  if (db.ctx_total == 0) {
    launch_attention_merge(o1, l1, nullptr, nullptr, a.attn_out, a.lse, rows, a.V, s);
    return;
  }
  // Context: gather the latent rows, up-project [kv_c_norm] through W_kvb, attend with k_pe from the rows.
  const int W = a.L + a.R;
  const int64_t C = db.ctx_total;
  bf16* ctx = rc.scratch_as<bf16>("mha.ctx_rows", C * W);
  bf16* up = rc.scratch_as<bf16>("mha.ctx_kv", C * a.Nl * (a.P + a.V));
  float* o2 = rc.scratch_as<float>("mha.o_ctx", rows * a.V);
  float* l2 = rc.scratch_as<float>("mha.lse_ctx", rows);
  gather_rows_kernel<<<static_cast<unsigned>(C), 128, 0, s>>>(a.cache, db.i64(db.ctx_rows), ctx, W);
  CUDA_CHECK_LAUNCH();
  launch_kv_b_up(rc.cublas(), ctx, W, a.w_kvb, up, C, a.L, a.Nl, a.P, a.V);
  const int64_t up_row = static_cast<int64_t>(a.Nl) * (a.P + a.V);
  p.k_nope = {up, up_row, a.P + a.V};
  p.v = {up + a.P, up_row, a.P + a.V};
  p.k_pe = {ctx + a.L, W, 0};
  p.seq_key_len = db.i32(db.seq_ctx_len);
  p.seq_key_start = db.i32(db.seq_ctx_start);
  p.causal = false;
  p.window = 0;
  p.out = o2;
  p.lse = l2;
  launch_attention_core<kNopePL, kPePL, kVPL>(p, s, "attention_mha (context)");
  launch_attention_merge(o1, l1, o2, l2, a.attn_out, a.lse, rows, a.V, s, a.lse_base2);
}

}  // namespace mla::cuda
