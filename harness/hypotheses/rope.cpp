// Bug classes of the rope stage. Each runs on q and k together and on each alone (q and k with different rope is
// a bug of its own): the lane layout, rotated lanes written in the other order, positions offset, global or
// restarting, theta, YaRN off or with another factor, the cos/sin multiplier, rope not applied, applied twice,
// rotated the other way, positions rounded through bf16.
#include <algorithm>
#include <cmath>

#include "harness/hypotheses/common.h"
#include "reference/stages.h"

namespace mla::hyp {

namespace rope_family {

struct Rope {
  std::vector<int> positions;
  std::vector<double> inv_freq;
  double cs = 1;
  RopeStyle style = RopeStyle::RopeStyle_interleaved;
};

Rope of_config(const StageCase& c) { return {c.batch.positions, c.cfg.inv_freq, c.cfg.rope_mscale, c.cfg.rope_style}; }

Tensor apply(const Tensor& x, const Rope& r) { return ref::rope(x, r.positions, r.inv_freq, r.cs, r.style); }

// The lanes of each row [.., R] reordered: to_halves moves interleaved pairs (2i, 2i+1) to (i, i + R/2); the other
// direction moves them back.
Tensor permute_lanes(const Tensor& x, bool to_halves) {
  const int64_t R = x.dim(-1), rows = x.numel() / R, half = R / 2;
  Tensor y(x.shape);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < half; ++i) {
      const float* in = x.ptr() + r * R;
      float* out = y.ptr() + r * R;
      if (to_halves) {
        out[i] = in[2 * i];
        out[i + half] = in[2 * i + 1];
      } else {
        out[2 * i] = in[i];
        out[2 * i + 1] = in[i + half];
      }
    }
  return y;
}

// Variants for q alone, k alone and both, from one transformation of a rope input into its output.
std::vector<Variant> per_target(const StageCase& c, const Outputs& ref, const std::function<Tensor(const Tensor&)>& f,
                                nlohmann::json params, const std::string& phrase) {
  std::vector<Variant> out;
  const Tensor q = f(input(c, "q_pe")), k = f(input(c, "k_pe"));
  for (int which = 0; which < 3; ++which) {
    Variant v;
    v.params = params;
    if (which != 1) v.out["q_pe_rope"] = q;
    if (which != 0) v.out["k_pe_rope"] = k;
    v.params["applies_to"] = which == 0 ? "q" : which == 1 ? "k" : "q and k";
    v.phrase = phrase + (which == 0 ? " on q only" : which == 1 ? " on k only" : "");
    out.push_back(std::move(v));
  }
  (void)ref;
  return out;
}

const char* style_name(RopeStyle s) {
  return s == RopeStyle::RopeStyle_interleaved ? "interleaved pairs (2i, 2i+1)" : "rotate-half pairs (i, i+R/2)";
}

BugClass make(std::string name, int complexity, std::string description,
              std::function<std::vector<Variant>(const StageCase&, const Outputs&)> run) {
  return make_class(std::move(name), "rope", {Stage::Stage_rope}, complexity, std::move(description), std::move(run));
}

// The config re-derived with one change (theta, YaRN), its rope.
Rope derived(const StageCase& c, const std::function<void(MlaConfig&)>& change) {
  MlaConfig m = c.cfg;
  change(m);
  m.derive();
  return {c.batch.positions, m.inv_freq, m.rope_mscale, c.cfg.rope_style};
}

}  // namespace rope_family

std::vector<BugClass> rope_classes() {
  using namespace rope_family;
  std::vector<BugClass> v;
  v.push_back(make("rope.not_applied", 0, "no rotation: the rope lanes passed on as they came", [](const StageCase& c, const Outputs& ref) {
    return per_target(c, ref, [](const Tensor& x) { return x; }, {}, "with no rotation");
  }));
  v.push_back(make("rope.layout", 0, "the other lane pairing (interleaved (2i, 2i+1) vs rotate-half (i, i+R/2))",
                   [](const StageCase& c, const Outputs& ref) {
                     Rope r = of_config(c);
                     r.style = other_rope_style(r.style);
                     return per_target(c, ref, [&](const Tensor& x) { return apply(x, r); },
                                       {{"layout", r.style == RopeStyle::RopeStyle_neox ? "rotate-half" : "interleaved"}},
                                       std::string("with ") + style_name(r.style) + " (the model's: " +
                                           style_name(c.cfg.rope_style) + ")");
                   }));
  v.push_back(make("rope.output_lanes", 0, "rotated right, but the lanes written in the other order (interleaved <-> halves)",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     const Rope r = of_config(c);
                     for (bool to_halves : {true, false}) {
                       auto vs = per_target(c, ref, [&](const Tensor& x) { return permute_lanes(apply(x, r), to_halves); },
                                            {{"order", to_halves ? "halves" : "interleaved"}},
                                            std::string("with its rotated lanes written in ") +
                                                (to_halves ? "half-split" : "interleaved") + " order");
                       out.insert(out.end(), vs.begin(), vs.end());
                     }
                     return out;
                   }));
  v.push_back(make("rope.double", 0, "the rotation applied twice", [](const StageCase& c, const Outputs& ref) {
    const Rope r = of_config(c);
    return per_target(c, ref, [&](const Tensor& x) { return apply(apply(x, r), r); }, {}, "with the rotation applied twice");
  }));
  v.push_back(make("rope.direction", 0, "rotated the other way (the sine's sign flipped)", [](const StageCase& c, const Outputs& ref) {
    Rope r = of_config(c);
    for (auto& p : r.positions) p = -p;
    return per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {}, "rotated the other way (sin negated)");
  }));
  v.push_back(make("rope.position_offset", 1, "every position off by k (fitted, |k| <= 8)", [](const StageCase& c, const Outputs& ref) {
    std::vector<Variant> out;
    for (int k = -8; k <= 8; ++k) {
      if (k == 0) continue;
      Rope r = of_config(c);
      for (auto& p : r.positions) p += k;
      auto vs = per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {{"offset", k}},
                           "at positions offset by " + std::string(k > 0 ? "+" : "") + std::to_string(k));
      out.insert(out.end(), vs.begin(), vs.end());
    }
    return out;
  }));
  v.push_back(make("rope.positions_global", 0, "positions counted over the whole batch, not restarting per sequence",
                   [](const StageCase& c, const Outputs& ref) {
                     Rope r = of_config(c);
                     bool differs = false;
                     for (int64_t t = 0; t < static_cast<int64_t>(r.positions.size()); ++t) {
                       const int p = static_cast<int>(t) + c.batch.context_lens[0];
                       differs |= p != r.positions[t];
                       r.positions[t] = p;
                     }
                     if (!differs) return std::vector<Variant>{};
                     return per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {},
                                       "at positions counted over the whole batch (not per sequence)");
                   }));
  v.push_back(make("rope.positions_restart", 0, "positions restarting at 0 in each step (the cached context not counted)",
                   [](const StageCase& c, const Outputs& ref) {
                     Rope r = of_config(c);
                     bool differs = false;
                     for (int64_t t = 0; t < static_cast<int64_t>(r.positions.size()); ++t) {
                       const int p = static_cast<int>(t) - c.batch.first_token(c.batch.token_seq[t]);
                       differs |= p != r.positions[t];
                       r.positions[t] = p;
                     }
                     if (!differs) return std::vector<Variant>{};
                     return per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {},
                                       "at positions restarting at 0 in this step (the context not counted)");
                   }));
  v.push_back(make("rope.positions_bf16", 0, "positions rounded through bf16 (exact only up to 256)", [](const StageCase& c, const Outputs& ref) {
    Rope r = of_config(c);
    bool differs = false;
    for (auto& p : r.positions) {
      const int q = static_cast<int>(round_bf16(static_cast<float>(p)));
      differs |= q != p;
      p = q;
    }
    if (!differs) return std::vector<Variant>{};
    return per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {}, "at positions rounded through bf16");
  }));
  v.push_back(make("rope.theta", 1, "another rope base theta (fitted over the bases real models use)", [](const StageCase& c, const Outputs& ref) {
    std::vector<Variant> out;
    for (double th : {1e4, 5e4, 1e5, 5e5, 1e6, 1e7}) {
      if (close_to(th, c.cfg.rope_theta, 1e-6)) continue;
      const Rope r = derived(c, [&](MlaConfig& m) { m.rope_theta = th; });
      auto vs = per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {{"theta", th}},
                           "with theta " + num(th) + " (the config's " + num(c.cfg.rope_theta) + ")");
      out.insert(out.end(), vs.begin(), vs.end());
    }
    return out;
  }));
  v.push_back(make("rope.yarn_off", 0, "YaRN scaling not applied (plain frequencies, no cos/sin multiplier)",
                   [](const StageCase& c, const Outputs& ref) {
                     if (c.cfg.rope_scaling != RopeScaling::RopeScaling_yarn) return std::vector<Variant>{};
                     const Rope r = derived(c, [](MlaConfig& m) { m.rope_scaling = RopeScaling::RopeScaling_none; });
                     return per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {}, "without YaRN scaling");
                   }));
  v.push_back(make("rope.yarn_factor", 1, "YaRN with another factor (fitted over common factors)", [](const StageCase& c, const Outputs& ref) {
    std::vector<Variant> out;
    if (c.cfg.rope_scaling != RopeScaling::RopeScaling_yarn) return out;
    for (double f : {2.0, 4.0, 8.0, 16.0, 32.0, 40.0, 64.0}) {
      if (close_to(f, c.cfg.yarn.factor, 1e-9)) continue;
      const Rope r = derived(c, [&](MlaConfig& m) { m.yarn.factor = f; });
      auto vs = per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {{"factor", f}},
                           "with YaRN factor " + num(f) + " (the config's " + num(c.cfg.yarn.factor) + ")");
      out.insert(out.end(), vs.begin(), vs.end());
    }
    return out;
  }));
  v.push_back(make("rope.mscale", 1, "cos/sin multiplied by another YaRN mscale (the attention factor in the rotation)",
                   [](const StageCase& c, const Outputs& ref) {
                     std::vector<Variant> out;
                     if (c.cfg.rope_scaling != RopeScaling::RopeScaling_yarn) return out;
                     const double s = c.cfg.yarn.factor;
                     const double m = yarn_get_mscale(s, c.cfg.yarn.mscale), ma = yarn_get_mscale(s, c.cfg.yarn.mscale_all_dim);
                     const double d = yarn_get_mscale(s, 1.0);
                     std::vector<double> seen;
                     for (double cs : {1.0, m, ma, d, m * m, 0.1 * std::log(s) + 1.0}) {
                       if (close_to(cs, c.cfg.rope_mscale, 1e-6) || std::count(seen.begin(), seen.end(), cs)) continue;
                       seen.push_back(cs);
                       Rope r = of_config(c);
                       r.cs = cs;
                       auto vs = per_target(c, ref, [&](const Tensor& x) { return apply(x, r); }, {{"cos_sin_scale", cs}},
                                            "with cos/sin multiplied by " + num(cs) + " (the config's " +
                                                num(c.cfg.rope_mscale) + ")");
                       out.insert(out.end(), vs.begin(), vs.end());
                     }
                     return out;
                   }));
  return v;
}

}  // namespace mla::hyp
