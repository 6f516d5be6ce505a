// Softmax attention: the shared core `attend`, the LSE merge, and both forms.
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "core/model/errors.h"
#include "reference/parallel_for.h"
#include "reference/stages.h"

namespace mla::ref {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows [t0, t0+n) of x [T, X...] as a tensor [n, X...].
Tensor rows_of(const Tensor& x, int64_t t0, int64_t n) {
  auto shape = x.shape;
  const int64_t per = x.numel() / x.dim(0);
  shape[0] = n;
  Tensor out(shape);
  std::memcpy(out.ptr(), x.ptr() + t0 * per, sizeof(float) * n * per);
  return out;
}

// [T, n, A] ++ [T, n or 1, B] along the last axis -> [T, n, A+B] (a 1 in b's middle axis broadcasts).
Tensor concat_last(const Tensor& a, const Tensor& b) {
  const int64_t T = a.dim(0), n = a.dim(1), A = a.dim(2), B = b.dim(-1);
  const bool bcast = b.rank() == 2 || b.dim(1) == 1;
  Tensor out({T, n, A + B});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n; ++h) {
      float* dst = out.ptr() + (t * n + h) * (A + B);
      std::memcpy(dst, a.ptr() + (t * n + h) * A, sizeof(float) * A);
      std::memcpy(dst + A, b.ptr() + (bcast ? t : t * n + h) * B, sizeof(float) * B);
    }
  return out;
}

// a [n, X...] above b [m, X...] -> [n + m, X...].
Tensor stack_rows(const Tensor& a, const Tensor& b) {
  auto shape = a.shape;
  shape[0] += b.dim(0);
  Tensor out(shape);
  std::memcpy(out.ptr(), a.ptr(), sizeof(float) * a.numel());
  std::memcpy(out.ptr() + a.numel(), b.ptr(), sizeof(float) * b.numel());
  return out;
}

void copy_rows_into(Attn& dst, const Attn& src, int64_t t0) {
  std::memcpy(dst.out.ptr() + t0 * (src.out.numel() / std::max<int64_t>(src.out.dim(0), 1)), src.out.ptr(),
              sizeof(float) * src.out.numel());
  std::memcpy(dst.lse.ptr() + t0 * (src.lse.numel() / std::max<int64_t>(src.lse.dim(0), 1)), src.lse.ptr(),
              sizeof(float) * src.lse.numel());
}
}  // namespace

namespace {
// attend() with the queries and keys in one part (q2, k2 null) or two.
Attn attend_parts(const Tensor& q, const Tensor* q2, const Tensor& k, const Tensor* k2, const Tensor& v, double scale,
                  bool causal, int window) {
  const int64_t Tq = q.dim(0), Nl = q.dim(1), Dk = q.dim(2), Tk = k.dim(0), Dv = v.dim(-1);
  const int64_t kh = k.rank() == 2 ? 1 : k.dim(1), vh = v.rank() == 2 ? 1 : v.dim(1);
  const int64_t D2 = q2 ? q2->dim(2) : 0, kh2 = !k2 || k2->rank() == 2 ? 1 : k2->dim(1);
  Attn a{Tensor({Tq, Nl, Dv}), Tensor({Tq, Nl}, kNegInf)};
  if (Tk == 0) return a;
  using Strided = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
  // Query rows in blocks: with a causal mask, a block's rows see keys [0, vis) only, so the scores and the weighted
  // sum of values are computed over those keys (the masked rest would be exact zeros). The pieces of work are the
  // (head, block) pairs, independent of each other, spread over the cores.
  constexpr int64_t kRows = kAttendRowBlock;
  const int64_t blocks = (Tq + kRows - 1) / kRows;
  const auto one_block = [&](int64_t item) {
    const int64_t h = item / blocks, i0 = item % blocks * kRows, n = std::min(kRows, Tq - i0);
    const int64_t vis = causal ? std::min(Tk, i0 + n + (Tk - Tq)) : Tk;
    if (vis <= 0) return;  // every row of the block sees nothing: output 0, lse -inf
    const Strided Q(q.ptr() + h * Dk, Tq, Dk, Eigen::OuterStride<>(Nl * Dk));
    const Strided K(k.ptr() + (kh == 1 ? 0 : h) * Dk, Tk, Dk, Eigen::OuterStride<>(kh * Dk));
    const Strided Vm(v.ptr() + (vh == 1 ? 0 : h) * Dv, Tk, Dv, Eigen::OuterStride<>(vh * Dv));
    RowMatrix S(n, vis);  // the block's scores
    S.noalias() = Q.middleRows(i0, n) * K.topRows(vis).transpose();
    if (q2) {
      const Strided Q2(q2->ptr() + h * D2, Tq, D2, Eigen::OuterStride<>(Nl * D2));
      const Strided K2(k2->ptr() + (kh2 == 1 ? 0 : h) * D2, Tk, D2, Eigen::OuterStride<>(kh2 * D2));
      S.noalias() += Q2.middleRows(i0, n) * K2.topRows(vis).transpose();
    }
    S *= static_cast<float>(scale);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = i0 + r;
      const int64_t visible = std::max<int64_t>(0, causal ? std::min(Tk, i + 1 + (Tk - Tq)) : Tk);
      const int64_t first = window > 0 ? std::max<int64_t>(0, visible - window) : 0;  // sliding window
      auto row = S.row(r).array();
      auto seen = row.segment(first, visible - first);  // the keys row r attends to; the others weigh 0
      if (seen.isNaN().any()) {  // the softmax of a row with a NaN score is NaN everywhere, as the math has it
        row.setConstant(std::numeric_limits<float>::quiet_NaN());
        a.lse.data[i * Nl + h] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float m = visible > first ? seen.maxCoeff() : kNegInf;
      if (m == kNegInf) {  // no key, or every score -inf: out 0, lse -inf
        row.setZero();
        continue;
      }
      seen = (seen - m).exp();
      row.head(first).setZero();
      row.tail(vis - visible).setZero();
      const float sum = seen.sum();
      if (sum > 0.f) {
        seen /= sum;
        a.lse.data[i * Nl + h] = m + std::log(sum);
      }
    }
    Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>> O(a.out.ptr() + i0 * Nl * Dv + h * Dv, n, Dv,
                                                     Eigen::OuterStride<>(Nl * Dv));
    O.noalias() = S * Vm.topRows(vis);
  };
  try {
    parallel_for(Nl * blocks, one_block);
  } catch (const std::bad_alloc&) {
    const int64_t rows = std::min(Tq, kRows);
    const double bytes = 4.0 * static_cast<double>(rows) * static_cast<double>(Tk);
    throw OutOfMemoryError("attention: the score block of one head is a [" + std::to_string(rows) + ", " +
                           std::to_string(Tk) + "] matrix (" + std::to_string(static_cast<int64_t>(bytes / (1 << 20))) +
                           " MiB), " + std::to_string(std::min<int64_t>(Nl * blocks, Eigen::nbThreads())) +
                           " blocks at once");
  }
  return a;
}
}  // namespace

Attn attend(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int window) {
  return attend_parts(q, nullptr, k, nullptr, v, scale, causal, window);
}

Attn attend(const Tensor& q1, const Tensor& q2, const Tensor& k1, const Tensor& k2, const Tensor& v, double scale,
            bool causal, int window) {
  return attend_parts(q1, &q2, k1, &k2, v, scale, causal, window);
}

Attn merge_lse(const Attn& x, const Attn& y, bool base2) {
  Attn m{Tensor(x.out.shape), Tensor(x.lse.shape)};
  const int64_t rows = x.lse.numel(), Dv = x.out.dim(-1);
  for (int64_t r = 0; r < rows; ++r) {
    const float lx = x.lse.data[r], ly = y.lse.data[r], mx = std::max(lx, ly);
    if (mx == kNegInf) {  // both empty
      m.lse.data[r] = kNegInf;
      continue;
    }
    const float ex = base2 ? std::exp2(lx - mx) : std::exp(lx - mx), ey = base2 ? std::exp2(ly - mx) : std::exp(ly - mx);
    const float wx = ex / (ex + ey);
    for (int64_t d = 0; d < Dv; ++d)
      m.out.data[r * Dv + d] = wx * x.out.data[r * Dv + d] + (1.0f - wx) * y.out.data[r * Dv + d];
    m.lse.data[r] = mx + (base2 ? std::log2(ex + ey) : std::log(ex + ey));
  }
  return m;
}

// DSA's prefill form: a sequence's keys are its context (up-projected from the cache) followed by its new tokens,
// and each token attends to its selected ones.
static Attn attention_mha_selected(const Tensor& Q, const Tensor& K, const Tensor& v, const Tensor& cache,
                                   const Batch& batch, const Tensor& w_kvb_local, const MlaConfig& cfg,
                                   const Selection& keys) {
  const int64_t T = Q.dim(0), Nl = Q.dim(1), L = cfg.kv_lora_rank, R = cfg.qk_rope;
  Attn all{Tensor({T, Nl, static_cast<int64_t>(cfg.v_head)}), Tensor({T, Nl})};
  for (int b = 0; b < batch.num_seqs(); ++b) {
    const int64_t t0 = batch.first_token(b), n = batch.new_lens[b], ctx = batch.context_lens[b];
    Tensor seq_k = rows_of(K, t0, n), seq_v = rows_of(v, t0, n);
    if (ctx > 0) {
      const Tensor rows = gather_cache_rows(cache, batch, b, static_cast<int>(ctx));  // [ctx, L+R]
      Tensor c_kv({ctx, L}), c_pe({ctx, R});
      for (int64_t s = 0; s < ctx; ++s) {
        std::memcpy(c_kv.ptr() + s * L, rows.ptr() + s * (L + R), sizeof(float) * L);
        std::memcpy(c_pe.ptr() + s * R, rows.ptr() + s * (L + R) + L, sizeof(float) * R);
      }
      const KvB up = kv_b_proj(c_kv, w_kvb_local, cfg);
      seq_k = stack_rows(concat_last(up.k_nope, c_pe), seq_k);
      seq_v = stack_rows(up.v, seq_v);
    }
    const Selection sel(keys.begin() + t0, keys.begin() + t0 + n);
    copy_rows_into(all, attend_selected(rows_of(Q, t0, n), seq_k, seq_v, cfg.softmax_scale, sel), t0);
  }
  return all;
}

Attn attention_mha(const Tensor& q_nope, const Tensor& q_pe_rope, const Tensor& k_nope, const Tensor& k_pe_rope,
                   const Tensor& v, const Tensor& cache, const Batch& batch, const Tensor& w_kvb_local,
                   const MlaConfig& cfg, const MhaOptions& opt) {
  const int64_t T = q_nope.dim(0), Nl = q_nope.dim(1), L = cfg.kv_lora_rank;
  Attn all{Tensor({T, Nl, static_cast<int64_t>(cfg.v_head)}), Tensor({T, Nl})};
  // DSA: the selected keys are gathered from Q = [q_nope | q_pe_rope] and K = [k_nope | k_pe_rope broadcast].
  if (opt.keys)
    return attention_mha_selected(concat_last(q_nope, q_pe_rope), concat_last(k_nope, k_pe_rope), v, cache, batch,
                                  w_kvb_local, cfg, *opt.keys);
  // Otherwise the nope and rope lanes stay apart: scores q_nope·k_nope + q_pe·k_pe (k_pe shared by the heads).
  // One sequence holding every row (a prefill of batch 1): its rows are the tensors themselves, not copies.
  const bool whole = batch.num_seqs() == 1 && batch.first_token(0) == 0 && batch.new_lens[0] == T;
  for (int b = 0; b < batch.num_seqs(); ++b) {
    const int64_t t0 = batch.first_token(b), n = batch.new_lens[b], ctx = batch.context_lens[b];
    Attn part = whole ? attend(q_nope, q_pe_rope, k_nope, k_pe_rope, v, cfg.softmax_scale, opt.causal, opt.window)
                      : attend(rows_of(q_nope, t0, n), rows_of(q_pe_rope, t0, n), rows_of(k_nope, t0, n),
                               rows_of(k_pe_rope, t0, n), rows_of(v, t0, n), cfg.softmax_scale, opt.causal,
                               opt.window);
    if (ctx > 0) {
      // Context: latent rows from the cache, up-projected through kv_b_proj, attended without a mask.
      const Tensor rows = gather_cache_rows(cache, batch, b, static_cast<int>(ctx));  // [ctx, L+R]
      Tensor c_kv({ctx, L}), c_pe({ctx, static_cast<int64_t>(cfg.qk_rope)});
      for (int64_t s = 0; s < ctx; ++s) {
        std::memcpy(c_kv.ptr() + s * L, rows.ptr() + s * (L + cfg.qk_rope), sizeof(float) * L);
        std::memcpy(c_pe.ptr() + s * cfg.qk_rope, rows.ptr() + s * (L + cfg.qk_rope) + L, sizeof(float) * cfg.qk_rope);
      }
      const KvB up = kv_b_proj(c_kv, w_kvb_local, cfg);
      const Attn ctx_part = whole ? attend(q_nope, q_pe_rope, up.k_nope, c_pe, up.v, cfg.softmax_scale, false)
                                  : attend(rows_of(q_nope, t0, n), rows_of(q_pe_rope, t0, n), up.k_nope, c_pe,
                                           up.v, cfg.softmax_scale, false);
      part = merge_lse(part, ctx_part, opt.lse_base2);
    }
    if (whole) return part;
    copy_rows_into(all, part, t0);
  }
  return all;
}

Attn attention_mqa(const Tensor& q_latent, const Tensor& q_pe_rope, const Tensor& cache, const Batch& batch,
                   const MlaConfig& cfg, const Selection* keys) {
  const int64_t T = q_latent.dim(0), Nl = q_latent.dim(1), L = cfg.kv_lora_rank, W = L + cfg.qk_rope;
  Attn all{Tensor({T, Nl, L}), Tensor({T, Nl})};
  const Tensor Q = concat_last(q_latent, q_pe_rope);  // [T, Nl, L+R]
  for (int b = 0; b < batch.num_seqs(); ++b) {
    const int64_t t0 = batch.first_token(b), n = batch.new_lens[b];
    const int rows = batch.context_lens[b] + batch.new_lens[b];
    const Tensor C = gather_cache_rows(cache, batch, b, rows);  // [rows, L+R]: key = whole row
    Tensor values({rows, L});                                      // value = the first L lanes of the same row
    for (int s = 0; s < rows; ++s) std::memcpy(values.ptr() + s * L, C.ptr() + s * W, sizeof(float) * L);
    if (keys) {
      const Selection sel(keys->begin() + t0, keys->begin() + t0 + n);
      copy_rows_into(all, attend_selected(rows_of(Q, t0, n), C, values, cfg.softmax_scale, sel), t0);
    } else {
      copy_rows_into(all, attend(rows_of(Q, t0, n), C, values, cfg.softmax_scale, true), t0);
    }
  }
  return all;
}

}  // namespace mla::ref
