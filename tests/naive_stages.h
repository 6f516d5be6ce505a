// The double-precision expectations the reference's stage tests (tests/test_<stage>.cpp) hold each stage function
// of reference/stages.h against: naive loops written here, never calling the reference, on inputs of realistic
// magnitude.
//
// Tolerance: relative L2 <= 1e-5 (kTol). The reference computes in FP32 (unit roundoff u = 6e-8); the longest
// reduction in these tests is K = 64 terms (tiny's hidden size), so the worst-case accumulated rounding is
// about K·u = 4e-6 and the typical one sqrt(K)·u = 5e-7. Softmax adds |score|·u with scores of a few units.
// 1e-5 sits above that and orders of magnitude below any real bug (a wrong lane, split, scale or mask gives
// errors of order 1e-2 to 1).
#pragma once
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
#include <utility>
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/tensor.h"
#include "reference/stages.h"
#include "tests/stage_test_util.h"

namespace mla::test {

// Relative L2 of an FP32 result against a double-precision (or another FP32 implementation's) expectation: FP32
// rounds each operation to 2^-24 (6e-8), and over the sums here (up to a few thousand terms) the error stays near
// 1e-6; 1e-5 leaves a factor of ~10, far below a real bug's error (a wrong constant, index or layout: 1e-3 and up).
inline constexpr double kTol = 1e-5;
inline constexpr uint64_t kSeeds[] = {1, 2, 3};
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------- inputs of realistic magnitude ----------

inline Tensor randn(std::vector<int64_t> shape, std::mt19937_64& rng, double stddev = 1.0) {
  Tensor t(std::move(shape));
  std::normal_distribution<double> nd(0.0, stddev);
  for (auto& v : t.data) v = static_cast<float>(nd(rng));
  return t;
}

// Hidden states: N(0,1) with a few outlier channels 20-100x larger, like real residual streams.
inline Tensor hidden(int64_t T, int64_t H, std::mt19937_64& rng) {
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
inline Tensor weight(int64_t O, int64_t K, std::mt19937_64& rng) {
  return randn({O, K}, rng, 1.0 / std::sqrt(double(K)));
}
inline Tensor norm_weight(int64_t C, std::mt19937_64& rng) {
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

inline double at(const Tensor& t, int64_t i) { return static_cast<double>(t.data[i]); }

// rel_l2 = ‖got − want‖ / ‖want‖ over finite expectations; non-finite expectations (lse −inf) must match exactly.
inline void expect_close(const Tensor& got, const Ref& want, const std::string& what, double tol = kTol) {
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
inline Ref naive_linear(const Tensor& x, const Tensor& w) {
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

inline Ref naive_rms_norm(const Tensor& x, const Tensor& w, double eps) {
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
inline std::pair<Ref, Ref> naive_split(const Ref& y, int64_t n, int64_t A, int64_t B) {
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
inline std::vector<double> independent_inv_freq(const MlaConfig& c) {
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
inline double independent_softmax_scale(const MlaConfig& c) {
  double m = 1.0;
  if (c.rope_scaling == RopeScaling::RopeScaling_yarn && c.yarn.factor > 1 && c.yarn.mscale_all_dim != 0)
    m = 0.1 * c.yarn.mscale_all_dim * std::log(c.yarn.factor) + 1.0;
  return m * m / std::sqrt(double(c.qk_nope + c.qk_rope));
}

inline Ref naive_rope(const Tensor& x, const std::vector<int>& pos, const std::vector<double>& inv_freq,
                      double cs_scale, RopeStyle style) {
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
inline void naive_softmax(const std::vector<double>& scores, const std::vector<std::vector<double>>& values, int64_t Dv,
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

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Lanes [off, off+n) of row `row` (length `width`) of a tensor, in double.
inline std::vector<double> lanes(const Tensor& t, int64_t row, int64_t width, int64_t off, int64_t n) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = at(t, row * width + off + i);
  return v;
}

inline std::vector<double> cat(std::vector<double> a, const std::vector<double>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// q [Tq, Nl, Dk]; k, v [Tk, Nl, D] or shared [Tk, D] / [Tk, 1, D]. Causal: query i sees keys j <= i + Tk − Tq.
inline std::pair<Ref, Ref> naive_attend(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal) {
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
inline int64_t cache_offset(const Batch& b, int s, int slot, int64_t W) {
  return (static_cast<int64_t>(b.block_table[s * b.max_blocks + slot / kPageSize]) * kPageSize + slot % kPageSize) * W;
}

// A cache [blocks, 64, W] poisoned with NaN, then rows [0, ctx + new) of every sequence filled with
// kv_c_norm-like lanes (N(0,1)) and rope lanes (N(0,1)). Any read of a row not meant to be read gives NaN.
inline Tensor filled_cache(const Batch& b, int64_t W, std::mt19937_64& rng) {
  Tensor cache({b.num_blocks, kPageSize, W}, std::numeric_limits<float>::quiet_NaN());
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int s = 0; s < b.num_seqs(); ++s)
    for (int slot = 0; slot < b.context_lens[s] + b.new_lens[s]; ++slot)
      for (int64_t c = 0; c < W; ++c) cache.data[cache_offset(b, s, slot, W) + c] = static_cast<float>(nd(rng));
  return cache;
}

}  // namespace mla::test
