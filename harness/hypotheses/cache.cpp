// Bug classes of the latent cache write (cache_write: rows [kv_c_norm | k_pe_rope] of the new tokens): k_pe written
// unrotated or rotated twice, the two parts in the other order, the rope lanes in the other layout, an FP8 (e4m3)
// cache with its scale right, missing or wrong.
#include <algorithm>
#include <cmath>

#include "harness/hypotheses/common.h"
#include "reference/stages.h"

namespace mla::hyp {

namespace cache_family {

// Rows [a | b] of [T, A] and [T, B] (`swap`: [b | a]).
Tensor rows(const Tensor& a, const Tensor& b, bool swap = false) {
  const int64_t T = a.dim(0), A = a.dim(-1), B = b.dim(-1);
  Tensor y({T, A + B});
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n((swap ? b : a).ptr() + t * (swap ? B : A), swap ? B : A, y.ptr() + t * (A + B));
    std::copy_n((swap ? a : b).ptr() + t * (swap ? A : B), swap ? A : B, y.ptr() + t * (A + B) + (swap ? B : A));
  }
  return y;
}

// Round to the nearest FP8 e4m3 value (saturating at ±448; subnormals below 2^-6 in steps of 2^-9).
float round_e4m3(float x) {
  if (!std::isfinite(x)) return x;
  const float a = std::min(std::fabs(x), 448.0f);
  float step = std::ldexp(1.0f, -9);
  if (a >= std::ldexp(1.0f, -6)) step = std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(a))) - 3);
  const float r = std::nearbyint(a / step) * step;
  return std::copysign(std::min(r, 448.0f), x);
}

// Columns [c0, c1) of every row quantized through e4m3 with scale s: q(x / s) · s (read = false: q(x / s), the scale
// never applied on the way back).
Tensor fp8(const Tensor& y, int64_t c0, int64_t c1, double s, bool read_scaled = true) {
  Tensor o = y;
  const int64_t W = y.dim(-1), T = y.numel() / W;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = c0; i < c1; ++i) {
      float& v = o.data[t * W + i];
      v = static_cast<float>(round_e4m3(static_cast<float>(v / s)) * (read_scaled ? s : 1.0));
    }
  return o;
}

double absmax(const Tensor& y, int64_t c0, int64_t c1) {
  const int64_t W = y.dim(-1), T = y.numel() / W;
  double m = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = c0; i < c1; ++i)
      if (std::isfinite(y.data[t * W + i])) m = std::max(m, static_cast<double>(std::fabs(y.data[t * W + i])));
  return m;
}

BugClass make(std::string name, int complexity, std::string description,
              std::function<std::vector<Variant>(const StageCase&, const Outputs&)> run) {
  return make_class(std::move(name), "cache", {Stage::Stage_cache_write}, complexity, std::move(description), std::move(run));
}

}  // namespace cache_family

std::vector<BugClass> cache_classes() {
  using namespace cache_family;
  std::vector<BugClass> v;
  v.push_back(make("cache.k_pe_unrotated", 0, "k_pe written into the cache before its rotation", [](const StageCase& c, const Outputs&) {
    std::vector<int> neg = c.batch.positions;
    for (auto& p : neg) p = -p;
    const Tensor k = ref::rope(input(c, "k_pe_rope"), neg, c.cfg.inv_freq, 1.0 / c.cfg.rope_mscale, c.cfg.rope_style);
    return std::vector<Variant>{variant("kv_cache", rows(input(c, "kv_c_norm"), k), {}, "with k_pe written unrotated")};
  }));
  v.push_back(make("cache.k_pe_double_rotated", 0, "k_pe rotated a second time on its way into the cache", [](const StageCase& c, const Outputs&) {
    const Tensor k = ref::rope(input(c, "k_pe_rope"), c.batch.positions, c.cfg.inv_freq, c.cfg.rope_mscale, c.cfg.rope_style);
    return std::vector<Variant>{variant("kv_cache", rows(input(c, "kv_c_norm"), k), {}, "with k_pe rotated twice")};
  }));
  v.push_back(make("cache.parts_swapped", 0, "the row written as [k_pe | kv_c_norm] instead of [kv_c_norm | k_pe]", [](const StageCase& c, const Outputs&) {
    return std::vector<Variant>{variant("kv_cache", rows(input(c, "kv_c_norm"), input(c, "k_pe_rope"), true), {},
                                        "with its row written [k_pe | kv_c_norm]")};
  }));
  v.push_back(make("cache.rope_lanes", 0, "the rope lanes stored in the other pairing order (interleaved <-> halves)",
                   [](const StageCase& c, const Outputs&) {
                     std::vector<Variant> out;
                     const Tensor& k = input(c, "k_pe_rope");
                     const int64_t T = k.dim(0), R = k.dim(-1), half = R / 2;
                     for (bool to_halves : {true, false}) {
                       Tensor p(k.shape);
                       for (int64_t t = 0; t < T; ++t)
                         for (int64_t i = 0; i < half; ++i) {
                           const float* in = k.ptr() + t * R;
                           float* o = p.ptr() + t * R;
                           if (to_halves) o[i] = in[2 * i], o[i + half] = in[2 * i + 1];
                           else o[2 * i] = in[i], o[2 * i + 1] = in[i + half];
                         }
                       out.push_back(variant("kv_cache", rows(input(c, "kv_c_norm"), p), {{"order", to_halves ? "halves" : "interleaved"}},
                                             std::string("with its rope lanes stored in ") + (to_halves ? "half-split" : "interleaved") + " order"));
                     }
                     return out;
                   }));
  v.push_back(make("cache.fp8", 1, "stored as FP8 e4m3 with a per-tensor scale (right, missing on the way back, or another; fitted)",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     const Tensor& y = ref.at("kv_cache");
                     const Tensor* yc = cand(c, "kv_cache");
                     const int64_t L = c.cfg.kv_lora_rank, W = y.dim(-1);
                     for (int64_t c1 : {W, L}) {
                       const std::string part = c1 == W ? "the whole row" : "the latent lanes";
                       const double amax = absmax(y, 0, c1);
                       if (amax <= 0) continue;
                       const double s_dyn = amax / 448.0;
                       out.push_back(variant("kv_cache", fp8(y, 0, c1, s_dyn), {{"scale", s_dyn}, {"lanes", c1}, {"read", "scaled"}},
                                             "stored as fp8 e4m3 (" + part + ", scale absmax/448 = " + num(s_dyn) + ")"));
                       out.push_back(variant("kv_cache", fp8(y, 0, c1, 1.0), {{"scale", 1.0}, {"lanes", c1}, {"read", "scaled"}},
                                             "stored as fp8 e4m3 (" + part + ", no scale)"));
                       out.push_back(variant("kv_cache", fp8(y, 0, c1, s_dyn, false), {{"scale", s_dyn}, {"lanes", c1}, {"read", "unscaled"}},
                                             "stored as fp8 e4m3 with scale absmax/448 = " + num(s_dyn) + " (" + part +
                                                 ") and read back without it"));
                       if (!yc) continue;
                       // A scale the candidate applied one way only: its ratio to the reference's rows.
                       Tensor yc_part = *yc, y_part = y;
                       const double r = ls_scale(yc_part, y_part);
                       if (r > 0 && std::isfinite(r) && std::fabs(r - 1) > 1e-3)
                         out.push_back(variant("kv_cache", fp8(y, 0, c1, 1.0 / r, false), {{"scale", 1.0 / r}, {"lanes", c1}, {"read", "unscaled"}},
                                               "stored as fp8 e4m3 with scale " + num(1.0 / r) + " (" + part + ") and read back without it"));
                     }
                     return out;
                   }));
  return v;
}

}  // namespace mla::hyp
