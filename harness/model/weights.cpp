// Synthetic weights and tensor-parallel sharding.
#include "harness/model/weights.h"

#include <cmath>

namespace mla {

namespace {
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, float stddev) {
  const uint64_t base = mix(seed ^ mix(stream + 0x51ed2701ull));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += 2) {
    // Box-Muller on two 53-bit uniforms from the counter; both outputs used.
    const uint64_t a = mix(base + 2 * static_cast<uint64_t>(i)), b = mix(base + 2 * static_cast<uint64_t>(i) + 1);
    const double u1 = ((a >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    const double u2 = (b >> 11) * (1.0 / 9007199254740992.0);
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * 3.14159265358979323846 * u2;
    out[i] = static_cast<float>(r * std::cos(th) * stddev);
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(th) * stddev);
  }
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
  return nullptr;
}

LayerWeights shard_layer(const LayerWeights& w, const MlaConfig& c, int tp, int rank) {
  if (tp == 1) return w;
  const int64_t Nl = c.heads / tp, D = c.qk_head(), PV = c.qk_nope + c.v_head, V = c.v_head;
  LayerWeights s = w;
  s.q_b_proj = slice_rows(w.q_b_proj, rank * Nl * D, (rank + 1) * Nl * D);
  s.kv_b_proj = slice_rows(w.kv_b_proj, rank * Nl * PV, (rank + 1) * Nl * PV);
  s.o_proj = slice_cols(w.o_proj, rank * Nl * V, (rank + 1) * Nl * V);
  return s;
}

std::vector<LayerWeights> synthetic_weights(const MlaConfig& c, int layers, bool input_norm, uint64_t seed) {
  const int64_t H = c.hidden, N = c.heads, Lq = c.q_lora_rank, L = c.kv_lora_rank;
  const int64_t D = c.qk_head(), PV = c.qk_nope + c.v_head, V = c.v_head, R = c.qk_rope;
  std::vector<LayerWeights> out(layers);
  for (int l = 0; l < layers; ++l) {
    uint64_t stream = static_cast<uint64_t>(l) * 16;
    auto proj = [&](int64_t rows, int64_t cols) {
      Tensor t({rows, cols});
      fill_normal(t.ptr(), t.numel(), seed, stream++, 1.0f / std::sqrt(static_cast<float>(cols)));
      round_in_place(t, Precision::Precision_bf16);
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
  }
  return out;
}

}  // namespace mla
