// Bug classes of the absorbed form's per-head products (q_absorb: q_latent_h = W_UK_hᵀ·q_nope_h; v_up: attn_out_h =
// W_UV_h·attn_latent_h): the head's weight slice read transposed, a head computed with a neighbouring head's slice,
// the W_UK and W_UV slices of kv_b_proj taken for each other.
#include <algorithm>
#include <cmath>

#include "harness/hypotheses/common.h"

namespace mla::hyp {

namespace absorb_family {

struct Absorb {
  const Tensor* in = nullptr;  // [T, N, A]
  std::string out;             // [T, N, B]
  int64_t A = 0, B = 0;
  int64_t part = 0;            // the slice's first row within a head's P+V rows of W_kvb (W_UK: 0, W_UV: P)
  int64_t rows = 0;            // its rows (W_UK: P, W_UV: V)
  bool times_w = false;        // out = in·W (q_absorb: [T, P]·[P, L]); false: in·Wᵀ (v_up: [T, L]·[L, V])
};

Absorb of(const StageCase& c) {
  const MlaConfig& m = c.cfg;
  if (c.stage == Stage::Stage_q_absorb) return {&input(c, "q_nope"), "q_latent", m.qk_nope, m.kv_lora_rank, 0, m.qk_nope, true};
  return {&input(c, "attn_latent"), "attn_out", m.kv_lora_rank, m.v_head, m.qk_nope, m.v_head, false};
}

// Head h's output through the slice of W_kvb at head g, rows [part, part + rows), read as stored or transposed.
void head_product(const StageCase& c, const Absorb& a, int64_t h, int64_t g, int64_t part, bool transposed, Tensor& out) {
  const MlaConfig& m = c.cfg;
  const int64_t T = a.in->dim(0), N = a.in->dim(1), L = m.kv_lora_rank, PV = m.qk_nope + m.v_head;
  const float* w = c.w->kv_b_proj.ptr() + (g * PV + part) * L;  // a [rows, L] block, row-major
  using Strided = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
  using StridedOut = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;
  Strided X(a.in->ptr() + h * a.A, T, a.A, Eigen::OuterStride<>(N * a.A));
  StridedOut Y(out.ptr() + h * a.B, T, a.B, Eigen::OuterStride<>(N * a.B));
  // The slice as stored is [rows, L]; transposed, the same memory read as [L, rows].
  if (!transposed) {
    ConstMatrixMap W(w, a.rows, L);
    if (a.times_w) Y.noalias() = X * W;  // q_absorb: [T, P]·[P, L]
    else Y.noalias() = X * W.transpose();  // v_up: [T, L]·[L, V]
  } else {
    ConstMatrixMap W(w, L, a.rows);
    if (a.times_w) Y.noalias() = X * W.transpose();
    else Y.noalias() = X * W;
  }
}

BugClass make(std::string name, int complexity, std::string description,
              std::function<std::vector<Variant>(const StageCase&, const Outputs&)> run) {
  return make_class(std::move(name), "absorb", {Stage::Stage_q_absorb, Stage::Stage_v_up}, complexity, std::move(description), std::move(run));
}

}  // namespace absorb_family

std::vector<BugClass> absorb_classes() {
  using namespace absorb_family;
  std::vector<BugClass> v;
  v.push_back(make("absorb.transposed", 0, "each head's weight slice (W_UK [P, L] or W_UV [V, L]) read with its dims swapped",
                   [](const StageCase& c, const Outputs& ref) {
                     const Absorb a = of(c);
                     Tensor y = ref.at(a.out);
                     for (int64_t h = 0; h < a.in->dim(1); ++h) head_product(c, a, h, h, a.part, true, y);
                     return std::vector<Variant>{variant(a.out, std::move(y), {},
                                                         std::string("with each head's ") + (a.part ? "W_UV" : "W_UK") +
                                                             " slice read transposed")};
                   }));
  v.push_back(make("absorb.other_slice", 0, "W_UV taken where W_UK belongs, or W_UK where W_UV belongs (P = V)",
                   [](const StageCase& c, const Outputs& ref) {
                     const Absorb a = of(c);
                     if (c.cfg.qk_nope != c.cfg.v_head) return std::vector<Variant>{};
                     Tensor y = ref.at(a.out);
                     const int64_t other = a.part ? 0 : c.cfg.qk_nope;
                     for (int64_t h = 0; h < a.in->dim(1); ++h) head_product(c, a, h, h, other, false, y);
                     return std::vector<Variant>{variant(a.out, std::move(y), {},
                                                         std::string("with ") + (a.part ? "W_UK" : "W_UV") + " in place of " +
                                                             (a.part ? "W_UV" : "W_UK"))};
                   }));
  v.push_back(make("absorb.head_weight", 1, "a head computed with a neighbouring head's slice (an off-by-one head index; the head fitted)",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     const Absorb a = of(c);
                     const Tensor* yc = cand(c, a.out);
                     if (!yc) return out;
                     const int64_t T = a.in->dim(0), N = a.in->dim(1);
                     const auto& r = ref.at(a.out);
                     auto head_err = [&](const Tensor& y, int64_t h) {
                       double d = 0, b = 0;
                       for (int64_t t = 0; t < T; ++t)
                         for (int64_t j = 0; j < a.B; ++j) {
                           const double x = yc->data[(t * N + h) * a.B + j], z = y.data[(t * N + h) * a.B + j];
                           if (std::isfinite(x) && std::isfinite(z)) d += (x - z) * (x - z), b += z * z;
                         }
                       return rel_of_sums(d, b);
                     };
                     // Heads the reference's own computation misses, each tried with its neighbours' slices.
                     const double tol = c.tol.count(a.out) ? c.tol.at(a.out).rel_l2 : 1e-5;
                     Tensor y = r;
                     nlohmann::json moved = nlohmann::json::object();
                     for (int64_t h = 0; h < N; ++h) {
                       if (head_err(r, h) <= tol) continue;
                       double best = INFINITY;
                       int64_t best_g = -1;
                       Tensor trial = r;
                       for (int64_t g = std::max<int64_t>(0, h - 2); g <= std::min(N - 1, h + 2); ++g) {
                         if (g == h) continue;
                         head_product(c, a, h, g, a.part, false, trial);
                         if (const double e = head_err(trial, h); e < best) best = e, best_g = g;
                       }
                       if (best_g < 0 || moved.size() >= 8) return out;
                       head_product(c, a, h, best_g, a.part, false, y);
                       moved[std::to_string(h)] = best_g;
                     }
                     if (moved.empty()) return out;
                     std::string words;
                     for (auto it = moved.begin(); it != moved.end(); ++it)
                       words += (words.empty() ? "" : ", ") + std::string("head ") + it.key() + " with head " +
                                std::to_string(it.value().get<int64_t>()) + "'s";
                     out.push_back(variant(a.out, std::move(y), {{"heads", moved}}, "with " + words + " slice"));
                     return out;
                   }));
  return v;
}

}  // namespace mla::hyp
