// Synthetic weights and tensor-parallel sharding.
#include "core/model/weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#if defined(MLA_HAVE_LIBMVEC) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/model/progress_hook.h"

namespace mla {

namespace {
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Box-Muller on two 53-bit uniforms from the counter of pair i: the angle and the radius's logarithm argument.
inline double pair_u1(uint64_t base, int64_t i) {
  return ((mix(base + 2 * static_cast<uint64_t>(i)) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
}
inline double pair_theta(uint64_t base, int64_t i) {
  const double u2 = (mix(base + 2 * static_cast<uint64_t>(i) + 1) >> 11) * (1.0 / 9007199254740992.0);
  return 2.0 * 3.14159265358979323846 * u2;
}

}  // namespace

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, float stddev) {
  const uint64_t base = mix(seed ^ mix(stream + 0x51ed2701ull));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += 2) {
    // Both outputs of a pair used: cos to value i, sin to value i + 1.
    const double u1 = pair_u1(base, i), th = pair_theta(base, i);
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(r * std::cos(th) * stddev);
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(th) * stddev);
  }
}

namespace {

// fill_normal's values rounded to bf16, computed with the vector log, sin and cos of glibc's libmvec: four at a
// time instead of one. Their results may differ from the scalar functions' by a few double ulps (glibc bounds
// them at 4), far less than one float ulp, so the bf16 a value rounds to differs only for a float within a few
// ulps of a bf16 rounding boundary (low 16 bits near 0x8000). Any value within 64 float ulps of one is recomputed
// with the scalar functions: the result is fill_normal's bit for bit, with no assumption on the vector
// functions beyond an error below 2^-17 relative. Returns false where the vector functions are not available.
#if defined(MLA_HAVE_LIBMVEC) && defined(__x86_64__)
extern "C" {
__m256d _ZGVdN4v_log(__m256d);
__m256d _ZGVdN4v_sin(__m256d);
__m256d _ZGVdN4v_cos(__m256d);
}

inline bool near_bf16_boundary(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t low = b & 0xffffu;
  return low >= 0x8000u - 64 && low <= 0x8000u + 64;
}

// The m pairs of a block from their uniforms and the vector log, sin and cos: each value rounded to bf16, recomputed
// with the scalar functions when it lies near a rounding boundary.
inline void finish_pairs(float* out, int m, const double* u1, const double* th, const double* lg, const double* sn,
                         const double* cs, float stddev) {
  for (int j = 0; j < m; ++j) {
    const double r = std::sqrt(-2.0 * lg[j]);
    float a = static_cast<float>(r * cs[j] * stddev), b = static_cast<float>(r * sn[j] * stddev);
    if (near_bf16_boundary(a) || near_bf16_boundary(b)) {
      const double rs = std::sqrt(-2.0 * std::log(u1[j]));
      a = static_cast<float>(rs * std::cos(th[j]) * stddev);
      b = static_cast<float>(rs * std::sin(th[j]) * stddev);
    }
    out[2 * j] = round_bf16(a);
    out[2 * j + 1] = round_bf16(b);
  }
}

// The last value of an odd count: its pair's cos only.
inline void finish_odd(float* out, int64_t n, uint64_t base, float stddev) {
  const double r = std::sqrt(-2.0 * std::log(pair_u1(base, n - 1)));
  out[n - 1] = round_bf16(static_cast<float>(r * std::cos(pair_theta(base, n - 1)) * stddev));
}

__attribute__((target("avx2,fma"))) void fill_normal_bf16_avx2(float* out, int64_t n, uint64_t base, float stddev) {
  const int64_t pairs = n / 2;
  constexpr int kBlock = 256;
#pragma omp parallel for schedule(static)
  for (int64_t p0 = 0; p0 < pairs; p0 += kBlock) {
    alignas(32) double u1[kBlock], th[kBlock], lg[kBlock], sn[kBlock], cs[kBlock];
    const int m = static_cast<int>(std::min<int64_t>(kBlock, pairs - p0));
    for (int j = 0; j < kBlock; ++j) {
      u1[j] = j < m ? pair_u1(base, 2 * (p0 + j)) : 1.0;
      th[j] = j < m ? pair_theta(base, 2 * (p0 + j)) : 0.0;
    }
    for (int j = 0; j < kBlock; j += 4) {
      _mm256_store_pd(lg + j, _ZGVdN4v_log(_mm256_load_pd(u1 + j)));
      const __m256d t = _mm256_load_pd(th + j);
      _mm256_store_pd(sn + j, _ZGVdN4v_sin(t));
      _mm256_store_pd(cs + j, _ZGVdN4v_cos(t));
    }
    finish_pairs(out + 2 * p0, m, u1, th, lg, sn, cs, stddev);
  }
  if (n % 2) finish_odd(out, n, base, stddev);
}

extern "C" {
__m512d _ZGVeN8v_log(__m512d);
__m512d _ZGVeN8v_sin(__m512d);
__m512d _ZGVeN8v_cos(__m512d);
}

// mix() on eight counters at once (64-bit lane multiplies): the same bits as the scalar one.
__attribute__((target("avx512f,avx512dq"))) inline __m512i mix8(__m512i x) {
  x = _mm512_add_epi64(x, _mm512_set1_epi64(static_cast<long long>(0x9e3779b97f4a7c15ull)));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)),
                         _mm512_set1_epi64(static_cast<long long>(0xbf58476d1ce4e5b9ull)));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)),
                         _mm512_set1_epi64(static_cast<long long>(0x94d049bb133111ebull)));
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

// fill_normal_bf16_avx2 eight pairs at a time: the counters' uniforms made in vector lanes (the same operations as
// pair_u1 and pair_theta, exactly), then AVX-512 libmvec log, sin and cos, checked near bf16 rounding boundaries as
// above: fill_normal's values bit for bit.
__attribute__((target("avx512f,avx512dq"))) void fill_normal_bf16_avx512(float* out, int64_t n, uint64_t base,
                                                                          float stddev) {
  const int64_t pairs = n / 2;
  constexpr int kBlock = 256;
#pragma omp parallel for schedule(static)
  for (int64_t p0 = 0; p0 < pairs; p0 += kBlock) {
    alignas(64) double u1[kBlock], th[kBlock], lg[kBlock], sn[kBlock], cs[kBlock];
    const int m = static_cast<int>(std::min<int64_t>(kBlock, pairs - p0));
    const __m512i step = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    for (int j = 0; j < kBlock; j += 8) {
      // Pair q = p0 + j + lane starts at value 2q: its radius's counter is base + 4q (pair_u1(base, 2q)), its
      // angle's base + 4q + 1 (pair_theta).
      const uint64_t first = base + 4 * static_cast<uint64_t>(p0 + j);
      const __m512i c = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first)), _mm512_slli_epi64(step, 1));
      const __m512d a = _mm512_cvtepu64_pd(_mm512_srli_epi64(mix8(c), 11));
      const __m512d b = _mm512_cvtepu64_pd(_mm512_srli_epi64(mix8(_mm512_add_epi64(c, _mm512_set1_epi64(1))), 11));
      _mm512_store_pd(u1 + j, _mm512_mul_pd(_mm512_add_pd(a, _mm512_set1_pd(1.0)),
                                            _mm512_set1_pd(1.0 / 9007199254740993.0)));
      _mm512_store_pd(th + j, _mm512_mul_pd(_mm512_set1_pd(2.0 * 3.14159265358979323846),
                                            _mm512_mul_pd(b, _mm512_set1_pd(1.0 / 9007199254740992.0))));
    }
    for (int j = m; j < kBlock; ++j) u1[j] = 1.0, th[j] = 0.0;
    for (int j = 0; j < kBlock; j += 8) {
      _mm512_store_pd(lg + j, _ZGVeN8v_log(_mm512_load_pd(u1 + j)));
      const __m512d t = _mm512_load_pd(th + j);
      _mm512_store_pd(sn + j, _ZGVeN8v_sin(t));
      _mm512_store_pd(cs + j, _ZGVeN8v_cos(t));
    }
    finish_pairs(out + 2 * p0, m, u1, th, lg, sn, cs, stddev);
  }
  if (n % 2) finish_odd(out, n, base, stddev);
}

std::atomic<int> fill_width{512};

bool fill_normal_bf16_vector(float* out, int64_t n, uint64_t base, float stddev) {
  static const bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  static const bool has256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const int width = fill_width.load();
  if (width >= 512 && has512) fill_normal_bf16_avx512(out, n, base, stddev);
  else if (width >= 256 && has256) fill_normal_bf16_avx2(out, n, base, stddev);
  else return false;
  return true;
}
#else
std::atomic<int> fill_width{512};
bool fill_normal_bf16_vector(float*, int64_t, uint64_t, float) { return false; }
#endif

}  // namespace

void set_fill_normal_width(int bits) { fill_width.store(bits); }

void fill_normal_bf16(float* out, int64_t n, uint64_t seed, uint64_t stream, float stddev) {
  if (n >= 4096 && fill_normal_bf16_vector(out, n, mix(seed ^ mix(stream + 0x51ed2701ull)), stddev)) return;
  fill_normal(out, n, seed, stream, stddev);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = round_bf16(out[i]);
}

Tensor LayerWeights::*weight_field(const std::string& name) {
  if (name == "input_layernorm") return &LayerWeights::input_norm;
  if (name == "q_a_proj") return &LayerWeights::q_a_proj;
  if (name == "q_a_layernorm") return &LayerWeights::q_a_norm;
  if (name == "q_b_proj" || name == "q_proj") return &LayerWeights::q_b_proj;
  if (name == "kv_a_proj_with_mqa") return &LayerWeights::kv_a_proj;
  if (name == "kv_a_layernorm") return &LayerWeights::kv_a_norm;
  if (name == "kv_b_proj") return &LayerWeights::kv_b_proj;
  if (name == "o_proj") return &LayerWeights::o_proj;
  if (name == "indexer.wq_b") return &LayerWeights::idx_wq_b;
  if (name == "indexer.wk") return &LayerWeights::idx_wk;
  if (name == "indexer.k_norm") return &LayerWeights::idx_k_norm;
  if (name == "indexer.k_norm_bias") return &LayerWeights::idx_k_norm_bias;
  if (name == "indexer.weights_proj") return &LayerWeights::idx_weights_proj;
  return nullptr;
}

std::vector<Tensor*> LayerWeights::tensors() {
  return {&input_norm, &q_a_proj, &q_a_norm, &q_b_proj, &kv_a_proj, &kv_a_norm, &kv_b_proj, &o_proj,
          &idx_wq_b,   &idx_wk,   &idx_k_norm, &idx_k_norm_bias, &idx_weights_proj};
}

std::vector<const Tensor*> LayerWeights::tensors() const {
  const auto all = const_cast<LayerWeights*>(this)->tensors();
  return {all.begin(), all.end()};
}

Tensor head_shard(const LayerWeights& w, const MlaConfig& c, int tp, int rank, const Tensor LayerWeights::*field) {
  const int64_t Nl = c.heads / tp, D = c.qk_head(), PV = c.qk_nope + c.v_head, V = c.v_head;
  if (field == &LayerWeights::q_b_proj) return slice_rows(w.q_b_proj, rank * Nl * D, (rank + 1) * Nl * D);
  if (field == &LayerWeights::kv_b_proj) return slice_rows(w.kv_b_proj, rank * Nl * PV, (rank + 1) * Nl * PV);
  if (field == &LayerWeights::o_proj) return slice_cols(w.o_proj, rank * Nl * V, (rank + 1) * Nl * V);
  return {};
}

LayerWeights head_shards(const LayerWeights& w, const MlaConfig& c, int tp, int rank) {
  LayerWeights s;
  for (auto field : {&LayerWeights::q_b_proj, &LayerWeights::kv_b_proj, &LayerWeights::o_proj})
    s.*field = head_shard(w, c, tp, rank, field);
  return s;
}

std::vector<LayerWeights> synthetic_weights(const MlaConfig& c, int layers, bool input_norm, uint64_t seed) {
  const int64_t H = c.hidden, N = c.heads, Lq = c.q_lora_rank, L = c.kv_lora_rank;
  const int64_t D = c.qk_head(), PV = c.qk_nope + c.v_head, V = c.v_head, R = c.qk_rope;
  std::vector<LayerWeights> out(layers);
  // Progress ticks, counted in elements of the projections.
  const double per_layer = static_cast<double>(c.has_q_lora() ? Lq * H + N * D * Lq : N * D * H) + (L + R) * H +
                           N * PV * L + H * N * V +
                           (c.has_dsa() ? static_cast<double>(c.index_n_heads) * c.index_head_dim * Lq +
                                              static_cast<double>(c.index_head_dim) * H + c.index_n_heads * H
                                        : 0.0);
  double done = 0;
  for (int l = 0; l < layers; ++l) {
    uint64_t stream = static_cast<uint64_t>(l) * 16;
    auto proj = [&](int64_t rows, int64_t cols) {
      if (progress_wanted())
        progress_tick("elements", "weights: synthesizing layer " + std::to_string(l + 1) + "/" + std::to_string(layers),
                      done, per_layer * layers);
      done += static_cast<double>(rows) * cols;
      Tensor t({rows, cols});
      fill_normal_bf16(t.ptr(), t.numel(), seed, stream++, 1.0f / std::sqrt(static_cast<float>(cols)));
      return t;
    };
    auto norm = [&](int64_t n) {
      Tensor t({n});
      fill_normal(t.ptr(), n, seed, stream++, 0.1f);
      for (auto& v : t.data) v += 1.0f;
      round_in_place(t, Precision::Precision_bf16);
      return t;
    };
    auto& w = out[l];
    if (input_norm) w.input_norm = norm(H); else stream++;
    if (c.has_q_lora()) {
      w.q_a_proj = proj(Lq, H);
      w.q_a_norm = norm(Lq);
      w.q_b_proj = proj(N * D, Lq);
    } else {
      stream += 2;
      w.q_b_proj = proj(N * D, H);
    }
    w.kv_a_proj = proj(L + R, H);
    w.kv_a_norm = norm(L);
    w.kv_b_proj = proj(N * PV, L);
    w.o_proj = proj(H, N * V);
    if (c.has_dsa()) {  // the indexer: projections like the others; the LayerNorm's bias N(0, 0.1)
      const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
      w.idx_wq_b = proj(Hi * Di, Lq);
      w.idx_wk = proj(Di, H);
      w.idx_k_norm = norm(Di);
      w.idx_k_norm_bias = Tensor({Di});
      fill_normal_bf16(w.idx_k_norm_bias.ptr(), Di, seed, stream++, 0.1f);
      w.idx_weights_proj = proj(Hi, H);
    }
  }
  return out;
}

}  // namespace mla
