// Bug classes of the projections (q_a_proj, q_b_proj / q_proj, kv_a_proj, kv_b_proj, o_proj; heads permuted also
// in q_absorb and v_up): a scale (fitted), the weight read transposed, the fused output's parts in the other order,
// its heads laid out head-major, heads permuted (a tensor-parallel shard at another offset among them), FP8-style
// 128x128 block scales read in another layout (fitted per block).
#include <algorithm>
#include <cmath>

#include <Eigen/Cholesky>

#include "harness/hypotheses/common.h"
#include "reference/stages.h"

namespace mla::hyp {

namespace projection_family {

// y = x·Wᵀ [T, O], viewed per head as [a (A lanes) | b (B lanes)] (B = 0: one output).
struct Linear {
  const Tensor* x = nullptr;
  const Tensor* w = nullptr;
  int64_t heads = 1, A = 0, B = 0;
  std::string a, b;
};

bool linear_of(const StageCase& c, Linear& l) {
  const MlaConfig& m = c.cfg;
  switch (c.stage) {
    case Stage::Stage_q_a_proj: l = {&input(c, "x"), &c.w->q_a_proj, 1, m.q_lora_rank, 0, "q_a", ""}; return true;
    case Stage::Stage_q_b_proj:
    case Stage::Stage_q_proj:
      l = {&input(c, c.stage == Stage::Stage_q_b_proj ? "q_c" : "x"), &c.w->q_b_proj, m.heads, m.qk_nope, m.qk_rope,
           "q_nope", "q_pe"};
      return true;
    case Stage::Stage_kv_a_proj: l = {&input(c, "x"), &c.w->kv_a_proj, 1, m.kv_lora_rank, m.qk_rope, "kv_c", "k_pe"}; return true;
    case Stage::Stage_kv_b_proj:
      l = {&input(c, "kv_c_norm"), &c.w->kv_b_proj, m.heads, m.qk_nope, m.v_head, "k_nope", "v"};
      return true;
    case Stage::Stage_o_proj: {
      static thread_local Tensor flat;
      const Tensor& ao = input(c, "attn_out");
      flat = ao.reshaped({ao.dim(0), ao.numel() / ao.dim(0)});
      l = {&flat, &c.w->o_proj, 1, m.hidden, 0, "o_partial", ""};
      return true;
    }
    default: return false;
  }
}

// The outputs of y [T, heads·(A+B)] split per head as [a | b] (`swap`: read as [b | a]).
Outputs split(const Linear& l, const Tensor& y, bool swap = false) {
  const int64_t T = y.dim(0), N = l.heads, A = l.A, B = l.B, W = A + B;
  Outputs o;
  if (B == 0) {
    o[l.a] = y;
    if (l.a == "o_partial") o[l.a].shape = {T, A};
    return o;
  }
  Tensor a(N == 1 ? std::vector<int64_t>{T, A} : std::vector<int64_t>{T, N, A}),
      b(N == 1 ? std::vector<int64_t>{T, B} : std::vector<int64_t>{T, N, B});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h) {
      const float* row = y.ptr() + t * N * W + h * W;
      std::copy_n(row + (swap ? B : 0), A, a.ptr() + (t * N + h) * A);
      std::copy_n(row + (swap ? 0 : A), B, b.ptr() + (t * N + h) * B);
    }
  o[l.a] = std::move(a);
  o[l.b] = std::move(b);
  return o;
}

// y joined back from a stage's outputs (false when one is not held).
bool join_outputs(const Outputs& outs, const Linear& l, Tensor& y) {
  const Tensor* a = outs.count(l.a) ? &outs.at(l.a) : nullptr;
  const Tensor* b = l.B && outs.count(l.b) ? &outs.at(l.b) : nullptr;
  if (!a || (l.B && !b)) return false;
  const int64_t T = a->dim(0), N = l.heads, A = l.A, B = l.B, W = A + B;
  y = Tensor({T, N * W});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h) {
      float* row = y.ptr() + t * N * W + h * W;
      std::copy_n(a->ptr() + (t * N + h) * A, A, row);
      if (B) std::copy_n(b->ptr() + (t * N + h) * B, B, row + A);
    }
  return true;
}

bool join(const StageCase& c, const Linear& l, Tensor& y) { return join_outputs(c.cand, l, y); }

// A cheap pre-test of a misread weight: y on the first 8 tokens and 256 outputs, `w_at(o, k)` the weight the variant
// reads, against the candidate's same entries. The ratio of its rel_l2 to the tolerance: over 3, the variant cannot
// hold and is not computed whole.
double pretest(const StageCase& c, const Linear& l, const std::function<float(int64_t, int64_t)>& w_at) {
  Tensor yc;
  if (!join(c, l, yc)) return 0;
  const int64_t T = std::min<int64_t>(l.x->dim(0), 8), O = l.w->dim(0), K = l.w->dim(1), Os = std::min<int64_t>(O, 256);
  double dd = 0, bb = 0;
  for (int64_t o = 0; o < Os; ++o) {
    std::vector<float> w(K);
    for (int64_t k = 0; k < K; ++k) w[k] = w_at(o, k);
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(l.x->data[t * K + k]) * w[k];
      const double y = yc.data[t * O + o];
      if (!std::isfinite(y)) continue;
      dd += (y - acc) * (y - acc);
      bb += acc * acc;
    }
  }
  const double tol = c.tol.count(l.a) ? c.tol.at(l.a).rel_l2 : 1e-5;
  return rel_of_sums(dd, bb) / std::max(tol, 1e-30);
}

Variant pruned(double ratio, nlohmann::json params, std::string phrase) {
  Variant v;
  v.params = std::move(params);
  v.phrase = std::move(phrase);
  v.pretest_ratio = ratio;
  return v;
}

Variant of_outputs(Outputs o, nlohmann::json params, std::string phrase) {
  Variant v;
  v.out = std::move(o);
  v.params = std::move(params);
  v.phrase = std::move(phrase);
  return v;
}

BugClass make(std::string name, int complexity, std::vector<Stage> stages, std::string description,
              std::function<std::vector<Variant>(const StageCase&, const Outputs&)> run) {
  return make_class(std::move(name), "projection", std::move(stages), complexity, std::move(description), std::move(run));
}

const std::vector<Stage> kLinear = {Stage::Stage_q_a_proj, Stage::Stage_q_b_proj, Stage::Stage_q_proj,
                                    Stage::Stage_kv_a_proj, Stage::Stage_kv_b_proj, Stage::Stage_o_proj};

// Per-head outputs [T, N, X] of a stage: the names.
std::vector<std::string> head_outputs(const StageCase& c) {
  std::vector<std::string> v;
  for (const auto& [n, t] : c.cand)
    if (t.rank() == 3 && t.dim(1) > 1) v.push_back(n);
  return v;
}

}  // namespace projection_family

std::vector<BugClass> projection_classes() {
  using namespace projection_family;
  std::vector<BugClass> v;
  v.push_back(make("proj.scale", 1, kLinear, "the output off by one factor (a weight or activation scale missing or doubled; fitted)",
                   [](const StageCase& c, const Outputs& ref) {
                     Linear l;
                     Tensor yc;
                     Tensor y;
                     if (!linear_of(c, l) || !join(c, l, yc) || !join_outputs(ref, l, y)) return std::vector<Variant>{};
                     const double s = ls_scale(yc, y);
                     if (std::fabs(s - 1) < 1e-3 || !std::isfinite(s)) return std::vector<Variant>{};
                     return std::vector<Variant>{of_outputs(split(l, scaled(y, s)), {{"factor", s}},
                                                            "scaled by " + num(s, 4))};
                   }));
  v.push_back(make("proj.transposed", 0, kLinear, "the weight [out, in] read as [in, out] (row-major vs column-major)",
                   [](const StageCase& c, const Outputs&) {
                     Linear l;
                     if (!linear_of(c, l)) return std::vector<Variant>{};
                     const int64_t O = l.w->dim(0), K = l.w->dim(1);
                     // Two misreadings: W's memory read as [in, out] (then used transposed: y = x·M with M that
                     // memory as [in, out]), and Wᵀ stored contiguous but read as [out, in]; each pre-tested first.
                     std::vector<Variant> out;
                     const int64_t T = l.x->dim(0);
                     const float* w = l.w->ptr();
                     const nlohmann::json p1 = {{"reading", "W memory as [in, out]"}}, p2 = {{"reading", "W^T stored, read as [out, in]"}};
                     const std::string s1 = "with its weight's memory read as [in, out]",
                                       s2 = "with its weight stored transposed ([in, out]) but read as [out, in]";
                     if (const double r = pretest(c, l, [&](int64_t o, int64_t k) { return w[k * O + o]; }); r > 3) {
                       out.push_back(pruned(r, p1, s1));
                     } else {
                       ConstMatrixMap X(l.x->ptr(), T, K), M(l.w->ptr(), K, O);
                       Tensor y1({T, O});
                       MatrixMap(y1.ptr(), T, O).noalias() = X * M;
                       out.push_back(of_outputs(split(l, y1), p1, s1));
                     }
                     auto w2 = [&](int64_t o, int64_t k) {
                       const int64_t flat = o * K + k;
                       return w[(flat % O) * K + flat / O];  // element (flat / O, flat % O) of Wᵀ [K, O]
                     };
                     if (const double r = pretest(c, l, w2); r > 3) {
                       out.push_back(pruned(r, p2, s2));
                     } else {
                       ConstMatrixMap Wm(l.w->ptr(), O, K);
                       Tensor wr({O, K});
                       MatrixMap(wr.ptr(), K, O) = Wm.transpose();  // Wᵀ's memory, then read as [O, K]
                       out.push_back(of_outputs(split(l, ref::linear(*l.x, wr)), p2, s2));
                     }
                     return out;
                   }));
  v.push_back(make("proj.split_swapped", 0, kLinear, "the fused output's two parts read in the other order ([rope | nope], [k_pe | kv_c], [v | k_nope])",
                   [](const StageCase& c, const Outputs& ref) {
                     Linear l;
                     Tensor y;
                     if (!linear_of(c, l) || l.B == 0 || !join_outputs(ref, l, y)) return std::vector<Variant>{};
                     return std::vector<Variant>{of_outputs(split(l, y, true), {},
                                                            "with each head's " + l.a + " and " + l.b + " lanes read in the other order")};
                   }));
  v.push_back(make("proj.head_major_split", 0, kLinear, "per-head parts laid out head-major (all heads' first parts, then all second parts) on one side only",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     Linear l;
                     Tensor y;
                     if (!linear_of(c, l) || l.B == 0 || l.heads < 2 || !join_outputs(ref, l, y)) return out;
                     const int64_t T = y.dim(0), N = l.heads, A = l.A, B = l.B, W = A + B;
                     // Over the whole projection, or within each tensor-parallel rank's block of heads (its shard).
                     std::vector<int64_t> groups = {N};
                     if (c.spec.tp > 1 && N % c.spec.tp == 0) groups.push_back(N / c.spec.tp);
                     for (int64_t G : groups)
                       for (bool to_head_major : {true, false}) {
                         Tensor z(y.shape);
                         for (int64_t t = 0; t < T; ++t)
                           for (int64_t h = 0; h < N; ++h) {
                             const int64_t g0 = h / G * G, i = h - g0;  // the group's first head, h's place in it
                             const float* src = y.ptr() + t * N * W + g0 * W;
                             float* dst = z.ptr() + t * N * W + g0 * W;
                             if (to_head_major) {  // the candidate reads per-head chunks of a head-major block
                               std::copy_n(src + i * W, A, dst + i * A);
                               std::copy_n(src + i * W + A, B, dst + G * A + i * B);
                             } else {
                               std::copy_n(src + i * A, A, dst + i * W);
                               std::copy_n(src + G * A + i * B, B, dst + i * W + A);
                             }
                           }
                         const std::string where = G == N ? "" : " within each rank's " + std::to_string(G) + " heads";
                         out.push_back(of_outputs(split(l, z),
                                                  {{"direction", to_head_major ? "head-major weights read per head" : "per-head weights read head-major"},
                                                   {"heads_per_block", G}},
                                                  (to_head_major ? "with its weight rows head-major but read per head"
                                                                 : "with its weight rows per head but read head-major") + where));
                       }
                     return out;
                   }));
  v.push_back(make("proj.short_reduction", 1, kLinear, "the product reduced over only part of the input dim (K/2, K/4 or 3K/4; a wrong K)",
                   [](const StageCase& c, const Outputs&) {
                     std::vector<Variant> out;
                     Linear l;
                     if (!linear_of(c, l)) return out;
                     const int64_t K = l.w->dim(1), T = l.x->dim(0);
                     // Over the whole input dim, or within each tensor-parallel rank's block of input columns (o_proj's
                     // shards: each rank's own reduction length wrong).
                     std::vector<int64_t> blocks = {K};
                     if (c.stage == Stage::Stage_o_proj && c.spec.tp > 1 && K % c.spec.tp == 0) blocks.push_back(K / c.spec.tp);
                     const float* w = l.w->ptr();
                     for (int64_t Kb : blocks)
                       for (int64_t k : {Kb / 2, Kb / 4, 3 * Kb / 4}) {
                         if (k <= 0 || k >= Kb) continue;
                         const std::string where = Kb == K ? "" : " of each rank's " + std::to_string(Kb);
                         const nlohmann::json params = {{"k", k}, {"K", Kb}, {"blocks", K / Kb}};
                         const std::string phrase = "reduced over the first " + std::to_string(k) + where + " of " +
                                                    std::to_string(K) + " input columns";
                         auto kept = [&](int64_t j) { return j % Kb < k; };
                         if (const double r = pretest(c, l, [&](int64_t o, int64_t j) { return kept(j) ? w[o * K + j] : 0.0f; }); r > 3) {
                           out.push_back(pruned(r, params, phrase));
                           continue;
                         }
                         Tensor xm = *l.x;
                         for (int64_t t = 0; t < T; ++t)
                           for (int64_t j = 0; j < K; ++j)
                             if (!kept(j)) xm.data[t * K + j] = 0.0f;
                         out.push_back(of_outputs(split(l, ref::linear(xm, *l.w)), params, phrase));
                       }
                     return out;
                   }));
  std::vector<Stage> heads_stages = kLinear;
  heads_stages.push_back(Stage::Stage_q_absorb);
  heads_stages.push_back(Stage::Stage_v_up);
  v.push_back(make("proj.heads_permuted", 1, heads_stages,
                   "heads in another order: head h holds head p(h) (a tensor-parallel shard at another offset, heads reversed or interleaved)",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     const auto names = head_outputs(c);
                     if (names.empty()) return out;
                     const int64_t N = c.cand.at(names[0]).dim(1);
                     // Each candidate head matched to the reference head it is closest to, over every head output.
                     std::vector<int64_t> perm(N);
                     for (int64_t h = 0; h < N; ++h) {
                       double best = INFINITY;
                       for (int64_t g = 0; g < N; ++g) {
                         double e = 0;
                         for (const auto& n : names) {
                           const Tensor &a = c.cand.at(n), &b = ref.at(n);
                           const int64_t T = a.dim(0), X = a.dim(2);
                           for (int64_t t = 0; t < T; ++t)
                             for (int64_t i = 0; i < X; ++i) {
                               const double d = a.data[(t * N + h) * X + i] - b.data[(t * N + g) * X + i];
                               if (std::isfinite(d)) e += d * d;
                             }
                         }
                         if (e < best) best = e, perm[h] = g;
                       }
                     }
                     bool identity = true;
                     for (int64_t h = 0; h < N; ++h) identity &= perm[h] == h;
                     if (identity) return out;
                     Variant var;
                     for (const auto& n : names) {
                       const Tensor& b = ref.at(n);
                       Tensor p(b.shape);
                       const int64_t T = b.dim(0), X = b.dim(2);
                       for (int64_t t = 0; t < T; ++t)
                         for (int64_t h = 0; h < N; ++h)
                           std::copy_n(b.ptr() + (t * N + perm[h]) * X, X, p.ptr() + (t * N + h) * X);
                       var.out[n] = std::move(p);
                     }
                     // The permutation in words: a constant shift, or the heads it moves.
                     const int64_t shift = ((perm[0] - 0) % N + N) % N;
                     bool is_shift = true;
                     for (int64_t h = 0; h < N; ++h) is_shift &= perm[h] == (h + shift) % N;
                     std::string moved;
                     int count = 0;
                     for (int64_t h = 0; h < N && count < 6; ++h)
                       if (perm[h] != h) moved += (count++ ? ", " : "") + std::to_string(h) + "<-" + std::to_string(perm[h]);
                     var.params = {{"permutation", perm}};
                     if (is_shift) var.params["shift"] = shift;
                     var.phrase = is_shift ? "with its heads shifted by " + std::to_string(shift) + " (head h holds head h+" +
                                                 std::to_string(shift) + ")"
                                           : "with its heads permuted (" + moved + ")";
                     out.push_back(std::move(var));
                     return out;
                   }));
  v.push_back(make("proj.block_scale", 2, kLinear,
                   "block scales (FP8 128x128, or 64, 32, 16) applied in another layout: each (output block, input block) off by its own factor (fitted)",
                   [](const StageCase& c, const Outputs&) {
                     std::vector<Variant> out;
                     Linear l;
                     Tensor yc;
                     if (!linear_of(c, l) || !join(c, l, yc)) return out;
                     const int64_t T = l.x->dim(0), O = l.w->dim(0), K = l.w->dim(1);
                     for (int64_t kBlock : {128, 64, 32, 16}) {
                     const int64_t nO = (O + kBlock - 1) / kBlock, nK = (K + kBlock - 1) / kBlock;
                     if ((nK < 2 && nO < 2) || nK > 64 || nO > 4096) continue;
                     // Partial products per input block, fitted on up to 64 tokens.
                     const int64_t Tf = std::min<int64_t>(T, 64);
                     std::vector<Tensor> part(nK);
                     for (int64_t j = 0; j < nK; ++j) {
                       const int64_t k0 = j * kBlock, k1 = std::min(K, k0 + kBlock);
                       Tensor xs({Tf, k1 - k0});
                       for (int64_t t = 0; t < Tf; ++t) std::copy_n(l.x->ptr() + t * K + k0, k1 - k0, xs.ptr() + t * (k1 - k0));
                       part[j] = ref::linear(xs, slice_cols(*l.w, k0, k1));
                     }
                     std::vector<std::vector<double>> s(nO, std::vector<double>(nK, 1.0));
                     for (int64_t i = 0; i < nO; ++i) {
                       const int64_t o0 = i * kBlock, o1 = std::min(O, o0 + kBlock);
                       Eigen::MatrixXd G = Eigen::MatrixXd::Zero(nK, nK);
                       Eigen::VectorXd r = Eigen::VectorXd::Zero(nK);
                       for (int64_t t = 0; t < Tf; ++t)
                         for (int64_t o = o0; o < o1; ++o) {
                           const double yv = yc.data[t * O + o];
                           if (!std::isfinite(yv)) continue;
                           for (int64_t a = 0; a < nK; ++a) {
                             const double pa = part[a].data[t * O + o];
                             r(a) += pa * yv;
                             for (int64_t b = 0; b <= a; ++b) G(a, b) += pa * part[b].data[t * O + o];
                           }
                         }
                       for (int64_t a = 0; a < nK; ++a)
                         for (int64_t b = a + 1; b < nK; ++b) G(a, b) = G(b, a);
                       G.diagonal().array() += 1e-9 * std::max(G.diagonal().maxCoeff(), 1e-30);
                       const Eigen::VectorXd sol = G.ldlt().solve(r);
                       for (int64_t a = 0; a < nK; ++a) s[i][a] = std::isfinite(sol(a)) ? sol(a) : 1.0;
                     }
                     double off = 0;
                     for (const auto& row : s)
                       for (double x : row) off = std::max(off, std::fabs(x - 1));
                     if (off < 1e-2) continue;
                     // The variant on every token: the input blocks' products weighed by the fitted scales.
                     Tensor y({T, O});
                     for (int64_t j = 0; j < nK; ++j) {
                       const int64_t k0 = j * kBlock, k1 = std::min(K, k0 + kBlock);
                       const Tensor pj = ref::linear(slice_cols(*l.x, k0, k1), slice_cols(*l.w, k0, k1));
                       for (int64_t t = 0; t < T; ++t)
                         for (int64_t o = 0; o < O; ++o) y.data[t * O + o] += static_cast<float>(s[o / kBlock][j] * pj.data[t * O + o]);
                     }
                     const std::string b = std::to_string(kBlock);
                     out.push_back(of_outputs(split(l, y), {{"scales", s}, {"block", kBlock}},
                                              "with each " + b + "x" + b + " block of its weight scaled by its own factor (max |s - 1| " +
                                                  num(off) + ")"));
                     }
                     return out;
                   }));
  return v;
}

}  // namespace mla::hyp
