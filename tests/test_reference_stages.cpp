// Every stage function of reference/stages.h against an independent naive loop in double precision written
// here (never calling the reference), on the tiny preset (and DeepSeek-V3's rope at large positions).
//
// Tolerance: relative L2 <= 1e-5 (kTol). The reference computes in FP32 (unit roundoff u = 6e-8); the longest
// reduction in these tests is K = 64 terms (tiny's hidden size), so the worst-case accumulated rounding is
// about K·u = 4e-6 and the typical one sqrt(K)·u = 5e-7. Softmax adds |score|·u with scores of a few units.
// 1e-5 sits above that and orders of magnitude below any real bug (a wrong lane, split, scale or mask gives
// errors of order 1e-2 to 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/model/batch.h"
#include "harness/model/config.h"
#include "harness/model/tensor.h"
#include "reference/stages.h"
#include "tests/stage_test_util.h"

namespace {

using namespace mla;
using namespace mla::test;

constexpr double kTol = 1e-5;
constexpr uint64_t kSeeds[] = {1, 2, 3};
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------- inputs of realistic magnitude ----------

Tensor randn(std::vector<int64_t> shape, std::mt19937_64& rng, double stddev = 1.0) {
  Tensor t(std::move(shape));
  std::normal_distribution<double> nd(0.0, stddev);
  for (auto& v : t.data) v = static_cast<float>(nd(rng));
  return t;
}

// Hidden states: N(0,1) with a few outlier channels 20-100x larger, like real residual streams.
Tensor hidden(int64_t T, int64_t H, std::mt19937_64& rng) {
  Tensor x = randn({T, H}, rng);
  std::uniform_int_distribution<int64_t> pick(0, H - 1);
  std::uniform_real_distribution<double> mag(20.0, 100.0);
  for (int k = 0; k < 3; ++k) {
    const int64_t c = pick(rng);
    const float m = static_cast<float>(mag(rng));
    for (int64_t t = 0; t < T; ++t) x.data[t * H + c] *= m;
  }
  return x;
}

// Projection weight [O, K] ~ N(0,1)/sqrt(K); norm weight ~ 1 + N(0, 0.1).
Tensor weight(int64_t O, int64_t K, std::mt19937_64& rng) { return randn({O, K}, rng, 1.0 / std::sqrt(double(K))); }
Tensor norm_weight(int64_t C, std::mt19937_64& rng) {
  Tensor w = randn({C}, rng, 0.1);
  for (auto& v : w.data) v += 1.0f;
  return w;
}

// ---------- double-precision expectations and comparison ----------

struct Ref {
  std::vector<int64_t> shape;
  std::vector<double> data;
  explicit Ref(std::vector<int64_t> s, double fill = 0.0) : shape(std::move(s)), data(shape_numel(shape), fill) {}
};

double at(const Tensor& t, int64_t i) { return static_cast<double>(t.data[i]); }

// rel_l2 = ‖got − want‖ / ‖want‖ over finite expectations; non-finite expectations (lse −inf) must match exactly.
void expect_close(const Tensor& got, const Ref& want, const std::string& what, double tol = kTol) {
  ASSERT_EQ(got.shape, want.shape) << what << ": shape";
  double num = 0, den = 0, worst = -1;
  int64_t wi = -1, bad = 0, first_bad = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = at(got, i), w = want.data[i];
    if (!std::isfinite(w) || !std::isfinite(g)) {
      if (g != w) {
        if (bad++ == 0) first_bad = i;
      }
      continue;
    }
    const double d = g - w;
    num += d * d;
    den += w * w;
    if (std::fabs(d) > worst) worst = std::fabs(d), wi = i;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " non-finite mismatches, first at "
                    << (first_bad >= 0 ? coords(got.shape, first_bad) : "-") << " got "
                    << (first_bad >= 0 ? at(got, first_bad) : 0.0) << " want "
                    << (first_bad >= 0 ? want.data[first_bad] : 0.0);
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_LE(rel, tol) << what << ": rel_l2 " << rel << ", worst element at " << (wi >= 0 ? coords(got.shape, wi) : "-")
                      << " got " << (wi >= 0 ? at(got, wi) : 0.0) << " want " << (wi >= 0 ? want.data[wi] : 0.0);
  // A comparison against an all-zero expectation proves nothing unless that was the point.
  EXPECT_TRUE(den > 0 || num == 0) << what;
}

// The independent math: everything below is written from the formulas (docs/architecture.md), not from reference/.
Ref naive_linear(const Tensor& x, const Tensor& w) {
  const int64_t T = x.dim(0), K = x.numel() / T, O = w.dim(0);
  EXPECT_EQ(w.dim(1), K);
  Ref y({T, O});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < O; ++o) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += at(x, t * K + k) * at(w, o * K + k);
      y.data[t * O + o] = s;
    }
  return y;
}

Ref naive_rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const int64_t C = w.numel(), T = x.numel() / C;
  Ref y(x.shape);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += at(x, t * C + c) * at(x, t * C + c);
    const double inv = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) y.data[t * C + c] = at(x, t * C + c) * inv * at(w, c);
  }
  return y;
}

// Splits y [T, n·(A+B)] (per group A lanes then B lanes) into [T, n, A] and [T, n, B].
std::pair<Ref, Ref> naive_split(const Ref& y, int64_t n, int64_t A, int64_t B) {
  const int64_t T = y.shape[0];
  Ref a({T, n, A}), b({T, n, B});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n; ++h)
      for (int64_t j = 0; j < A + B; ++j) {
        const double v = y.data[(t * n + h) * (A + B) + j];
        if (j < A) a.data[(t * n + h) * A + j] = v;
        else b.data[(t * n + h) * B + j - A] = v;
      }
  return {a, b};
}

// YaRN, written from the formula: plain frequencies θ^(−2i/R), YaRN ramp between low and high.
std::vector<double> independent_inv_freq(const MlaConfig& c) {
  const int R = c.qk_rope;
  std::vector<double> f(R / 2);
  for (int i = 0; i < R / 2; ++i) f[i] = std::pow(c.rope_theta, -2.0 * i / R);
  if (c.rope_scaling != RopeScaling::RopeScaling_yarn) return f;
  auto dim = [&](double beta) {
    return R * std::log(c.yarn.original_max_position / (beta * 2.0 * std::numbers::pi)) / (2.0 * std::log(c.rope_theta));
  };
  const double low = std::clamp(std::floor(dim(c.yarn.beta_fast)), 0.0, R / 2.0 - 1);
  double high = std::clamp(std::ceil(dim(c.yarn.beta_slow)), 0.0, R / 2.0 - 1);
  if (high == low) high += 0.001;
  for (int i = 0; i < R / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] * (1 - ramp) + f[i] / c.yarn.factor * ramp;
  }
  return f;
}

// The softmax scale: get_mscale(s, mscale_all_dim)² / sqrt(P + R).
double independent_softmax_scale(const MlaConfig& c) {
  double m = 1.0;
  if (c.rope_scaling == RopeScaling::RopeScaling_yarn && c.yarn.factor > 1 && c.yarn.mscale_all_dim != 0)
    m = 0.1 * c.yarn.mscale_all_dim * std::log(c.yarn.factor) + 1.0;
  return m * m / std::sqrt(double(c.qk_nope + c.qk_rope));
}

Ref naive_rope(const Tensor& x, const std::vector<int>& pos, const std::vector<double>& inv_freq, double cs_scale,
               RopeStyle style) {
  const int64_t T = x.dim(0), R = x.dim(-1), rows = x.numel() / (T * R), half = R / 2;
  Ref y(x.shape);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = (t * rows + r) * R;
      for (int64_t i = 0; i < half; ++i) {
        const double th = pos[t] * inv_freq[i], c = std::cos(th) * cs_scale, s = std::sin(th) * cs_scale;
        // Interleaved: pairs (2i, 2i+1) rotated as complex numbers; neox: (i, i + R/2).
        const int64_t a = style == RopeStyle::RopeStyle_interleaved ? 2 * i : i;
        const int64_t b = style == RopeStyle::RopeStyle_interleaved ? 2 * i + 1 : i + half;
        y.data[base + a] = at(x, base + a) * c - at(x, base + b) * s;
        y.data[base + b] = at(x, base + a) * s + at(x, base + b) * c;
      }
    }
  return y;
}

// Softmax over a key set of one query: out = Σ p_j v_j, lse = log Σ exp(s_j) (natural log); empty: 0, −inf.
void naive_softmax(const std::vector<double>& scores, const std::vector<std::vector<double>>& values, int64_t Dv,
                   double* out, double* lse) {
  for (int64_t d = 0; d < Dv; ++d) out[d] = 0;
  if (scores.empty()) {
    *lse = -kInf;
    return;
  }
  const double m = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (double s : scores) sum += std::exp(s - m);
  for (size_t j = 0; j < scores.size(); ++j) {
    const double p = std::exp(scores[j] - m) / sum;
    for (int64_t d = 0; d < Dv; ++d) out[d] += p * values[j][d];
  }
  *lse = m + std::log(sum);
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Lanes [off, off+n) of row `row` (length `width`) of a tensor, in double.
std::vector<double> lanes(const Tensor& t, int64_t row, int64_t width, int64_t off, int64_t n) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = at(t, row * width + off + i);
  return v;
}

std::vector<double> cat(std::vector<double> a, const std::vector<double>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// q [Tq, Nl, Dk]; k, v [Tk, Nl, D] or shared [Tk, D] / [Tk, 1, D]. Causal: query i sees keys j <= i + Tk − Tq.
std::pair<Ref, Ref> naive_attend(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal) {
  const int64_t Tq = q.dim(0), Nl = q.dim(1), Dk = q.dim(2), Tk = k.dim(0), Dv = v.dim(-1);
  const bool k_shared = k.rank() == 2 || k.dim(1) == 1, v_shared = v.rank() == 2 || v.dim(1) == 1;
  Ref out({Tq, Nl, Dv}), lse({Tq, Nl});
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t h = 0; h < Nl; ++h) {
      const auto qi = lanes(q, i * Nl + h, Dk, 0, Dk);
      std::vector<double> scores;
      std::vector<std::vector<double>> values;
      for (int64_t j = 0; j < Tk; ++j) {
        if (causal && j > i + (Tk - Tq)) continue;
        scores.push_back(scale * dot(qi, lanes(k, k_shared ? j : j * Nl + h, Dk, 0, Dk)));
        values.push_back(lanes(v, v_shared ? j : j * Nl + h, Dv, 0, Dv));
      }
      naive_softmax(scores, values, Dv, &out.data[(i * Nl + h) * Dv], &lse.data[i * Nl + h]);
    }
  return {out, lse};
}

// Offset of cache row `slot` of sequence `s`, read straight from the table.
int64_t cache_offset(const Batch& b, int s, int slot, int64_t W) {
  return (static_cast<int64_t>(b.block_table[s * b.max_blocks + slot / kPageSize]) * kPageSize + slot % kPageSize) * W;
}

// A cache [blocks, 64, W] poisoned with NaN, then rows [0, ctx + new) of every sequence filled with
// kv_c_norm-like lanes (N(0,1)) and rope lanes (N(0,1)). Any read of a row not meant to be read gives NaN.
Tensor filled_cache(const Batch& b, int64_t W, std::mt19937_64& rng) {
  Tensor cache({b.num_blocks, kPageSize, W}, std::numeric_limits<float>::quiet_NaN());
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int s = 0; s < b.num_seqs(); ++s)
    for (int slot = 0; slot < b.context_lens[s] + b.new_lens[s]; ++slot)
      for (int64_t c = 0; c < W; ++c) cache.data[cache_offset(b, s, slot, W) + c] = static_cast<float>(nd(rng));
  return cache;
}

// ---------- tests ----------

TEST(RefStages, LinearIsXTimesWTransposed) {
  const auto cfg = preset("tiny");
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor x = hidden(7, cfg.hidden, rng);
    const Tensor w = weight(cfg.q_lora_rank, cfg.hidden, rng);
    expect_close(ref::linear(x, w), naive_linear(x, w), "linear");
    // A 3-D input is read as [T, rest] (o_proj feeds [T, Nl, V]).
    const Tensor a = randn({5, cfg.heads, cfg.v_head}, rng);
    const Tensor wo = weight(cfg.hidden, cfg.heads * cfg.v_head, rng);
    expect_close(ref::linear(a, wo), naive_linear(a, wo), "linear 3-D");
  }
}

TEST(RefStages, RmsNormUsesMeanSquareEpsAndWeight) {
  const auto cfg = preset("tiny");
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    Tensor x = hidden(6, cfg.hidden, rng);
    // A tiny row (mean square 1e-8 << eps): the output depends on eps, so a wrong or missing eps shows.
    for (int64_t c = 0; c < cfg.hidden; ++c) x.data[5 * cfg.hidden + c] *= 1e-4f;
    const Tensor w = norm_weight(cfg.hidden, rng);
    for (double eps : {1e-6, 1e-5}) {
      SCOPED_TRACE("eps " + std::to_string(eps));
      expect_close(ref::rms_norm(x, w, eps), naive_rms_norm(x, w, eps), "rms_norm");
    }
    // kv_a_norm's width L, over a [T, L] input.
    const Tensor kv = randn({4, cfg.kv_lora_rank}, rng, 3.0);
    const Tensor wk = norm_weight(cfg.kv_lora_rank, rng);
    expect_close(ref::rms_norm(kv, wk, cfg.rms_eps), naive_rms_norm(kv, wk, cfg.rms_eps), "rms_norm L");
  }
}

TEST(RefStages, QBProjSplitsEachHeadIntoNopeThenRope) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, D = cfg.qk_head(), P = cfg.qk_nope, R = cfg.qk_rope;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor q_c = randn({5, cfg.q_lora_rank}, rng);
    const Tensor w = weight(N * D, cfg.q_lora_rank, rng);
    // Global weights, and rank 1's head block at tp 2 and rank 3's at tp 4 (the function sees only its rows).
    for (auto [tp, rank] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{4, 3}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const int64_t Nl = N / tp;
      const Tensor wl = slice_rows(w, rank * Nl * D, (rank + 1) * Nl * D);
      const auto q = ref::q_b_proj(q_c, wl, cfg);
      const auto [nope, pe] = naive_split(naive_linear(q_c, wl), Nl, P, R);
      expect_close(q.q_nope, nope, "q_nope");
      expect_close(q.q_pe, pe, "q_pe");
    }
    // q_proj (no q LoRA): the same split of x·W_qᵀ.
    const Tensor x = hidden(5, cfg.hidden, rng);
    const Tensor wq = weight(N * D, cfg.hidden, rng);
    const auto q = ref::q_b_proj(x, wq, cfg);
    const auto [nope, pe] = naive_split(naive_linear(x, wq), N, P, R);
    expect_close(q.q_nope, nope, "q_proj q_nope");
    expect_close(q.q_pe, pe, "q_proj q_pe");
  }
}

TEST(RefStages, KvAProjSplitsLatentThenRope) {
  const auto cfg = preset("tiny");
  const int64_t L = cfg.kv_lora_rank, R = cfg.qk_rope;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor x = hidden(6, cfg.hidden, rng);
    const Tensor w = weight(L + R, cfg.hidden, rng);
    const auto kv = ref::kv_a_proj(x, w, cfg);
    auto [c, pe] = naive_split(naive_linear(x, w), 1, L, R);
    c.shape = {6, L};
    pe.shape = {6, R};
    expect_close(kv.kv_c, c, "kv_c");
    expect_close(kv.k_pe, pe, "k_pe");
  }
}

TEST(RefStages, RopeTinyYarnBothStyles) {
  const auto cfg = preset("tiny");
  const auto inv_freq = independent_inv_freq(cfg);
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    std::vector<int> pos = {0, 1, 2, 63, 64};
    std::uniform_int_distribution<int> pick(0, 4095);
    for (int i = 0; i < 5; ++i) pos.push_back(pick(rng));
    const int64_t T = static_cast<int64_t>(pos.size());
    const Tensor q_pe = randn({T, cfg.heads, cfg.qk_rope}, rng);
    const Tensor k_pe = randn({T, cfg.qk_rope}, rng);
    for (auto style : {RopeStyle::RopeStyle_interleaved, RopeStyle::RopeStyle_neox}) {
      SCOPED_TRACE(style == RopeStyle::RopeStyle_neox ? "neox" : "interleaved");
      for (double cs : {cfg.rope_mscale, 1.37}) {
        SCOPED_TRACE("cos/sin scale " + std::to_string(cs));
        expect_close(ref::rope(q_pe, pos, cfg.inv_freq, cs, style), naive_rope(q_pe, pos, inv_freq, cs, style),
                     "q_pe_rope");
        expect_close(ref::rope(k_pe, pos, cfg.inv_freq, cs, style), naive_rope(k_pe, pos, inv_freq, cs, style),
                     "k_pe_rope");
      }
    }
  }
}

TEST(RefStages, RopeDeepSeekV3YarnAtLargePositions) {
  const auto cfg = preset("deepseek-v3");
  const auto inv_freq = independent_inv_freq(cfg);
  const std::vector<int> pos = {0, 1, 2, 4095, 4096, 32767, 65536, 100003, 131071, 163839};
  const int64_t T = static_cast<int64_t>(pos.size());
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor q_pe = randn({T, 4, cfg.qk_rope}, rng);
    const Tensor k_pe = randn({T, cfg.qk_rope}, rng);
    for (auto style : {RopeStyle::RopeStyle_interleaved, RopeStyle::RopeStyle_neox}) {
      SCOPED_TRACE(style == RopeStyle::RopeStyle_neox ? "neox" : "interleaved");
      expect_close(ref::rope(q_pe, pos, cfg.inv_freq, cfg.rope_mscale, style),
                   naive_rope(q_pe, pos, inv_freq, 1.0, style), "q_pe_rope");
      expect_close(ref::rope(k_pe, pos, cfg.inv_freq, cfg.rope_mscale, style),
                   naive_rope(k_pe, pos, inv_freq, 1.0, style), "k_pe_rope");
    }
  }
}

// RoPE: position 0 rotates by zero in both styles; every other position pairs different lanes, so the
// styles disagree. (The rope-neox bug leaves token 0 exact and nothing else.)
TEST(RefStages, RopeNeoxAndInterleavedDifferExceptAtPositionZero) {
  for (const char* name : {"tiny", "deepseek-v3", "kimi-k2", "glm-5"}) {
    SCOPED_TRACE(name);
    const auto cfg = preset(name);
    for (uint64_t seed : kSeeds) {
      SCOPED_TRACE(seed_trace(seed));
      std::mt19937_64 rng(seed);
      std::vector<int> pos(40);
      std::iota(pos.begin(), pos.end(), 0);
      pos.push_back(4096);
      pos.push_back(163839);
      const int64_t T = static_cast<int64_t>(pos.size()), R = cfg.qk_rope;
      const Tensor x = randn({T, 2, R}, rng);
      const Tensor a = ref::rope(x, pos, cfg.inv_freq, cfg.rope_mscale, RopeStyle::RopeStyle_interleaved);
      const Tensor b = ref::rope(x, pos, cfg.inv_freq, cfg.rope_mscale, RopeStyle::RopeStyle_neox);
      for (int64_t t = 0; t < T; ++t) {
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < 2 * R; ++i) {
          diff += std::pow(at(a, t * 2 * R + i) - at(b, t * 2 * R + i), 2);
          norm += std::pow(at(x, t * 2 * R + i), 2);
        }
        if (pos[t] == 0) {
          EXPECT_EQ(diff, 0.0) << "position 0 must be exact in both styles";
          for (int64_t i = 0; i < 2 * R; ++i) ASSERT_EQ(a.data[t * 2 * R + i], x.data[t * 2 * R + i]);
        } else {
          EXPECT_GT(std::sqrt(diff / norm), 1e-3) << "styles agree at position " << pos[t];
        }
      }
    }
  }
}

TEST(RefStages, KvBProjSplitsEachHeadIntoKNopeThenV) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor c = randn({7, L}, rng);
    const Tensor w = weight(N * (P + V), L, rng);
    for (auto [tp, rank] : {std::pair{1, 0}, std::pair{4, 1}, std::pair{8, 7}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const int64_t Nl = N / tp;
      const Tensor wl = slice_rows(w, rank * Nl * (P + V), (rank + 1) * Nl * (P + V));
      const auto kv = ref::kv_b_proj(c, wl, cfg);
      const auto [k, v] = naive_split(naive_linear(c, wl), Nl, P, V);
      expect_close(kv.k_nope, k, "k_nope");
      expect_close(kv.v, v, "v");
    }
  }
}

TEST(RefStages, CacheWriteAndGatherFollowTheShuffledBlockTable) {
  const auto cfg = preset("tiny");
  const int64_t L = cfg.kv_lora_rank, R = cfg.qk_rope, W = L + R;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    // Three sequences: context crossing page boundaries, an empty context, new tokens crossing a boundary.
    const Batch b = shuffled_batch({5, 3, 4}, {130, 0, 62}, seed);
    const int64_t T = b.tokens();
    Tensor cache = randn({b.num_blocks, kPageSize, W}, rng);  // "old" content that must survive
    const Tensor kv_c_norm = randn({T, L}, rng), k_pe_rope = randn({T, R}, rng);

    Tensor want_cache = cache;
    Tensor want_rows({T, W});
    for (int s = 0, t = 0; s < b.num_seqs(); ++s)
      for (int i = 0; i < b.new_lens[s]; ++i, ++t)
        for (int64_t c = 0; c < W; ++c) {
          const float v = c < L ? kv_c_norm.data[t * L + c] : k_pe_rope.data[t * R + c - L];
          want_rows.data[t * W + c] = v;
          want_cache.data[cache_offset(b, s, b.context_lens[s] + i, W) + c] = v;
        }
    const Tensor rows = ref::cache_write(cache, b, kv_c_norm, k_pe_rope);
    expect_identical(rows, want_rows, "kv_cache rows");
    expect_identical(cache, want_cache, "cache after write (new rows placed, every other row untouched)");

    for (int s = 0; s < b.num_seqs(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const int n = b.context_lens[s] + b.new_lens[s];
      Tensor want({n, W});
      for (int slot = 0; slot < n; ++slot)
        std::memcpy(want.ptr() + slot * W, cache.ptr() + cache_offset(b, s, slot, W), sizeof(float) * W);
      expect_identical(ref::gather_cache_rows(cache, b, s, n), want, "gather_cache_rows");
    }
  }
}

TEST(RefStages, AttendCausalAlignsBottomRight) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t Nl = 3, Dk = cfg.qk_head(), Dv = cfg.v_head;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    // Tq < Tk (chunk after context), Tq == Tk (prefill), Tq > Tk (leading queries see nothing: 0, −inf).
    for (auto [Tq, Tk] : {std::pair{5, 9}, std::pair{6, 6}, std::pair{7, 4}, std::pair{1, 70}}) {
      SCOPED_TRACE("Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk));
      const Tensor q = randn({Tq, Nl, Dk}, rng, 2.0);
      const Tensor k = randn({Tk, Nl, Dk}, rng), v = randn({Tk, Nl, Dv}, rng);
      const auto a = ref::attend(q, k, v, scale, true);
      const auto [out, lse] = naive_attend(q, k, v, scale, true);
      expect_close(a.out, out, "out");
      expect_close(a.lse, lse, "lse");
    }
  }
}

TEST(RefStages, AttendNonCausalAndSharedKeys) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t Nl = 4, Dk = cfg.cache_row(), Dv = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const int64_t Tq = 5, Tk = 11;
    const Tensor q = randn({Tq, Nl, Dk}, rng, 1.5);
    {
      SCOPED_TRACE("per-head keys, non-causal");
      const Tensor k = randn({Tk, Nl, Dk}, rng), v = randn({Tk, Nl, Dv}, rng);
      const auto a = ref::attend(q, k, v, scale, false);
      const auto [out, lse] = naive_attend(q, k, v, scale, false);
      expect_close(a.out, out, "out");
      expect_close(a.lse, lse, "lse");
    }
    // MQA: one key/value row per token shared by all heads, as [Tk, D] and as [Tk, 1, D].
    const Tensor k = randn({Tk, Dk}, rng), v = randn({Tk, Dv}, rng);
    for (bool causal : {false, true}) {
      SCOPED_TRACE(causal ? "shared keys, causal" : "shared keys, non-causal");
      const auto [out, lse] = naive_attend(q, k, v, scale, causal);
      const auto a2 = ref::attend(q, k, v, scale, causal);
      expect_close(a2.out, out, "out [Tk,D]");
      expect_close(a2.lse, lse, "lse [Tk,D]");
      const auto a3 = ref::attend(q, k.reshaped({Tk, 1, Dk}), v.reshaped({Tk, 1, Dv}), scale, causal);
      expect_close(a3.out, out, "out [Tk,1,D]");
      expect_close(a3.lse, lse, "lse [Tk,1,D]");
    }
  }
}

TEST(RefStages, AttendEmptyKeySetGivesZeroAndMinusInf) {
  const auto cfg = preset("tiny");
  std::mt19937_64 rng(7);
  SCOPED_TRACE(seed_trace(7));
  const int64_t Tq = 3, Nl = 2, Dk = cfg.qk_head(), Dv = cfg.v_head;
  const Tensor q = randn({Tq, Nl, Dk}, rng);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const auto a = ref::attend(q, Tensor({0, Nl, Dk}), Tensor({0, Nl, Dv}), cfg.softmax_scale, causal);
    ASSERT_EQ(a.out.shape, (std::vector<int64_t>{Tq, Nl, Dv}));
    ASSERT_EQ(a.lse.shape, (std::vector<int64_t>{Tq, Nl}));
    for (float v : a.out.data) EXPECT_EQ(v, 0.0f);
    for (float v : a.lse.data) EXPECT_TRUE(std::isinf(v) && v < 0) << "lse " << v;
  }
}

TEST(RefStages, MergeLseMatchesFormulaAndUnionOfKeySets) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t Tq = 6, Nl = 3, Dv = cfg.v_head, Dk = cfg.qk_head();
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    // The LSE merge's formula on random partials, with empty chunks (lse −inf) on one side or both.
    ref::Attn x{randn({Tq, Nl, Dv}, rng), randn({Tq, Nl}, rng, 4.0)};
    ref::Attn y{randn({Tq, Nl, Dv}, rng), randn({Tq, Nl}, rng, 4.0)};
    const float ninf = -std::numeric_limits<float>::infinity();
    x.lse.data[1] = ninf;
    std::fill_n(x.out.ptr() + 1 * Dv, Dv, 0.0f);
    y.lse.data[4] = ninf;
    std::fill_n(y.out.ptr() + 4 * Dv, Dv, 0.0f);
    x.lse.data[7] = y.lse.data[7] = ninf;
    std::fill_n(x.out.ptr() + 7 * Dv, Dv, 0.0f);
    std::fill_n(y.out.ptr() + 7 * Dv, Dv, 0.0f);
    Ref out({Tq, Nl, Dv}), lse({Tq, Nl});
    for (int64_t r = 0; r < Tq * Nl; ++r) {
      const double lx = at(x.lse, r), ly = at(y.lse, r);
      if (std::isinf(lx) && std::isinf(ly)) {
        lse.data[r] = -kInf;
        continue;
      }
      const double m = std::max(lx, ly), ex = std::exp(lx - m), ey = std::exp(ly - m), w = ex / (ex + ey);
      for (int64_t d = 0; d < Dv; ++d)
        out.data[r * Dv + d] = w * at(x.out, r * Dv + d) + (1 - w) * at(y.out, r * Dv + d);
      lse.data[r] = m + std::log(ex + ey);
    }
    const auto m = ref::merge_lse(x, y);
    expect_close(m.out, out, "merged out");
    expect_close(m.lse, lse, "merged lse");

    // Attending to A ∪ B equals merging attend(A) and attend(B).
    const Tensor q = randn({Tq, Nl, Dk}, rng, 2.0);
    const Tensor k = randn({12, Nl, Dk}, rng), v = randn({12, Nl, Dv}, rng);
    auto part = [&](const Tensor& t, int64_t r0, int64_t r1) {
      auto s = t.shape;
      s[0] = r1 - r0;
      Tensor o(s);
      const int64_t per = t.numel() / t.dim(0);
      std::memcpy(o.ptr(), t.ptr() + r0 * per, sizeof(float) * (r1 - r0) * per);
      return o;
    };
    const auto merged = ref::merge_lse(ref::attend(q, part(k, 0, 5), part(v, 0, 5), scale, false),
                                       ref::attend(q, part(k, 5, 12), part(v, 5, 12), scale, false));
    const auto [u_out, u_lse] = naive_attend(q, k, v, scale, false);
    expect_close(merged.out, u_out, "merge of halves vs union: out");
    expect_close(merged.lse, u_lse, "merge of halves vs union: lse");
  }
}

// Naive prefill form (no LSE merge): for each new token, keys = the sequence's cached rows up-projected through
// W_kvb (k = [W_UK c | pe], v = W_UV c) plus the new tokens up to itself; one softmax over the union.
std::pair<Ref, Ref> naive_attention_mha(const Tensor& q_nope, const Tensor& q_pe_rope, const Tensor& k_nope,
                                        const Tensor& k_pe_rope, const Tensor& v, const Tensor& cache, const Batch& b,
                                        const Tensor& w_kvb, const MlaConfig& cfg, double scale) {
  const int64_t T = q_nope.dim(0), Nl = q_nope.dim(1), P = cfg.qk_nope, R = cfg.qk_rope, V = cfg.v_head;
  const int64_t L = cfg.kv_lora_rank, W = L + R;
  Ref out({T, Nl, V}), lse({T, Nl});
  for (int s = 0, t0 = 0; s < b.num_seqs(); t0 += b.new_lens[s], ++s)
    for (int i = 0; i < b.new_lens[s]; ++i)
      for (int64_t h = 0; h < Nl; ++h) {
        const int64_t t = t0 + i;
        const auto q = cat(lanes(q_nope, t * Nl + h, P, 0, P), lanes(q_pe_rope, t * Nl + h, R, 0, R));
        std::vector<double> scores;
        std::vector<std::vector<double>> values;
        for (int c = 0; c < b.context_lens[s]; ++c) {
          const int64_t off = cache_offset(b, s, c, W);
          std::vector<double> kn(P, 0.0), vv(V, 0.0), pe(R);
          for (int64_t j = 0; j < P + V; ++j) {
            double acc = 0;
            for (int64_t l = 0; l < L; ++l) acc += at(w_kvb, (h * (P + V) + j) * L + l) * at(cache, off + l);
            (j < P ? kn[j] : vv[j - P]) = acc;
          }
          for (int64_t r = 0; r < R; ++r) pe[r] = at(cache, off + L + r);
          scores.push_back(scale * dot(q, cat(kn, pe)));
          values.push_back(vv);
        }
        for (int j = 0; j <= i; ++j) {
          const int64_t u = t0 + j;
          scores.push_back(scale * dot(q, cat(lanes(k_nope, u * Nl + h, P, 0, P), lanes(k_pe_rope, u, R, 0, R))));
          values.push_back(lanes(v, u * Nl + h, V, 0, V));
        }
        naive_softmax(scores, values, V, &out.data[(t * Nl + h) * V], &lse.data[t * Nl + h]);
      }
  return {out, lse};
}

TEST(RefStages, AttentionMhaWithAndWithoutContext) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t N = cfg.heads, P = cfg.qk_nope, R = cfg.qk_rope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor w_kvb = weight(N * (P + V), L, rng);
    for (auto ctx : {std::vector<int>{0, 0}, std::vector<int>{70, 2}}) {
      SCOPED_TRACE("context " + std::to_string(ctx[0]) + "," + std::to_string(ctx[1]));
      const Batch b = shuffled_batch({5, 3}, ctx, seed + 100);
      const int64_t T = b.tokens();
      const Tensor cache = filled_cache(b, L + R, rng);
      for (auto [tp, rank] : {std::pair{1, 0}, std::pair{2, 1}}) {
        SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
        const int64_t Nl = N / tp;
        const Tensor wl = slice_rows(w_kvb, rank * Nl * (P + V), (rank + 1) * Nl * (P + V));
        const Tensor q_nope = randn({T, Nl, P}, rng, 2.0), q_pe = randn({T, Nl, R}, rng, 2.0);
        const Tensor k_nope = randn({T, Nl, P}, rng), k_pe = randn({T, R}, rng), v = randn({T, Nl, V}, rng);
        const auto a = ref::attention_mha(q_nope, q_pe, k_nope, k_pe, v, cache, b, wl, cfg);
        const auto [out, lse] = naive_attention_mha(q_nope, q_pe, k_nope, k_pe, v, cache, b, wl, cfg, scale);
        expect_close(a.out, out, "attn_out");
        expect_close(a.lse, lse, "lse");
      }
    }
  }
}

TEST(RefStages, QAbsorbAppliesWukTransposed) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor w = weight(N * (P + V), L, rng);
    for (auto [tp, rank] : {std::pair{1, 0}, std::pair{4, 2}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const int64_t Nl = N / tp, T = 6;
      const Tensor wl = slice_rows(w, rank * Nl * (P + V), (rank + 1) * Nl * (P + V));
      const Tensor q_nope = randn({T, Nl, P}, rng, 2.0);
      Ref want({T, Nl, L});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Nl; ++h)
          for (int64_t l = 0; l < L; ++l) {
            double s = 0;  // (W_UK_hᵀ q)_l = Σ_p W_kvb[h(P+V) + p, l] q_p
            for (int64_t p = 0; p < P; ++p) s += at(wl, (h * (P + V) + p) * L + l) * at(q_nope, (t * Nl + h) * P + p);
            want.data[(t * Nl + h) * L + l] = s;
          }
      expect_close(ref::q_absorb(q_nope, wl, cfg), want, "q_latent");
    }
  }
}

TEST(RefStages, AttentionMqaOverPagedLatentCache) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t N = cfg.heads, R = cfg.qk_rope, L = cfg.kv_lora_rank, W = L + R;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    // Decode (s_q 1, contexts across pages), multi-token steps with and without context.
    for (auto [news, ctx] : {std::pair{std::vector<int>{1, 1, 1}, std::vector<int>{200, 63, 0}},
                             std::pair{std::vector<int>{4, 4}, std::vector<int>{61, 0}}}) {
      const Batch b = shuffled_batch(news, ctx, seed + 7);
      SCOPED_TRACE("sequences " + std::to_string(b.num_seqs()) + ", new " + std::to_string(news[0]));
      const int64_t T = b.tokens(), Nl = N / 2;
      const Tensor cache = filled_cache(b, W, rng);
      const Tensor q_latent = randn({T, Nl, L}, rng, 1.5), q_pe = randn({T, Nl, R}, rng, 1.5);
      Ref out({T, Nl, L}), lse({T, Nl});
      for (int s = 0, t0 = 0; s < b.num_seqs(); t0 += b.new_lens[s], ++s)
        for (int i = 0; i < b.new_lens[s]; ++i)
          for (int64_t h = 0; h < Nl; ++h) {
            const int64_t t = t0 + i;
            const auto q = cat(lanes(q_latent, t * Nl + h, L, 0, L), lanes(q_pe, t * Nl + h, R, 0, R));
            std::vector<double> scores;
            std::vector<std::vector<double>> values;
            for (int slot = 0; slot <= b.context_lens[s] + i; ++slot) {  // bottom-right causal
              const int64_t off = cache_offset(b, s, slot, W);
              std::vector<double> row(W);
              for (int64_t c = 0; c < W; ++c) row[c] = at(cache, off + c);
              scores.push_back(scale * dot(q, row));             // key: the whole row
              values.emplace_back(row.begin(), row.begin() + L);  // value: its first L lanes
            }
            naive_softmax(scores, values, L, &out.data[(t * Nl + h) * L], &lse.data[t * Nl + h]);
          }
      const auto a = ref::attention_mqa(q_latent, q_pe, cache, b, cfg);
      expect_close(a.out, out, "attn_latent");
      expect_close(a.lse, lse, "lse");
    }
  }
}

TEST(RefStages, VUpAppliesWuv) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor w = weight(N * (P + V), L, rng);
    for (auto [tp, rank] : {std::pair{1, 0}, std::pair{8, 5}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const int64_t Nl = N / tp, T = 5;
      const Tensor wl = slice_rows(w, rank * Nl * (P + V), (rank + 1) * Nl * (P + V));
      const Tensor lat = randn({T, Nl, L}, rng);
      Ref want({T, Nl, V});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Nl; ++h)
          for (int64_t j = 0; j < V; ++j) {
            double s = 0;  // W_UV_h = rows h(P+V)+P .. h(P+V)+P+V−1
            for (int64_t l = 0; l < L; ++l) s += at(wl, (h * (P + V) + P + j) * L + l) * at(lat, (t * Nl + h) * L + l);
            want.data[(t * Nl + h) * V + j] = s;
          }
      expect_close(ref::v_up(lat, wl, cfg), want, "attn_out");
    }
  }
}

TEST(RefStages, OProjAllReduceAndResidual) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, V = cfg.v_head, H = cfg.hidden, T = 5;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor w_o = weight(H, N * V, rng);
    const int tp = 4;
    const int64_t Nl = N / tp;
    std::vector<Tensor> partials;
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const Tensor a = randn({T, Nl, V}, rng);
      const Tensor wl = slice_cols(w_o, r * Nl * V, (r + 1) * Nl * V);
      Ref want({T, H});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < H; ++j) {
          double s = 0;  // attn_out reshaped [T, Nl·V] times W_o,localᵀ
          for (int64_t h = 0; h < Nl; ++h)
            for (int64_t c = 0; c < V; ++c) s += at(a, (t * Nl + h) * V + c) * at(wl, j * Nl * V + h * V + c);
          want.data[t * H + j] = s;
        }
      partials.push_back(ref::o_proj(a, wl));
      expect_close(partials.back(), want, "o_partial");
    }
    std::vector<const Tensor*> ptrs;
    Ref sum({T, H});
    for (auto& p : partials) {
      ptrs.push_back(&p);
      for (int64_t i = 0; i < p.numel(); ++i) sum.data[i] += at(p, i);
    }
    const Tensor o = ref::all_reduce(ptrs);
    expect_close(o, sum, "all_reduce");
    const Tensor h = hidden(T, H, rng);
    Ref h_out({T, H});
    for (int64_t i = 0; i < h.numel(); ++i) h_out.data[i] = at(h, i) + at(o, i);
    expect_close(ref::residual(h, o), h_out, "residual");
  }
}

}  // namespace
