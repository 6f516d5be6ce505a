// Bug classes of any stage's output, and of the all-reduce and the residual: an output off by one factor (fitted),
// its token rows shifted, rounded to bf16/fp16; a rank missing from the all-reduce, counted twice, or the sum taken
// as a mean; the residual add dropped, doubled, or the attention's output dropped.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "harness/hypotheses/common.h"

namespace mla::hyp {

namespace output_family {

// Every stage but the projections (their own proj.scale fits the fused output) and the selection (indices).
std::vector<Stage> scalable() {
  std::vector<Stage> v;
  for (Stage s : {Stage::Stage_input_norm, Stage::Stage_q_a_norm, Stage::Stage_kv_a_norm, Stage::Stage_rope,
                  Stage::Stage_cache_write, Stage::Stage_indexer_q, Stage::Stage_indexer_k, Stage::Stage_q_absorb,
                  Stage::Stage_attention_mha, Stage::Stage_attention_mqa, Stage::Stage_v_up, Stage::Stage_all_reduce,
                  Stage::Stage_residual})
    v.push_back(s);
  return v;
}

std::vector<Stage> every_value_stage() {
  auto v = scalable();
  for (Stage s : {Stage::Stage_q_a_proj, Stage::Stage_q_b_proj, Stage::Stage_q_proj, Stage::Stage_kv_a_proj,
                  Stage::Stage_kv_b_proj, Stage::Stage_o_proj, Stage::Stage_indexer_weights, Stage::Stage_index_scores})
    v.push_back(s);
  return v;
}

BugClass make(std::string name, std::string family, int complexity, std::vector<Stage> stages, std::string description,
              std::function<std::vector<Variant>(const StageCase&, const Outputs&)> run) {
  return make_class(std::move(name), std::move(family), std::move(stages), complexity, std::move(description), std::move(run));
}

// Rows of x [T, ...] moved k tokens later within each sequence (the first k rows of a sequence zero; k < 0: earlier).
Tensor shift_tokens(const Tensor& x, const Batch& batch, int k) {
  Tensor y(x.shape);
  const int64_t T = x.dim(0), per = x.numel() / std::max<int64_t>(T, 1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t src = t - k;
    if (src < 0 || src >= T || batch.token_seq[src] != batch.token_seq[t]) continue;
    std::memcpy(y.ptr() + t * per, x.ptr() + src * per, sizeof(float) * per);
  }
  return y;
}

}  // namespace output_family

std::vector<BugClass> output_classes() {
  using namespace output_family;
  std::vector<BugClass> v;
  v.push_back(make("output.scale", "output", 1, scalable(), "an output off by one factor (fitted), each output alone or all together",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     Variant all;
                     for (const auto& [n, y] : c.cand) {
                       if (!ref.count(n)) continue;
                       const double s = ls_scale(y, ref.at(n));
                       if (!std::isfinite(s) || std::fabs(s - 1) < 1e-3) continue;
                       out.push_back(variant(n, scaled(ref.at(n), s), {{"factor", s}, {"output", n}},
                                             "with " + n + " scaled by " + num(s, 4)));
                       all.out[n] = out.back().out[n];
                     }
                     if (all.out.size() > 1) {
                       all.phrase = "with every output scaled";
                       out.push_back(std::move(all));
                     }
                     return out;
                   }));
  v.push_back(make("output.token_shift", "output", 1, every_value_stage(), "token rows shifted by k within each sequence (|k| <= 2: a row offset in a write)",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     for (int k : {-2, -1, 1, 2}) {
                       Variant var;
                       for (const auto& [n, y] : c.cand)
                         if (ref.count(n)) var.out[n] = shift_tokens(ref.at(n), c.batch, k);
                       var.params = {{"shift", k}};
                       var.phrase = "with its token rows moved " + std::to_string(std::abs(k)) + (k > 0 ? " later" : " earlier");
                       out.push_back(std::move(var));
                     }
                     return out;
                   }));
  v.push_back(make("output.tail_unwritten", "output", 1, every_value_stage(),
                   "the last T mod m token rows never written (a launch over whole tiles of m rows; m fitted)",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     int64_t T = 0;
                     for (const auto& [n, y] : c.cand) T = y.dim(0);
                     std::vector<int64_t> seen;
                     for (int64_t m : {8, 16, 32, 64, 128}) {
                       const int64_t M = T / m * m;
                       if (M == T || std::count(seen.begin(), seen.end(), M)) continue;
                       seen.push_back(M);
                       Variant var;
                       for (const auto& [n, y] : c.cand)
                         if (ref.count(n)) {
                           Tensor z = ref.at(n);
                           const int64_t per = z.numel() / std::max<int64_t>(z.dim(0), 1);
                           std::fill(z.data.begin() + M * per, z.data.end(), 0.0f);
                           var.out[n] = std::move(z);
                         }
                       var.params = {{"tile", m}, {"rows_written", M}};
                       var.phrase = "with rows " + std::to_string(M) + "-" + std::to_string(T - 1) +
                                    " never written (whole tiles of " + std::to_string(m) + " rows)";
                       out.push_back(std::move(var));
                     }
                     return out;
                   }));
  v.push_back(make("output.rounded", "output", 0, every_value_stage(), "outputs stored in bf16 or fp16 where fp32 was expected",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     for (Precision p : {Precision::Precision_bf16, Precision::Precision_fp16}) {
                       Variant var;
                       for (const auto& [n, y] : c.cand)
                         if (ref.count(n)) var.out[n] = rounded(ref.at(n), p);
                       var.params = {{"dtype", precision_name(p)}};
                       var.phrase = std::string("rounded to ") + precision_name(p);
                       out.push_back(std::move(var));
                     }
                     return out;
                   }));
  v.push_back(make("reduce.rank_missing", "reduce", 1, {Stage::Stage_all_reduce}, "one rank's partial missing from the all-reduce (the rank fitted)",
                   [](const StageCase& c, const Outputs&) {
                     std::vector<Variant> out;
                     const auto& parts = c.o_partial_ranks;
                     if (parts.size() < 2) return out;
                     for (size_t k = 0; k < parts.size(); ++k) {
                       Tensor s(parts[0].shape);
                       for (size_t r = 0; r < parts.size(); ++r)
                         if (r != k)
                           for (int64_t i = 0; i < s.numel(); ++i) s.data[i] += parts[r].data[i];
                       out.push_back(variant("o", std::move(s), {{"rank", k}}, "without rank " + std::to_string(k) + "'s partial"));
                     }
                     Tensor only = parts[0];
                     out.push_back(variant("o", std::move(only), {{"rank", "all but 0"}}, "with rank 0's partial alone (no reduction)"));
                     return out;
                   }));
  v.push_back(make("reduce.rank_twice", "reduce", 1, {Stage::Stage_all_reduce}, "one rank's partial counted twice, or the sum taken as a mean",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     const auto& parts = c.o_partial_ranks;
                     if (parts.size() < 2) return out;
                     for (size_t k = 0; k < parts.size(); ++k) {
                       Tensor s = ref.at("o");
                       for (int64_t i = 0; i < s.numel(); ++i) s.data[i] += parts[k].data[i];
                       out.push_back(variant("o", std::move(s), {{"rank", k}}, "with rank " + std::to_string(k) + "'s partial counted twice"));
                     }
                     out.push_back(variant("o", scaled(ref.at("o"), 1.0 / parts.size()), {{"mean", true}}, "averaged over the ranks instead of summed"));
                     return out;
                   }));
  v.push_back(make("residual.dropped", "residual", 0, {Stage::Stage_residual}, "the residual add forgotten (h_out = o), or o dropped (h_out = h)",
                   [](const StageCase& c, const Outputs&) {
                     return std::vector<Variant>{variant("h_out", input(c, "o"), {{"kept", "o"}}, "without the residual add (h_out = o)"),
                                                 variant("h_out", input(c, "h"), {{"kept", "h"}}, "without the attention's output (h_out = h)")};
                   }));
  v.push_back(make("residual.o_twice", "residual", 0, {Stage::Stage_residual}, "the attention's output added twice (h + 2o)",
                   [](const StageCase& c, const Outputs&) {
                     Tensor y = input(c, "h");
                     const Tensor& o = input(c, "o");
                     for (int64_t i = 0; i < y.numel(); ++i) y.data[i] += 2 * o.data[i];
                     return std::vector<Variant>{variant("h_out", std::move(y), {}, "with o added twice")};
                   }));
  return v;
}

}  // namespace mla::hyp
