// Two whole-model captures compared layer by layer (harness/compare/layer_sets.h).
#include "harness/compare/layer_sets.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "harness/compare/compare.h"
#include "core/model/errors.h"
#include "probes/dump.h"

namespace mla {

namespace {

double ls_unit_roundoff(const std::string& dtype) {
  if (dtype == "bf16") return std::ldexp(1.0, -8);
  if (dtype == "fp16") return std::ldexp(1.0, -11);
  if (dtype.rfind("fp8", 0) == 0) return std::ldexp(1.0, -4);
  return std::ldexp(1.0, -24);
}

double ls_rel_l2(const Tensor& a, const Tensor& b) {
  double e2 = 0, r2 = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = static_cast<double>(a.data[i]) - b.data[i];
    e2 += d * d;
    r2 += static_cast<double>(b.data[i]) * b.data[i];
  }
  return rel_of_sums(e2, r2);
}

std::string ls_list_layers(const std::vector<int>& v) {
  if (v.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return s;
}

std::string ls_num(double v) {
  std::ostringstream o;
  o << std::setprecision(3) << v;
  return o.str();
}

}  // namespace

LayerSetComparison compare_layer_sets(const std::string& candidate, const std::map<int, std::string>& cand_files,
                                      const std::string& reference, const std::map<int, std::string>& ref_files,
                                      double k) {
  LayerSetComparison c;
  c.candidate = candidate;
  c.reference = reference;
  std::vector<int> common;
  for (const auto& [l, f] : cand_files)
    if (ref_files.count(l)) common.push_back(l);
  if (common.empty())
    throw UsageError("cannot compare " + candidate + " with " + reference + ": no layer captured in both");
  std::string cd, rd;
  std::vector<std::pair<Dump, Dump>> pairs;
  for (int l : common) {
    Dump a = read_dump(cand_files.at(l)), b = read_dump(ref_files.at(l));
    if (!a.has_inputs || !b.has_inputs)
      throw UsageError((a.has_inputs ? ref_files.at(l) : cand_files.at(l)) + ": no /inputs (the layer's input h)");
    if (a.inputs.x.shape != b.inputs.x.shape)
      throw UsageError("cannot compare layer " + std::to_string(l) + ": inputs " + shape_string(a.inputs.x.shape) +
                       " vs " + shape_string(b.inputs.x.shape) + " (the same prompt, batch and padding on both sides)");
    cd = a.meta.engine_dtype.empty() ? "fp32" : a.meta.engine_dtype;
    rd = b.meta.engine_dtype.empty() ? "fp32" : b.meta.engine_dtype;
    pairs.emplace_back(std::move(a), std::move(b));
  }
  c.dtypes = cd + " vs " + rd;
  c.unit_roundoff = std::max(ls_unit_roundoff(cd), ls_unit_roundoff(rd));
  const auto bound = [&](double depth) { return std::max(k * c.unit_roundoff * depth, 1e-5); };
  for (size_t i = 0; i < common.size(); ++i) {
    const Dump &a = pairs[i].first, &b = pairs[i].second;
    LayerPair p;
    p.layer = common[i];
    p.h_rel = ls_rel_l2(a.inputs.x, b.inputs.x);
    p.h_bound = bound(p.layer + 1.0);
    p.h_off = !(p.h_rel <= p.h_bound);
    const DumpProbe *oa = a.find(0, "o"), *ob = b.find(0, "o");
    if (oa && ob && oa->shape == ob->shape) {
      const Gathered ga = gather(*oa), gb = gather(*ob);
      const Metrics m = compare_gathered(ga, gb, *oa, 0, CompareOptions{});
      p.has_o = true;
      p.o_rel = m.rel_l2;
      p.o_basis = m.basis;
      p.o_bound = bound(p.layer + 2.0);
      p.o_off = !(p.o_rel <= p.o_bound);
    }
    c.layers.push_back(p);
  }

  // The first event in layer order: an input that differs, or an attention output that differs on agreeing inputs.
  std::vector<int> agreed;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerPair& p = c.layers[i];
    if (p.h_off) {
      c.exit_code = 1;
      c.first_layer = p.layer;
      const std::string h = "layer " + std::to_string(p.layer) + "'s input differs (rel_l2 " + ls_num(p.h_rel) +
                            " > bound " + ls_num(p.h_bound) + ")";
      if (i == 0) {
        c.headline = h + ", the first layer compared: the error enters before it (embeddings" +
                     (p.layer > 0 ? ", or layers 0-" + std::to_string(p.layer - 1) + ", not compared)" : std::string(")"));
      } else {
        const LayerPair& q = c.layers[i - 1];
        const std::string gap = q.layer + 1 == p.layer
                                    ? std::string()
                                    : " (or in layers " + std::to_string(q.layer + 1) + "-" +
                                          std::to_string(p.layer - 1) + ", not compared)";
        c.headline = "layers " + ls_list_layers(agreed) + ": inputs" + (q.has_o ? " and attention outputs" : "") +
                     " agree; " + h + (q.has_o ? " while layer " + std::to_string(q.layer) +
                                                     "'s attention output agreed: the error enters between them, "
                                                     "outside MLA (layer " + std::to_string(q.layer) +
                                                     "'s MLP/MoE or its residual add; a MoE router that picks other experts for some tokens at another "
                                                     "precision also shows here)"
                                               : ": the error enters after layer " + std::to_string(q.layer) +
                                                     "'s input (its attention output o is not in both captures)") +
                     gap;
      }
      break;
    }
    if (p.o_off) {
      c.exit_code = 1;
      c.first_layer = p.layer;
      c.headline = "layer " + std::to_string(p.layer) + "'s attention output differs (rel_l2 " + ls_num(p.o_rel) +
                   (p.o_basis == "full" ? "" : ", an estimate from sketches") + " > bound " + ls_num(p.o_bound) +
                   ") on inputs that agree (rel_l2 " + ls_num(p.h_rel) + "): layer " + std::to_string(p.layer) +
                   "'s MLA; replay it on its own inputs: mla-bisect replay " + c.candidate + " --weights CKPT --layers " +
                   std::to_string(p.layer) + ":" + std::to_string(p.layer + 1);
      break;
    }
    agreed.push_back(p.layer);
  }
  if (c.exit_code == 0)
    c.headline = "the two captures agree at every compared layer's input and attention output (layers " +
                 ls_list_layers(agreed) + ")";
  return c;
}

void print_layer_sets(std::ostream& os, const LayerSetComparison& c) {
  os << "== mla-bisect: " << c.headline << " ==\n\n";
  os << "candidate " << c.candidate << "\nreference " << c.reference << "\n\n";
  os << "layer  input h rel_l2     bound  attention o rel_l2     bound  basis    verdict\n";
  for (const auto& p : c.layers) {
    os << std::left << std::setw(7) << p.layer << std::right << std::setw(14) << ls_num(p.h_rel) << std::setw(10)
       << ls_num(p.h_bound) << std::setw(20) << (p.has_o ? ls_num(p.o_rel) : "-") << std::setw(10)
       << (p.has_o ? ls_num(p.o_bound) : "-") << "  " << std::left << std::setw(9) << (p.has_o ? p.o_basis : "-")
       << (p.h_off ? "input differs" : p.o_off ? "attention output differs" : "agrees") << std::right << "\n";
    if (p.layer == c.first_layer) break;
  }
  os << "\n(bounds: " << "k x u x depth, u = " << ls_num(c.unit_roundoff) << " the unit roundoff of the less precise side ("
     << c.dtypes << "); depth = layer + 1 for the input, + 2 for the attention output; rows stop at the first "
        "difference)\n";
}

nlohmann::json layer_sets_to_json(const LayerSetComparison& c) {
  nlohmann::json j = {{"schema_version", kJsonSchemaVersion}, {"command", "compare"}, {"candidate", c.candidate},
                      {"reference", c.reference}, {"headline", c.headline}, {"exit_code", c.exit_code},
                      {"dtypes", c.dtypes}, {"unit_roundoff", c.unit_roundoff}};
  j["first_layer"] = c.first_layer >= 0 ? nlohmann::json(c.first_layer) : nlohmann::json(nullptr);
  j["layers"] = nlohmann::json::array();
  for (const auto& p : c.layers) {
    nlohmann::json e = {{"layer", p.layer}, {"h_rel_l2", p.h_rel}, {"h_bound", p.h_bound}, {"h_off", p.h_off}};
    if (p.has_o) {
      e["o_rel_l2"] = p.o_rel;
      e["o_bound"] = p.o_bound;
      e["o_basis"] = p.o_basis;
      e["o_off"] = p.o_off;
    }
    j["layers"].push_back(std::move(e));
  }
  return j;
}

}  // namespace mla
