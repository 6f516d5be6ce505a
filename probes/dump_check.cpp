// The dump reader's checks against the model (probes/dump_check.h).
#include "probes/dump_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/model/errors.h"
#include "core/probe/probe_hash.h"

namespace mla::dump_detail {

void check_dtype(const std::string& where, const char* attr, const std::string& v, const char* allowed) {
  if (v.empty()) return;
  const std::string all = std::string("|") + allowed + "|";
  if (v.find('|') == std::string::npos && all.find("|" + v + "|") != std::string::npos) return;
  throw UsageError(where + ": " + attr + " '" + v + "' is not one of " + allowed);
}

namespace {

// The value of OCP float8 code `code`: e4m3fn (exp_bits 4: no infinities, NaN at S.1111.111) or e5m2 (exp_bits 5,
// IEEE-like: infinities and NaNs at exponent 31).
float fp8_value(unsigned code, int exp_bits) {
  const int mant_bits = 7 - exp_bits, bias = (1 << (exp_bits - 1)) - 1;
  const double s = (code & 0x80) ? -1.0 : 1.0;
  const unsigned e = (code >> mant_bits) & ((1u << exp_bits) - 1), m = code & ((1u << mant_bits) - 1);
  if (exp_bits == 4 && e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (exp_bits == 5 && e == 31)
    return m == 0 ? static_cast<float>(s * HUGE_VAL) : std::numeric_limits<float>::quiet_NaN();
  const double frac = static_cast<double>(m) / (1 << mant_bits);
  if (e == 0) return static_cast<float>(s * frac * std::ldexp(1.0, 1 - bias));
  return static_cast<float>(s * (1.0 + frac) * std::ldexp(1.0, static_cast<int>(e) - bias));
}

const ProbeTable& every_probe(bool weights = false) {
  static const ProbeTable t = make_probe_table(nullptr, nullptr), tw = make_probe_table(nullptr, nullptr, true);
  return weights ? tw : t;
}

}  // namespace

uint64_t fp8_checksum(const Tensor& t, int64_t T, const std::string& dtype, const std::string& where) {
  const int exp_bits = dtype == "fp8_e4m3" ? 4 : 5;
  std::map<uint32_t, uint32_t> code_of;  // float32 bits -> code, every non-NaN code
  for (unsigned c = 0; c < 256; ++c) {
    const float v = fp8_value(c, exp_bits);
    uint32_t b;
    std::memcpy(&b, &v, 4);
    if (!std::isnan(v)) code_of[b] = c;
  }
  const uint32_t nan_code = exp_bits == 4 ? 0x7f : 0x7e;
  const int64_t n = t.numel(), C = n / std::max<int64_t>(T, 1);
  return checksum_walk(t.ptr(), n, C, [&](float v, int64_t i) -> uint64_t {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    if (std::isnan(v)) return nan_code | ((b >> 24) & 0x80);
    const auto it = code_of.find(b);
    if (it == code_of.end())
      throw UsageError(where + "/data: value " + std::to_string(v) + " at flat index " + std::to_string(i) +
                       " is not an " + dtype + " value (the record's dtype)");
    return it->second;
  });
}

ProbeTable make_probe_table(const MlaConfig* cfg, const RunSpec* spec, bool weights) {
  ProbeTable t;
  std::vector<MlaConfig> cfgs;
  if (cfg) {
    cfgs.push_back(*cfg);
  } else {  // any dimensions do: only what every model shares is compared
    MlaConfig c = *find_preset("tiny");
    cfgs.push_back(c);
    c.q_lora_rank = 0;
    cfgs.push_back(c);
  }
  std::vector<GraphShape> shapes;
  if (cfg && spec) {
    shapes.push_back(spec->graph_shape());
  } else {
    for (const auto form : {AttentionForm::AttentionForm_mha, AttentionForm::AttentionForm_absorbed})
      for (const bool norm : {false, true}) {
        GraphShape g;
        g.tokens = 1;
        g.form = form;
        g.input_norm = norm;
        shapes.push_back(g);
      }
  }
  for (const auto& c : cfgs)
    for (const auto& g : shapes)
      for (const auto& p : weights ? build_weights(c, g) : build_graph(c, g).probes) {
        auto& v = t.by_name[p.name];
        if (v.empty()) t.names += (t.names.empty() ? "" : ", ") + p.name;
        v.push_back(p);
      }
  t.exact = cfg && spec;
  t.dims = cfg != nullptr;
  t.weights = weights;
  if (weights) {
    t.basis = t.exact ? "the weights of the dump's model and run options" : t.dims ? "the dump's model" : "the weight table";
  } else if (t.exact) {
    const GraphShape g = spec->graph_shape();
    t.basis = std::string("the graph of the dump's model and run options (") + form_name(g.form) + " form, " +
              std::to_string(g.tokens) + " tokens" + (g.input_norm ? ", layers starting at h" : "") +
              (cfg->has_q_lora() ? "" : ", no q LoRA") + ")";
  } else {
    t.basis = t.dims ? "the dump's model" : "the probe table";
  }
  return t;
}

void check_against_graph(const DumpProbe& p, const ProbeTable& t, const std::string& w) {
  const auto it = t.by_name.find(p.name);
  if (it == t.by_name.end()) {
    const ProbeTable& all = every_probe(t.weights);
    const char* what = t.weights ? "weight" : "probe";
    if (all.by_name.count(p.name))
      throw UsageError(w + ": '" + p.name + "' is not a " + what + " of " + t.basis + "; its " + what + "s: " + t.names);
    throw UsageError(w + ": '" + p.name + "' is not a " + what + " name (the " + what + "s: " + all.names + ")");
  }
  const ProbeSpec& e = it->second.front();
  const auto differs = [&](const char* attr, const std::string& got, const std::string& want) {
    throw UsageError(w + ": attribute '" + attr + "' is " + got + " but " + t.basis + " gives " + want + " for " +
                     p.name);
  };
  if (p.contract != contract_name(e.contract)) differs("contract", "'" + p.contract + "'", contract_name(e.contract));
  if (p.heads_axis != e.heads_axis)
    differs("heads_axis", std::to_string(p.heads_axis), std::to_string(e.heads_axis));
  std::vector<int64_t> want = e.shape;
  if (!t.exact && !t.weights) want[0] = p.shape[0];  // any T here; one T for every probe is checked across them
  if (t.dims ? p.shape != want : p.shape.size() != want.size())
    differs("shape", shape_string(p.shape),
            t.dims ? shape_string(want) : std::to_string(want.size()) + " axes");
  // Without a model, kv_cache's rope_from (kv_lora_rank) is unknown; read_probe checks its range.
  if ((t.dims || p.name != "kv_cache") && p.rope_from != e.rope_from)
    differs("rope_from", std::to_string(p.rope_from), std::to_string(e.rope_from));
  std::string stages;
  bool stage_ok = false;
  for (const auto& c : it->second) {
    const std::string s = stage_name(c.stage);
    stage_ok = stage_ok || s == p.stage;
    if (stages.find("'" + s + "'") == std::string::npos) stages += (stages.empty() ? "'" : " or '") + s + "'";
  }
  if (!stage_ok) differs("stage", "'" + p.stage + "'", stages);
  if (t.exact && p.order != e.order) differs("order", std::to_string(p.order), std::to_string(e.order));
}

void check_norms_agree(const std::string& w, const ProbeRecord& rec) {
  constexpr double kRel = 1e-3;
  const auto agree = [&](double a, double b) {
    return std::abs(a - b) <= kRel * std::max(a, b) + 1e-30;
  };
  if (rec.nan != 0 || rec.inf != 0 || !std::isfinite(rec.l2)) return;
  double sum = 0;
  for (float v : rec.token_l2) {
    if (!std::isfinite(v)) return;
    sum += static_cast<double>(v) * v;
  }
  if (!agree(rec.l2, std::sqrt(sum)))
    throw UsageError(w + ": l2 " + std::to_string(rec.l2) + " disagrees with its token_l2, whose rows make " +
                     std::to_string(std::sqrt(sum)) + " (the record's norms are not of one tensor: edited, or "
                     "written from two)");
  if (rec.head_l2.empty() || rec.token_l2.empty()) return;
  const size_t T = rec.token_l2.size(), H = rec.head_l2.size() / T;
  for (size_t t = 0; t < T; ++t) {
    double s = 0;
    for (size_t h = 0; h < H; ++h) s += static_cast<double>(rec.head_l2[t * H + h]) * rec.head_l2[t * H + h];
    if (!std::isfinite(s)) return;
    if (!agree(rec.token_l2[t], std::sqrt(s)))
      throw UsageError(w + ": token " + std::to_string(t) + "'s token_l2 " + std::to_string(rec.token_l2[t]) +
                       " disagrees with its head_l2, which make " + std::to_string(std::sqrt(s)) +
                       " (the record's norms are not of one tensor: edited, or written from two)");
  }
}

}  // namespace mla::dump_detail
