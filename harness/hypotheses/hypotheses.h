// Diagnosis by re-execution: the stage that introduced a divergence is run again, on the candidate's own inputs to
// it, once per known bug class (a variant of the reference's computation of that stage, its parameters fitted to the
// candidate), and each variant is measured against what the candidate produced. A class whose variant reproduces the
// candidate within the calibrated tolerance, where the reference's own computation does not, is *confirmed*.
//
// The catalogue lives beside this header, one file per stage family (norm.cpp, rope.cpp, attention.cpp,
// projection.cpp, absorb.cpp, cache.cpp, dsa.cpp, output.cpp); `mla-bisect classes` lists it and docs/hypotheses.md is
// generated from it.
#pragma once
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/compare/compare.h"
#include "harness/compare/diagnose.h"
#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/inputs.h"
#include "core/model/stage_graph.h"
#include "core/model/tensor.h"
#include "core/model/weights.h"

namespace mla::hyp {

// One stage as the candidate ran it: its inputs (global layout, full tensors), the candidate's outputs, and what the
// stage computes with. Built by `make_case` from dumps; the reference's own outputs on these inputs are computed by
// the search (the class "as run").
struct StageCase {
  MlaConfig cfg;
  RunSpec spec;
  Batch batch;
  // The layer's global weights, shared rather than copied (a layer's are hundreds of MB): make_case's is a view of
  // the caller's, which outlive the search.
  std::shared_ptr<const LayerWeights> w;
  int layer = 0;
  Stage stage = Stage::Stage_layer_input;
  std::string focus;  // the output the sentence quotes (the first divergent probe); default the furthest off
  std::map<std::string, Tensor> in;    // the stage's inputs, global layout
  std::map<std::string, Tensor> cand;  // the candidate's outputs, global layout (those it holds in full)
  std::map<std::string, Tolerance> tol;  // per output
  std::vector<Tensor> o_partial_ranks;   // all_reduce: each rank's o_partial (empty otherwise)
  Tensor cache_before;  // attention and cache_write: the paged latent cache before this step's rows [blocks, 64, L+R]
  Tensor index_cache_before;  // DSA: the index cache before this step's rows [blocks, 64, Di]
  // Filled by the search: the cache after the reference's write of this step's rows (attention reads it).
  Tensor cache_after;
};

// A variant's outputs (only those it changes need be present; the rest are the reference's), its fitted parameters
// in words and numbers, and a phrase for the sentence ("with a causal mask aligned top-left").
struct Variant {
  std::map<std::string, Tensor> out;
  nlohmann::json params = nlohmann::json::object();
  std::string phrase;
  // Ruled out by a cheap pre-test on a few tokens and columns (its residual there, relative to the tolerance), so
  // never computed whole; `out` is empty.
  double pretest_ratio = -1;
};

// The reference's outputs of the case's stage on its inputs, as the search hands them to a class.
using Outputs = std::map<std::string, Tensor>;

struct BugClass {
  std::string name;         // "rope.layout"
  std::string family;       // "rope"
  std::vector<Stage> stages;
  std::string description;  // one line, for users
  int complexity = 0;       // parameters fitted; simpler classes are listed first
  // The class's variants on this case, parameters fitted against c.cand; `ref` holds the reference's outputs.
  std::function<std::vector<Variant>(const StageCase& c, const Outputs& ref)> run;
};

// The whole catalogue, in family order.
const std::vector<BugClass>& catalogue();
// Per family (each file registers its own).
std::vector<BugClass> norm_classes();
std::vector<BugClass> rope_classes();
std::vector<BugClass> attention_classes();
std::vector<BugClass> projection_classes();
std::vector<BugClass> cache_classes();
std::vector<BugClass> absorb_classes();
std::vector<BugClass> dsa_classes();
std::vector<BugClass> output_classes();

// The catalogue as a table: markdown (docs/hypotheses.md) or plain text (`mla-bisect classes`).
std::string catalogue_markdown();
std::string catalogue_text();

struct OutputFit {
  double rel_l2 = 0, token_rel = 0, tol = 0, token_tol = 0;
  bool nonfinite_agree = true;
  bool within = false;
};

struct Tried {
  std::string cls, description, phrase;
  nlohmann::json params;
  int complexity = 0;
  bool confirmed = false;
  std::map<std::string, OutputFit> outputs;
  double worst = 0;  // the largest ratio of residual to tolerance over the outputs (<= 1 within)
  double class_seconds = 0;  // the time its class took (every variant, fits included)
  bool pretest_only = false;   // ruled out on a few tokens and columns: `worst` is that pre-test's ratio
};

struct Report {
  bool searched = false;
  std::string reason;  // why not searched, or what was searched
  std::string stage;
  int layer = 0;
  std::string focus;
  std::map<std::string, OutputFit> as_run;  // the reference's computation against the candidate
  std::vector<Tried> confirmed;             // simplest first
  std::vector<Tried> tried;                 // every variant, confirmed or not, best first
  std::vector<std::string> skipped;         // classes not tried: a simpler class was confirmed first
  std::vector<std::string> not_run;         // "class: why" for classes that could not run on this case
  double seconds = 0;
  // "the candidate's attn_out equals the reference's with a causal mask aligned top-left: rel_l2 0.0011 vs 0.57 as
  // run"; empty when nothing is confirmed.
  std::string sentence() const;
};

// Runs every class of the case's stage. A stage whose reference computation already agrees with the candidate is not
// searched (nothing to explain).
Report search(StageCase c);

// Builds the case of `stage` at `layer`: inputs from `inputs_dump` (the tensors the candidate's stage read: the
// capture itself for a replay, the reference's full run for a bisect's isolation), outputs from `outputs_dump` (the
// candidate's), tolerances from `tol`, weights (a view of `w`: it must outlive the search) and batch from the run.
// Returns false, with `why`, when a tensor the
// search needs is not held in full.
bool make_case(StageCase& c, const Dump& inputs_dump, const Dump& outputs_dump, const MlaConfig& cfg,
               const RunSpec& spec, const LayerWeights& w, const Inputs& run_inputs, int layer, Stage stage,
               const std::map<std::string, Tolerance>& tol, std::string& why);

nlohmann::json report_to_json(const Report& r);
// A few lines for the terminal: what was searched, what is confirmed (or the closest class and its residual).
void print_report(std::ostream& os, const Report& r);
// The diagnosis with the search's answer: a confirmed class becomes the diagnosis (the pattern kept as evidence);
// without one, the evidence says that no class reproduced it and which came closest.
void explain(Diagnosis& d, const Report& r);
// The tolerances of `stage`'s outputs at `layer` in a comparison.
std::map<std::string, Tolerance> stage_tolerances(const CompareReport& rep, int layer, const std::string& stage);

}  // namespace mla::hyp
