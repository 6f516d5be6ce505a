// The CPU reference: one readable function per MLA stage, Eigen, FP32. This is the specification every
// other engine is compared against (the comment on each function gives its math; docs/architecture.md the whole).
// Shapes use docs/dump-format.md's notation; Nl = heads held by this rank (N / tp). No fusion, no tricks.
#pragma once
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/tensor.h"

namespace mla::ref {

// y = x·Wᵀ. x [T, K], W [O, K] -> [T, O].
Tensor linear(const Tensor& x, const Tensor& w);
// y = x·Wᵀ viewed [T, Nl, A+B] (per head A lanes, then B lanes) and split into a [T, Nl, A] and b [T, Nl, B], each
// head's two parts computed as two products (head h's A rows of W, then its B rows) written where they belong.
void linear_per_head(const Tensor& x, const Tensor& w, int64_t Nl, int64_t A, int64_t B, Tensor& a, Tensor& b);
// Splits y [T, Nl·(A+B)] (per head A lanes, then B lanes) into a [T, Nl, A] and b [T, Nl, B].
void split_per_head(const Tensor& y, int64_t Nl, int64_t A, int64_t B, Tensor& a, Tensor& b);

// RMSNorm over the last axis in fp32: x / sqrt(mean(x²) + eps) · w. x [T, C], w [C].
// NormOptions plant the norm bugs of the zoo (docs/bugs.md); the defaults are the right norm.
struct NormOptions {
  bool weight = true;       // false: normalized but never multiplied by w (kv-norm-no-weight)
  int64_t width = 0;        // > 0: the mean square over the first `width` channels only (q-norm-width)
  int64_t weight_wrap = 0;  // > 0: channel c multiplied by w[c % weight_wrap] (kv-norm-weight-wrap)
};
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, const NormOptions& opt = {});

// q_a = x·W_qaᵀ [T, Lq] (q_a_proj); q_c = RMSNorm(q_a) (q_a_norm); then q_b_proj.
// q = q_c·W_qbᵀ viewed [T, Nl, P+R], split into q_nope [T, Nl, P] and q_pe [T, Nl, R].
// q_proj is the same split applied to x·W_qᵀ (no q LoRA).
struct QHeads {
  Tensor q_nope, q_pe;
};
QHeads q_b_proj(const Tensor& q_c, const Tensor& w_qb_local, const MlaConfig& cfg);

// kv_a = x·W_kvaᵀ [T, L+R] split into kv_c [T, L] and k_pe [T, R].
struct KvA {
  Tensor kv_c, k_pe;
};
KvA kv_a_proj(const Tensor& x, const Tensor& w_kva, const MlaConfig& cfg);

// Rotates the last axis (R lanes) of x [..., R] in place of a copy: lane pairs by `style`,
// angle = position · inv_freq_i, cos/sin multiplied by `cs_scale` (get_mscale ratio, 1.0 for every real model).
// `positions` has one entry per row of x's first axis; rows of inner axes (heads) share it.
Tensor rope(const Tensor& x, const std::vector<int>& positions, const std::vector<double>& inv_freq,
            double cs_scale, RopeStyle style);

// kv = kv_c_norm·W_kvbᵀ viewed [T, Nl, P+V]: k_nope = [..., :P], v = [..., P:].
struct KvB {
  Tensor k_nope, v;
};
KvB kv_b_proj(const Tensor& kv_c_norm, const Tensor& w_kvb_local, const MlaConfig& cfg);

// Writes rows [kv_c_norm | k_pe_rope] of the new tokens into the paged cache [blocks, 64, L+R];
// returns the rows written [T, L+R] (the kv_cache probe).
Tensor cache_write(Tensor& cache, const Batch& batch, const Tensor& kv_c_norm, const Tensor& k_pe_rope);

// Softmax attention of one query block against one key block, per head, natural-log LSE.
// q [Tq, Nl, Dk], k [Tk, Nl or 1, Dk] (1: shared by all heads), v [Tk, Nl or 1, Dv].
// Query i sees keys j <= i + (Tk - Tq) when causal (bottom-right alignment), all keys otherwise.
// An empty key set gives out 0 and lse -inf.
struct Attn {
  Tensor out;  // [Tq, Nl, Dv]
  Tensor lse;  // [Tq, Nl]
};
// Query rows are taken kAttendRowBlock at a time: each (head, block of rows) in flight, one a thread, holds a
// [kAttendRowBlock, <= Tk] score block.
inline constexpr int64_t kAttendRowBlock = 64;
// window > 0: each query sees only the last `window` of its visible keys (a sliding window; sliding-window in
// docs/bugs.md plants it).
Attn attend(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int window = 0);
// The same with each query and key in two parts, q = [q1 | q2] and k = [k1 | k2] along the last axis (the prefill
// form's nope and rope lanes, k2 [Tk, 1 or Nl, D2] or [Tk, D2]): scores q1·k1 + q2·k2, without joining the parts.
Attn attend(const Tensor& q1, const Tensor& q2, const Tensor& k1, const Tensor& k2, const Tensor& v, double scale,
            bool causal, int window = 0);

// LSE merge of two partial attentions over disjoint key sets (natural log): lse = ln(e^a + e^b),
// out = e^(a-lse)·out_a + e^(b-lse)·out_b.
// `base2` reads the LSEs as base 2 — a real bug (lse-base2, docs/bugs.md), kept here so the zoo can plant it.
Attn merge_lse(const Attn& a, const Attn& b, bool base2 = false);

// Prefill form: Q = [q_nope | q_pe_rope], K = [k_nope | k_pe_rope broadcast], V = v.
// New tokens attend causally among themselves; a sequence's cached context (from `cache`) is up-projected
// through W_kvb and attended non-causally, then merged by LSE. -> attn_out [T, Nl, V], lse [T, Nl].
// DSA's selection (the topk probe): per new token of the step, the keys it attends to, numbered within its sequence
// (key s: cached token s, or new token s − context); empty for a dense model.
using Selection = std::vector<std::vector<int>>;
struct MhaOptions {
  bool causal = true;      // false plants causal-off
  bool lse_base2 = false;  // true plants lse-base2 in the context merge
  int window = 0;          // > 0 plants sliding-window: each new token sees its last `window` new-token keys
  const Selection* keys = nullptr;  // DSA: each token attends to these keys only (softmax over them, no mask)
};
Attn attention_mha(const Tensor& q_nope, const Tensor& q_pe_rope, const Tensor& k_nope, const Tensor& k_pe_rope,
                   const Tensor& v, const Tensor& cache, const Batch& batch, const Tensor& w_kvb_local,
                   const MlaConfig& cfg, const MhaOptions& opt = {});

// q_latent_h = W_UK_hᵀ·q_nope_h. q_nope [T, Nl, P] -> [T, Nl, L]; W_UK_h = rows h(P+V)..h(P+V)+P-1 of W_kvb.
Tensor q_absorb(const Tensor& q_nope, const Tensor& w_kvb_local, const MlaConfig& cfg);

// Absorbed (MQA) form over the paged cache: query [q_latent | q_pe_rope] (L+R), one key/value row per
// cached token, value = its first L lanes; causal bottom-right. -> attn_latent [T, Nl, L], lse [T, Nl].
// keys (DSA): each token attends to its selected cache rows only.
Attn attention_mqa(const Tensor& q_latent, const Tensor& q_pe_rope, const Tensor& cache, const Batch& batch,
                   const MlaConfig& cfg, const Selection* keys = nullptr);

// attn_out_h = W_UV_h·attn_latent_h. [T, Nl, L] -> [T, Nl, V].
Tensor v_up(const Tensor& attn_latent, const Tensor& w_kvb_local, const MlaConfig& cfg);

// o_partial = attn_out.reshape(T, Nl·V)·W_o_localᵀ [T, H].
Tensor o_proj(const Tensor& attn_out, const Tensor& w_o_local);

// o = Σ_ranks o_partial.
Tensor all_reduce(const std::vector<const Tensor*>& partials);

// h_out = h + o.
Tensor residual(const Tensor& h, const Tensor& o);

// DSA (GLM-5, DeepSeek-V3.2; docs/mla.md): the lightning indexer scores every key a query sees and attention then
// reads only the index_topk best. The indexer's head is [rope lanes (R) | the rest], unlike MLA's [nope | rope].
// idx_q = (q_c·W_qbᵀ) viewed [T, Hi, Di], RoPE (`style`: interleaved for GLM-5, half-split for V3.2) on the first R
// = 2·inv_freq.size() lanes of each head.
Tensor indexer_q(const Tensor& q_c, const Tensor& wq_b, int64_t heads, const std::vector<int>& positions,
                 const std::vector<double>& inv_freq, RopeStyle style);
// idx_k = LayerNorm(x·W_kᵀ) [T, Di] (weight, bias, `eps`; biased variance), RoPE on its first R lanes.
// norm = false plants index-k-norm-skip (docs/bugs.md): the LayerNorm left out.
Tensor indexer_k(const Tensor& x, const Tensor& wk, const Tensor& norm_w, const Tensor& norm_b, double eps,
                 const std::vector<int>& positions, const std::vector<double>& inv_freq, RopeStyle style,
                 bool norm = true);
// idx_weights = x·W_wᵀ · Hi^-1/2 [T, Hi] (W_w: weights_proj [Hi, H]).
Tensor indexer_weights(const Tensor& x, const Tensor& weights_proj);
// scores [Tq, Tk]: Σ_h w[t,h] · ReLU(q[t,h]·k[s] · Di^-1/2) for every key s that query t sees (s ≤ t + Tk − Tq,
// causal bottom-right), −inf for the others. q [Tq, Hi, Di], k [Tk, Di], w [Tq, Hi].
Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w);
// Per query row of `scores`: its `k` visible keys of highest score, highest first, a tie to the lower key index;
// every visible key when it sees fewer (then DSA is dense attention).
std::vector<std::vector<int>> topk_keys(const Tensor& scores, int k);

// The indexer over a step's batch (the graph's stages; keys numbered within a sequence as in Selection):
// index_cache_write puts each new token's idx_k row [T, Di] into the paged index cache [blocks, 64, Di].
void index_cache_write(Tensor& index_cache, const Batch& batch, const Tensor& idx_k);
// idx_scores [T, K]: row t holds indexer_scores of token t against its sequence's keys (read from the index cache,
// this step's rows written), 0 for a key it does not see and past its sequence's last key.
struct ScoreOptions {
  bool weights = true;  // false plants index-weights-skip: every head weighs 1
  bool causal = true;   // false plants index-causal-leak: a token scores every key of its sequence
};
Tensor index_scores(const Tensor& idx_q, const Tensor& idx_weights, const Tensor& index_cache, const Batch& batch,
                    int64_t K, const ScoreOptions& opt = {});
// Per token, topk_keys over the keys it sees (Batch::keys_seen; every key of its sequence when `causal` is false) of
// its row of idx_scores, ascending.
Selection select_keys(const Tensor& idx_scores, const Batch& batch, int k, bool causal = true);
// The topk probe [T, k]: each token's keys ascending, −1 past the last. selection_of reads it back.
Tensor selection_tensor(const Selection& keys, int k);
Selection selection_of(const Tensor& topk);
// Softmax attention of each query over its selected keys only (keys[t]: indices into k's and v's first axis, any
// order): attend() over those rows; no selected key gives out 0 and lse −inf.
Attn attend_selected(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                     const std::vector<std::vector<int>>& keys);

// The cached rows of sequence b, gathered through the block table: [context_len + extra, L+R].
Tensor gather_cache_rows(const Tensor& cache, const Batch& batch, int b, int rows);

}  // namespace mla::ref
