// What the class files share: small tensor helpers, least-squares fits, the reference's computation of a stage on a
// case's inputs, and the general softmax attention the attention classes vary.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "harness/hypotheses/hypotheses.h"

namespace mla::hyp {

// A catalogue entry.
BugClass make_class(std::string name, std::string family, std::vector<Stage> stages, int complexity,
                    std::string description, std::function<std::vector<Variant>(const StageCase&, const Outputs&)> run);

// The reference's outputs of the case's stage on its inputs (reference/stages.h; global weights, global layout).
Outputs reference_outputs(const StageCase& c);

// The tensor named `name`: from the case's inputs (throws when absent).
const Tensor& input(const StageCase& c, const char* name);  // a C string: the result refers to c, not to name
// The candidate's output, or nullptr.
const Tensor* cand(const StageCase& c, const std::string& name);

// c·t.
Tensor scaled(const Tensor& t, double c);
// argmin_c ‖a − c·b‖ over finite pairs (1 when b is zero).
double ls_scale(const Tensor& a, const Tensor& b);
// ‖a − b‖ / ‖b‖ over finite pairs.
double rel_l2(const Tensor& a, const Tensor& b);
bool close_to(double a, double b, double rel);

// A variant changing one output.
Variant variant(const std::string& output, Tensor t, nlohmann::json params, std::string phrase);

// Rounding of every element through bf16 or fp16.
Tensor rounded(Tensor t, Precision p);

// "1e-05" style short numbers for phrases.
std::string num(double v, int precision = 3);

// argmin of f over [lo, hi] by golden section (`iters` steps, one evaluation each after the first two).
double golden_min(const std::function<double(double)>& f, double lo, double hi, int iters);

// Key index s of sequence b's new token t: context_b + (t − first_token(b)).
int key_index(const Batch& b, int64_t t);

}  // namespace mla::hyp
