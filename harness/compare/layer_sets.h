// Two whole-model captures of two systems (the broken stack and a known-good one, same prompt): where does the error
// enter? Per captured layer, the layer's input h (in full in each capture's /inputs) and its attention output o
// (probe o, full or sketch) are compared; the first layer whose input differs while the layer before agreed at its
// attention output puts the error between them, outside MLA; an attention output that differs on agreeing inputs puts
// it in that layer's MLA.
//
// Bounds: two correct systems differ by rounding that adds up layer after layer. A layer at depth d (its checkpoint
// index + 1; + 1 more for its attention output) is held to k x u x d, u the unit roundoff of the less precise side's
// dtype (bf16 2^-8, fp16 2^-11, fp8 e4m3 2^-4, fp32 2^-24; at least 1e-5), k = --tol-factor.
#pragma once
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mla {

struct LayerPair {
  int layer = 0;
  double h_rel = 0, h_bound = 0;  // the input h (full tensors)
  bool h_off = false;
  bool has_o = false;             // both captures hold probe o
  double o_rel = 0, o_bound = 0;
  std::string o_basis;            // full | sketch (an estimate)
  bool o_off = false;
};

struct LayerSetComparison {
  std::string candidate, reference;
  std::vector<LayerPair> layers;
  double unit_roundoff = 0;
  std::string dtypes;    // "bf16 vs fp32"
  std::string headline;
  int first_layer = -1;  // where the error shows first (its input, or its attention output)
  int exit_code = 0;     // 0 every layer agrees, 1 a difference
};

// candidate and reference: layer -> capture file (layer_capture_files). Compares the layers both hold.
LayerSetComparison compare_layer_sets(const std::string& candidate, const std::map<int, std::string>& cand_files,
                                      const std::string& reference, const std::map<int, std::string>& ref_files,
                                      double k);
void print_layer_sets(std::ostream& os, const LayerSetComparison& c);
nlohmann::json layer_sets_to_json(const LayerSetComparison& c);

}  // namespace mla
