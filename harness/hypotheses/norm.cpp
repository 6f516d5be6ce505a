// Bug classes of the RMSNorm stages (input_norm, q_a_norm, kv_a_norm): eps, a skipped norm, a missing weight,
// the weight read as (1 + w), the mean square over the wrong width, the weight wrapped, an fp16 sum of squares that
// overflows, a LayerNorm in the RMSNorm's place.
#include <algorithm>
#include <cmath>

#include "harness/hypotheses/common.h"

namespace mla::hyp {

namespace norm_family {

const std::vector<Stage> kStages = {Stage::Stage_input_norm, Stage::Stage_q_a_norm, Stage::Stage_kv_a_norm};

struct NormIo {
  const Tensor* x;
  const Tensor* w;
  std::string out;
};

NormIo io(const StageCase& c) {
  switch (c.stage) {
    case Stage::Stage_input_norm: return {&input(c, "h"), &c.w->input_norm, "x"};
    case Stage::Stage_q_a_norm: return {&input(c, "q_a"), &c.w->q_a_norm, "q_c"};
    default: return {&input(c, "kv_c"), &c.w->kv_a_norm, "kv_c_norm"};
  }
}

struct Knobs {
  double eps = 1e-6;
  bool weight = true, plus_one = false, center = false, fp16_squares = false;
  int64_t width = 0, wrap = 0;
};

// RMSNorm with every knob the classes turn; the defaults with the config's eps are the reference's.
Tensor rms(const Tensor& x, const Tensor& w, const Knobs& k) {
  const int64_t C = x.dim(-1), T = x.numel() / C;
  Tensor y(x.shape);
  const int64_t n = k.width > 0 && k.width < C ? k.width : C;
  for (int64_t t = 0; t < T; ++t) {
    const float* in = x.ptr() + t * C;
    float* out = y.ptr() + t * C;
    double mean = 0;
    if (k.center) {
      for (int64_t i = 0; i < C; ++i) mean += in[i];
      mean /= static_cast<double>(C);
    }
    double ss = 0;
    bool overflow = false;
    for (int64_t i = 0; i < n; ++i) {
      const double d = in[i] - mean;
      if (k.fp16_squares && std::isinf(round_fp16(static_cast<float>(d * d)))) overflow = true;
      ss += d * d;
    }
    const double inv = overflow ? 0.0 : 1.0 / std::sqrt(ss / static_cast<double>(n) + k.eps);
    for (int64_t i = 0; i < C; ++i) {
      double g = 1.0;
      if (k.weight) g = w.data[k.wrap > 0 ? i % k.wrap : i] + (k.plus_one ? 1.0 : 0.0);
      out[i] = static_cast<float>((in[i] - mean) * inv * g);
    }
  }
  return y;
}

BugClass make(std::string name, int complexity, std::string description,
              std::function<std::vector<Variant>(const StageCase&, const NormIo&)> run) {
  BugClass k;
  k.name = std::move(name);
  k.family = "norm";
  k.stages = kStages;
  k.description = std::move(description);
  k.complexity = complexity;
  k.run = [run](const StageCase& c, const Outputs&) { return run(c, io(c)); };
  return k;
}

Knobs base(const StageCase& c) {
  Knobs k;
  k.eps = c.cfg.rms_eps;
  return k;
}

}  // namespace norm_family

std::vector<BugClass> norm_classes() {
  using namespace norm_family;
  std::vector<BugClass> v;
  v.push_back(make("norm.skipped", 0, "the norm left out: its input passed on unchanged", [](const StageCase&, const NormIo& n) {
    return std::vector<Variant>{variant(n.out, *n.x, {}, "with the norm skipped (its input passed on)")};
  }));
  v.push_back(make("norm.no_weight", 0, "normalized but never multiplied by its weight", [](const StageCase& c, const NormIo& n) {
    Knobs k = base(c);
    k.weight = false;
    return std::vector<Variant>{variant(n.out, rms(*n.x, *n.w, k), {}, "without its weight")};
  }));
  v.push_back(make("norm.weight_plus_one", 0, "the weight applied as (1 + w), the Gemma convention",
                   [](const StageCase& c, const NormIo& n) {
                     Knobs k = base(c);
                     k.plus_one = true;
                     return std::vector<Variant>{variant(n.out, rms(*n.x, *n.w, k), {}, "with the weight applied as (1 + w)")};
                   }));
  v.push_back(make("norm.layernorm", 0, "a LayerNorm (mean subtracted) where the model has an RMSNorm",
                   [](const StageCase& c, const NormIo& n) {
                     Knobs k = base(c);
                     k.center = true;
                     return std::vector<Variant>{variant(n.out, rms(*n.x, *n.w, k), {}, "with the row mean subtracted (a LayerNorm)")};
                   }));
  v.push_back(make("norm.fp16_overflow", 0, "the sum of squares taken in fp16: rows with |x| past 256 overflow to inf and come out 0",
                   [](const StageCase& c, const NormIo& n) {
                     Knobs k = base(c);
                     k.fp16_squares = true;
                     return std::vector<Variant>{variant(n.out, rms(*n.x, *n.w, k), {},
                                                         "with its squares in fp16 (rows that overflow come out 0)")};
                   }));
  v.push_back(make("norm.eps", 1, "another epsilon (fitted on a log grid)", [](const StageCase& c, const NormIo& n) {
    std::vector<Variant> out;
    const Tensor* y = cand(c, n.out);
    if (!y) return out;
    // The grid's best decade, refined by golden section on log10(eps) within the decades around it.
    auto err = [&](double le) {
      Knobs k = base(c);
      k.eps = std::pow(10.0, le);
      return rel_l2(*y, rms(*n.x, *n.w, k));
    };
    double best = 0, best_err = INFINITY;
    for (int e = -12; e <= 1; ++e)
      if (const double r = err(e); r < best_err) best_err = r, best = e;
    const double le = golden_min(err, best - 1, best + 1, 16);
    // A decade value when it fits as well: eps are written as powers of ten.
    const double eps = std::fabs(le - std::round(le)) < 0.02 ? std::pow(10.0, std::round(le)) : std::pow(10.0, le);
    if (close_to(eps, c.cfg.rms_eps, 0.05)) return out;
    Knobs k = base(c);
    k.eps = eps;
    out.push_back(variant(n.out, rms(*n.x, *n.w, k), {{"eps", eps}, {"config_eps", c.cfg.rms_eps}},
                          "with eps " + num(eps) + " (the config's " + num(c.cfg.rms_eps) + ")"));
    return out;
  }));
  v.push_back(make("norm.width", 1, "the mean square over another width than the row's (another norm's dim, or half)",
                   [](const StageCase& c, const NormIo& n) {
                     std::vector<Variant> out;
                     const int64_t C = n.x->dim(-1);
                     std::vector<int64_t> widths = {c.cfg.hidden, c.cfg.q_lora_rank, c.cfg.kv_lora_rank,
                                                    c.cfg.kv_lora_rank + c.cfg.qk_rope, C / 2, C / 4};
                     std::vector<int64_t> seen;
                     for (int64_t wd : widths) {
                       if (wd <= 0 || wd >= C || std::count(seen.begin(), seen.end(), wd)) continue;
                       seen.push_back(wd);
                       Knobs k = base(c);
                       k.width = wd;
                       out.push_back(variant(n.out, rms(*n.x, *n.w, k), {{"width", wd}, {"row", C}},
                                             "with the mean square over the first " + std::to_string(wd) + " of " +
                                                 std::to_string(C) + " channels"));
                     }
                     return out;
                   }));
  v.push_back(make("norm.weight_wrap", 1, "channel c multiplied by w[c mod p]: the weight loaded for part of the row only",
                   [](const StageCase& c, const NormIo& n) {
                     std::vector<Variant> out;
                     const int64_t C = n.x->dim(-1);
                     for (int64_t p : {C / 2, C / 4, int64_t{128}, int64_t{64}}) {
                       if (p <= 0 || p >= C || C % p) continue;
                       Knobs k = base(c);
                       k.wrap = p;
                       out.push_back(variant(n.out, rms(*n.x, *n.w, k), {{"period", p}},
                                             "with channel c multiplied by w[c mod " + std::to_string(p) + "]"));
                     }
                     return out;
                   }));
  return v;
}

}  // namespace mla::hyp
