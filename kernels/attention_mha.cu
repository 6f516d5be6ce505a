// attention_mha: new tokens causal among themselves, the context (cache rows up-projected through kv_b,
// rounded to bf16 like any GEMM output here) without a mask, then the LSE merge. D = P + R and V may
// differ (192/128 DeepSeek, 256/256 GLM-5). The same flow for every kernel, the attention of each key set by:
//   kernel = 3 or 2: the flash kernels of attention_flash.cu (tensor cores; 3 takes the
//     256-row, 32-rows-per-warp kernel for D ≤ 192 / V ≤ 128, wider dims and 2 the 128-row kernel); with no context
//     they write bf16 attn_out and lse directly, with context both parts go through the merge.
//   kernel = 4 (default, MhaArgs::kernel): the same flow with the Hopper flash kernel (attention_flash_wgmma.cu)
//     where it runs (an sm_90 GPU, an sm_90a build, D/V 192/128 or 256/256), else version 3.
//   kernel = 1 (the fallback the tests also run, and dims the flash kernels do not cover): the simple core of
//     attention_core.cuh, both parts through the merge.
// With a selection (MhaArgs::selection, DSA) the flash kernels mask both parts by its bitmaps instead of the causal
// mask; the simple core has no such mask.
#include <string>

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

// The keys and values the new tokens' queries attend to in one pass, each sequence's rows contiguous: the new tokens
// themselves (causal, and windowed where sliding-window is planted), or the sequence's cached context (no mask).
struct KeySet {
  AttnOperand k_nope, k_pe, v;
  const int* seq_start = nullptr;  // [B] first key row of each sequence
  const int* seq_len = nullptr;    // [B]
  int64_t rows = 0;                // rows of the key tensors
  bool causal = false;
  int window = 0;
  const uint32_t* keep = nullptr;  // a selection's bitmaps over these keys (FlashParams::keep)
  const int* keep_reach = nullptr;
  int keep_words = 0;
  const char* what = "";  // names the pass in the core kernel's errors
};

KeySet new_token_keys(const MhaArgs& a, const DeviceBatch& db) {
  KeySet k;
  k.k_nope = {a.k_nope, static_cast<int64_t>(a.Nl) * a.P, a.P};
  k.k_pe = {a.k_pe_rope, a.R, 0};
  k.v = {a.v, static_cast<int64_t>(a.Nl) * a.V, a.V};
  k.seq_start = db.i32(db.seq_new_start);
  k.seq_len = db.i32(db.seq_new_len);
  k.rows = a.T;
  k.causal = a.causal;
  k.window = a.window;
  if (a.selection) {
    k.causal = false;
    k.window = 0;
    k.keep = a.selection->keep_new;
    k.keep_reach = a.selection->reach_new;
    k.keep_words = a.selection->words_new;
  }
  k.what = "attention_mha";
  return k;
}

// The context's keys and values: the latent rows gathered from the cache, [kv_c_norm] up-projected through W_kvb
// into [k_nope | v] per head, k_pe from the rows. Also the scratch the context pass writes (out [rows, V], lse
// [rows]), taken here to keep the scratch buffers' order.
struct ContextPass {
  KeySet keys;
  float* out = nullptr;
  float* lse = nullptr;
};
ContextPass context_keys(const MhaArgs& a, RankContext& rc, int64_t rows) {
  const DeviceBatch& db = rc.batch();
  const int W = a.L + a.R;
  const int64_t C = db.ctx_total;
  bf16* ctx = rc.scratch_as<bf16>("mha.ctx_rows", C * W);
  bf16* up = rc.scratch_as<bf16>("mha.ctx_kv", C * a.Nl * (a.P + a.V));
  ContextPass c;
  c.out = rc.scratch_as<float>("mha.o_ctx", rows * a.V);
  c.lse = rc.scratch_as<float>("mha.lse_ctx", rows);
  gather_rows_kernel<<<static_cast<unsigned>(C), 128, 0, rc.stream()>>>(a.cache, db.i64(db.ctx_rows), ctx, W);
  CUDA_CHECK_LAUNCH();
  launch_kv_b_up(rc.cublas(), ctx, W, a.w_kvb, up, C, a.L, a.Nl, a.P, a.V);
  const int64_t up_row = static_cast<int64_t>(a.Nl) * (a.P + a.V);
  c.keys.k_nope = {up, up_row, a.P + a.V};
  c.keys.v = {up + a.P, up_row, a.P + a.V};
  c.keys.k_pe = {ctx + a.L, W, 0};
  c.keys.seq_start = db.i32(db.seq_ctx_start);
  c.keys.seq_len = db.i32(db.seq_ctx_len);
  c.keys.rows = C;
  c.keys.causal = false;
  c.keys.window = 0;  // the context is never windowed (docs/bugs.md: sliding-window)
  if (a.selection) {
    c.keys.keep = a.selection->keep_ctx;
    c.keys.keep_reach = a.selection->reach_ctx;
    c.keys.keep_words = a.selection->words_ctx;
  }
  c.keys.what = "attention_mha (context)";
  return c;
}

// The new tokens' queries over `keys` by the flash kernels: into out_bf16 when it is set, else out_f32; lse.
void attend_flash(const MhaArgs& a, const DeviceBatch& db, const KeySet& keys, bf16* out_bf16, float* out_f32,
                  float* lse, cudaStream_t s) {
  FlashParams p;
  p.q_nope = {a.q_nope, static_cast<int64_t>(a.Nl) * a.P, a.P};
  p.q_pe = {a.q_pe_rope, static_cast<int64_t>(a.Nl) * a.R, a.R};
  p.k_nope = keys.k_nope;
  p.k_pe = keys.k_pe;
  p.v = keys.v;
  p.P = a.P;
  p.R = a.R;
  p.V = a.V;
  p.heads = a.Nl;
  p.seqs = db.seqs;
  p.max_q_len = db.max_new;
  p.q_rows = a.T;
  p.k_rows = keys.rows;
  p.scale = a.scale;
  p.seq_q_start = db.i32(db.seq_new_start);
  p.seq_q_len = db.i32(db.seq_new_len);
  p.seq_k_start = keys.seq_start;
  p.seq_k_len = keys.seq_len;
  p.causal = keys.causal;
  p.window = keys.window;
  p.keep = keys.keep;
  p.keep_reach = keys.keep_reach;
  p.keep_words = keys.keep_words;
  p.version = a.kernel;  // 2, 3 or 4 (attention_flash.cu)
  p.out_bf16 = out_bf16;
  p.out_f32 = out_f32;
  p.lse = lse;
  launch_attention_flash(p, s);
}

// The same by the simple core, into fp32 out and lse.
void attend_core(const MhaArgs& a, const DeviceBatch& db, const KeySet& keys, float* out, float* lse,
                 cudaStream_t s) {
  AttnCoreParams p;
  p.q_nope = {a.q_nope, static_cast<int64_t>(a.Nl) * a.P, a.P};
  p.q_pe = {a.q_pe_rope, static_cast<int64_t>(a.Nl) * a.R, a.R};
  p.k_nope = keys.k_nope;
  p.k_pe = keys.k_pe;
  p.v = keys.v;
  p.nope_dim = a.P;
  p.pe_dim = a.R;
  p.v_dim = a.V;
  p.tokens = a.T;
  p.heads = a.Nl;
  p.scale = a.scale;
  p.token_seq = db.i32(db.token_seq);
  p.token_idx = db.i32(db.token_idx);
  p.seq_new_len = db.i32(db.seq_new_len);
  p.seq_key_len = keys.seq_len;
  p.seq_key_start = keys.seq_start;
  p.causal = keys.causal;
  p.window = keys.window;
  p.out = out;
  p.lse = lse;
  launch_attention_core<kNopePL, kPePL, kVPL>(p, s, keys.what);
}
}  // namespace

void launch_attention_mha(const MhaArgs& a, RankContext& rc) {
  const DeviceBatch& db = rc.batch();
  cudaStream_t s = rc.stream();
  const bool flash = a.kernel >= 2 && flash_supports(a.P, a.R, a.V);
  if (a.selection && !flash)
    throw EngineError("attention_mha: a selection runs on the flash kernels only (kernel " + std::to_string(a.kernel) +
                      ", head dims " + std::to_string(a.P) + " + " + std::to_string(a.R) + ", v " +
                      std::to_string(a.V) + ")");
  const int64_t rows = static_cast<int64_t>(a.T) * a.Nl;
  const KeySet fresh = new_token_keys(a, db);
  if (flash && db.ctx_total == 0) {  // no context to merge: the flash kernel writes the results
    attend_flash(a, db, fresh, a.attn_out, nullptr, a.lse, s);
    return;
  }
  float* o1 = rc.scratch_as<float>("mha.o_new", rows * a.V);
  float* l1 = rc.scratch_as<float>("mha.lse_new", rows);
  const auto attend = [&](const KeySet& keys, float* out, float* lse) {
    if (flash) attend_flash(a, db, keys, nullptr, out, lse, s);
    else attend_core(a, db, keys, out, lse, s);
  };
  attend(fresh, o1, l1);
  if (db.ctx_total == 0) {
    launch_attention_merge(o1, l1, nullptr, nullptr, a.attn_out, a.lse, rows, a.V, s);
    return;
  }
  const ContextPass ctx = context_keys(a, rc, rows);
  attend(ctx.keys, ctx.out, ctx.lse);
  launch_attention_merge(o1, l1, ctx.out, ctx.lse, a.attn_out, a.lse, rows, a.V, s,
                         a.lse_base2 && a.selection == nullptr);
}

}  // namespace mla::cuda
