// The work of a stage, counted for the benchmark's figures: its FLOPs (stage_flops) and the fewest bytes it moves
// (stage_bytes), from the model's dimensions and the batch's token and key counts.
#include "harness/run/bench.h"

#include <algorithm>

namespace mla {

namespace {
// The (token, key) pairs attention computes: every key a token sees (causal), or with DSA the index_topk it selects
// among them. `dense` counts every key a token sees whatever the model (the indexer's scores).
double attended_pairs(const MlaConfig& c, const Batch& batch, bool dense = false) {
  double pairs = 0;
  for (int t = 0; t < batch.tokens(); ++t) {
    const double seen = batch.keys_seen(t);
    pairs += c.has_dsa() && !dense ? std::min(seen, static_cast<double>(c.index_topk)) : seen;
  }
  return pairs;
}
}  // namespace

double stage_bytes(Stage stage, const MlaConfig& c, const RunSpec& spec, const Batch& batch) {
  const double T = batch.tokens(), H = c.hidden, tp = spec.tp, Nl = c.heads / spec.tp, Lq = c.q_lora_rank;
  const double L = c.kv_lora_rank, R = c.qk_rope, P = c.qk_nope, V = c.v_head, D = c.qk_head(), W = L + R;
  const double Hi = c.index_n_heads, Di = c.index_head_dim, K = c.has_dsa() ? spec.graph_shape().keys : 0;
  double ctx = 0, total = 0;
  for (int b = 0; b < batch.num_seqs(); ++b) {
    ctx += batch.context_lens[b];
    total += batch.context_lens[b] + batch.new_lens[b];
  }
  // Cache rows attention_mqa reads: each sequence's once; with DSA each token's selected rows.
  const double mqa_rows = c.has_dsa() ? attended_pairs(c, batch) : total;
  constexpr double e = 2;  // bf16
  double rank = 0;         // one rank's bytes
  switch (stage) {
    case Stage::Stage_input_norm: rank = e * (2 * T * H + H); break;
    case Stage::Stage_q_a_proj: rank = e * (T * H + Lq * H + T * Lq); break;
    case Stage::Stage_q_a_norm: rank = e * (2 * T * Lq + Lq); break;
    case Stage::Stage_q_b_proj: rank = e * (T * Lq + Nl * D * Lq + T * Nl * D); break;
    case Stage::Stage_q_proj: rank = e * (T * H + Nl * D * H + T * Nl * D); break;
    case Stage::Stage_kv_a_proj: rank = e * (T * H + W * H + T * W); break;
    case Stage::Stage_kv_a_norm: rank = e * (2 * T * L + L); break;
    case Stage::Stage_rope: rank = e * 2 * (T * Nl * R + T * R); break;
    case Stage::Stage_cache_write: rank = e * 3 * T * W; break;  // read kv_c_norm | k_pe_rope; write cache + rows
    case Stage::Stage_kv_b_proj: rank = e * (T * L + Nl * (P + V) * L + T * Nl * (P + V)); break;
    case Stage::Stage_attention_mha:
      rank = e * (T * Nl * D + T * Nl * P + T * R + 2 * T * Nl * V) + 4 * T * Nl +
             (ctx > 0 ? e * (ctx * W + Nl * (P + V) * L + ctx * Nl * (P + V)) : 0);
      break;
    case Stage::Stage_q_absorb: rank = e * (T * Nl * P + Nl * P * L + T * Nl * L); break;
    case Stage::Stage_attention_mqa: rank = e * (mqa_rows * W + T * Nl * W + T * Nl * L) + 4 * T * Nl; break;
    case Stage::Stage_indexer_q: rank = e * (T * Lq + Hi * Di * Lq + T * Hi * Di); break;
    case Stage::Stage_indexer_k: rank = e * (T * H + Di * H + 2 * T * Di); break;  // idx_k and its cache rows
    case Stage::Stage_indexer_weights: rank = e * (T * H + Hi * H + T * Hi); break;
    case Stage::Stage_index_scores: rank = e * (T * Hi * Di + T * Hi + total * Di) + 4 * T * K; break;
    case Stage::Stage_topk: rank = 4 * T * K + 4 * T * c.index_topk; break;
    case Stage::Stage_v_up: rank = e * (T * Nl * L + Nl * V * L + T * Nl * V); break;
    case Stage::Stage_o_proj: rank = e * (T * Nl * V + H * Nl * V + T * H); break;
    case Stage::Stage_all_reduce: rank = e * (tp * T * H + T * H); break;
    case Stage::Stage_residual: rank = e * 3 * T * H; break;
    default: rank = 0;
  }
  return rank * tp;
}

double stage_flops(Stage stage, const MlaConfig& c, const RunSpec& spec, const Batch& batch) {
  const double T = batch.tokens(), H = c.hidden, N = c.heads, tp = spec.tp, Lq = c.q_lora_rank;
  const double L = c.kv_lora_rank, R = c.qk_rope, P = c.qk_nope, V = c.v_head, D = c.qk_head();
  // Keys the queries attend to (attended_pairs: causal bottom-right, or DSA's selection), and the context's
  // up-projection in the MHA form.
  const auto attention = [&](double per_pair, bool up_project_context) {
    double f = per_pair * attended_pairs(c, batch);
    for (int b = 0; b < batch.num_seqs() && up_project_context; ++b) f += 2 * batch.context_lens[b] * L * N * (P + V);
    return f;
  };
  const double Hi = c.index_n_heads, Di = c.index_head_dim;
  switch (stage) {
    case Stage::Stage_q_a_proj: return tp * 2 * T * H * Lq;  // replicated: every rank computes it
    case Stage::Stage_q_b_proj: return 2 * T * Lq * N * D;
    case Stage::Stage_q_proj: return 2 * T * H * N * D;
    case Stage::Stage_kv_a_proj: return tp * 2 * T * H * (L + R);
    case Stage::Stage_kv_b_proj: return 2 * T * L * N * (P + V);
    case Stage::Stage_attention_mha: return attention(2 * N * (D + V), true);
    case Stage::Stage_q_absorb: return 2 * T * N * P * L;
    case Stage::Stage_attention_mqa: return attention(2 * N * ((L + R) + L), false);
    case Stage::Stage_v_up: return 2 * T * N * L * V;
    case Stage::Stage_o_proj: return 2 * T * N * V * H;
    // DSA's indexer: replicated, every rank computes it.
    case Stage::Stage_indexer_q: return tp * 2 * T * Lq * Hi * Di;
    case Stage::Stage_indexer_k: return tp * 2 * T * H * Di;
    case Stage::Stage_indexer_weights: return tp * 2 * T * H * Hi;
    case Stage::Stage_index_scores: return tp * 2 * Hi * Di * attended_pairs(c, batch, /*dense=*/true);
    default: return 0;
  }
}

}  // namespace mla
