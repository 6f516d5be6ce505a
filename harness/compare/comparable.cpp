// What can be compared, and what is expected: two dumps checked as comparable and readable, the probes the
// reference's stage graph expects of the candidate, --tol overrides checked against them.
#include "harness/compare/compare.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "harness/compare/compare_internal.h"
#include "harness/compare/format.h"
#include "core/engine/engine.h"
#include "core/model/errors.h"
#include "probes/h5.h"

namespace mla {

namespace {

std::string probe_label(int layer, const std::string& name, bool multi_layer) {
  return multi_layer ? "layer" + std::to_string(layer) + "/" + name : name;
}

std::optional<MlaConfig> config_of(const Dump& d) {
  if (d.meta.model.is_null()) return std::nullopt;
  try {
    return d.config();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<RunSpec> spec_of(const Dump& d) {
  if (d.meta.run_options.is_null() || !d.meta.run_options.is_object()) return std::nullopt;
  try {
    return d.spec();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Cached tokens per sequence, one value each (the run spec allows one value for all, or none).
std::vector<int> context_per_sequence(const RunSpec& s) {
  std::vector<int> c(std::max(s.batch, 0), 0);
  for (size_t i = 0; i < c.size(); ++i)
    if (!s.context.empty()) c[i] = s.context.size() == 1 ? s.context[0] : (i < s.context.size() ? s.context[i] : 0);
  return c;
}

std::string ints_text(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "none" : s;
}

// "layer1/q_c" or "1/q_c" -> {1, "q_c"}; "q_c" -> {-1, "q_c"}.
std::pair<int, std::string> parse_probe_name(const std::string& text) {
  const auto slash = text.find('/');
  if (slash == std::string::npos) return {-1, text};
  std::string l = text.substr(0, slash);
  if (l.rfind("layer", 0) == 0) l = l.substr(5);
  if (l.empty() || l.size() > 6 || l.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError("probe '" + text + "': expected NAME, layerL/NAME or L/NAME");
  return {std::stoi(l), text.substr(slash + 1)};
}

}  // namespace

namespace compare_detail {

int ranks_of(const Dump& d) {
  int tp = std::max(d.meta.tp, 1);
  for (const auto& p : d.probes) tp = std::max(tp, static_cast<int>(p.ranks.size()));
  return tp;
}

std::string groups_text(const Dump& d) {
  const std::string file = !d.parts.empty() ? d.parts.front() : d.path;
  std::string out;
  try {
    if (h5::File::is_hdf5(file)) {
      const auto f = h5::File::open_read(file);
      for (const auto& c : f.children()) out += (out.empty() ? "" : ", ") + c;
      out = out.empty() ? "no groups" : "groups " + out;
    }
  } catch (const std::exception&) {
    out.clear();
  }
  std::map<int, int> per_layer;
  for (const auto& p : d.probes) ++per_layer[p.layer];
  std::string layers;
  for (const auto& [l, n] : per_layer)
    layers += (layers.empty() ? "" : ", ") + ("layer" + std::to_string(l) + " (" + std::to_string(n) + " probes)");
  if (layers.empty()) layers = "no probes read";
  return out.empty() ? layers : out + "; probes read: " + layers;
}

}  // namespace compare_detail

std::string ProbeResult::label() const {
  return weight ? "weight " + probe_label(layer, name, multi_layer) : probe_label(layer, name, multi_layer);
}

std::vector<std::string> check_comparable(const Dump& a, const Dump& b) {
  std::vector<std::string> diff;
  auto differ = [&](const std::string& what, const std::string& x, const std::string& y) {
    if (x != y) diff.push_back(what + ": " + x + " vs " + y);
  };
  const auto ca = config_of(a), cb = config_of(b);
  if (ca && cb) {
    differ("hidden size", std::to_string(ca->hidden), std::to_string(cb->hidden));
    differ("attention heads", std::to_string(ca->heads), std::to_string(cb->heads));
    differ("q LoRA rank", std::to_string(ca->q_lora_rank), std::to_string(cb->q_lora_rank));
    differ("kv LoRA rank", std::to_string(ca->kv_lora_rank), std::to_string(cb->kv_lora_rank));
    differ("qk nope head dim", std::to_string(ca->qk_nope), std::to_string(cb->qk_nope));
    differ("qk rope head dim", std::to_string(ca->qk_rope), std::to_string(cb->qk_rope));
    differ("v head dim", std::to_string(ca->v_head), std::to_string(cb->v_head));
  }
  const auto sa = spec_of(a), sb = spec_of(b);
  if (sa && sb) {
    differ("mode", mode_name(sa->mode), mode_name(sb->mode));
    differ("tokens per sequence", std::to_string(sa->tokens), std::to_string(sb->tokens));
    differ("batch", std::to_string(sa->batch), std::to_string(sb->batch));
    differ("context", ints_text(context_per_sequence(*sa)), ints_text(context_per_sequence(*sb)));
    differ("layer input", sa->graph_shape().input_norm ? "h (input_norm)" : "x",
           sb->graph_shape().input_norm ? "h (input_norm)" : "x");
  } else {
    if (!a.meta.mode.empty() && !b.meta.mode.empty()) differ("mode", a.meta.mode, b.meta.mode);
    if (a.has_inputs && b.has_inputs) {
      differ("inputs x", shape_string(a.inputs.x.shape), shape_string(b.inputs.x.shape));
      differ("new tokens per sequence", ints_text(a.inputs.batch.new_lens), ints_text(b.inputs.batch.new_lens));
      differ("context", ints_text(a.inputs.batch.context_lens), ints_text(b.inputs.batch.context_lens));
    }
  }
  std::vector<std::string> shapes;
  for (const auto& pb : b.probes)
    if (const DumpProbe* pa = a.find(pb.layer, pb.name); pa && pa->shape != pb.shape)
      shapes.push_back("layer" + std::to_string(pb.layer) + "/" + pb.name + " " + shape_string(pa->shape) + " vs " +
                       shape_string(pb.shape));
  if (!shapes.empty()) {
    std::string s = "probe shapes: ";
    for (size_t i = 0; i < shapes.size() && i < 6; ++i) s += (i ? ", " : "") + shapes[i];
    if (shapes.size() > 6) s += " and " + std::to_string(shapes.size() - 6) + " more";
    diff.push_back(s);
  }
  return diff;
}

void require_comparable(const Dump& a, const Dump& b) {
  const auto diff = check_comparable(a, b);
  if (diff.empty()) return;
  std::string msg = "cannot compare " + a.path + " with " + b.path + ", runs of different shapes (each line: " + a.path +
                    " vs " + b.path + "):";
  for (const auto& d : diff) msg += "\n  " + d;
  throw UsageError(msg);
}

void require_readable(const Dump& d) {
  const int tp = compare_detail::ranks_of(d);
  for (const auto& p : d.probes) {
    const std::string where = d.path + ": layer" + std::to_string(p.layer) + "/" + p.name;
    if (p.ranks.empty())
      throw UsageError(where + " has no rank records (rank0/ ... with the probe's stats and data): its data is "
                       "somewhere an mla-bisect dump does not keep it; the dump cannot be read");
    if (d.complete() && static_cast<int>(p.ranks.size()) != tp)
      throw UsageError(where + " has records for " + std::to_string(p.ranks.size()) + " of " + std::to_string(tp) +
                       " ranks, yet the dump says it is complete; the dump cannot be read");
    for (size_t r = 0; r < p.ranks.size(); ++r)
      if (p.ranks[r].level == ProbeLevel::ProbeLevel_full && p.ranks[r].data.numel() == 0)
        throw UsageError(where + "/rank" + std::to_string(d.rank_of(r)) +
                         " says level full but holds no data (no 'data' dataset where the dump keeps it); the dump "
                         "cannot be read");
  }
}

ExpectedProbes expected_probes(const Dump& a, const Dump& b, const CompareOptions& opt) {
  ExpectedProbes ex;
  const auto cb = config_of(b);
  const auto sb = spec_of(b);
  std::optional<StageGraph> graph;
  if (cb && sb) {
    try {
      graph = build_graph(*cb, sb->graph_shape());
    } catch (const std::exception&) {
      graph.reset();
    }
  }
  if (graph) {
    ex.from = "the stage graph of " + b.path + "'s config and run spec";
    // Another attention form computes the same attention through other intermediates: those are not expected.
    std::optional<StageGraph> graph_a;
    const auto ca = config_of(a);
    const auto sa = spec_of(a);
    if (ca && sa && sa->form != sb->form) {
      try {
        graph_a = build_graph(*ca, sa->graph_shape());
      } catch (const std::exception&) {
        graph_a.reset();
      }
    }
    std::string other_form;
    for (int l = 0; l < std::max(sb->layers, 1); ++l)
      for (const auto& p : graph->probes) {
        if (graph_a && !graph_a->find(p.name)) {
          if (l == 0) other_form += (other_form.empty() ? "" : ", ") + p.name;
          continue;
        }
        ex.probes.push_back({l, p.name, stage_name(p.stage), contract_name(p.contract), p.shape, p.order, false});
      }
    if (!other_form.empty())
      ex.notes.push_back(std::string("attention forms differ (") + form_name(sa->form) + " vs " + form_name(sb->form) +
                         "): " + other_form + " exist only in the reference's form, not compared");
  } else {
    ex.from = b.path + "'s own probes (it has no model configuration and run options to build the stage graph from)";
    for (const auto& p : b.probes) ex.probes.push_back({p.layer, p.name, p.stage, p.contract, p.shape, p.order, false});
  }
  int max_layer = 0;
  for (const auto& p : ex.probes) max_layer = std::max(max_layer, p.layer);
  ex.multi_layer = max_layer > 0;

  // A name matches every layer's probe of that name, or one layer's.
  auto matches = [](const ExpectedProbe& p, const std::pair<int, std::string>& want) {
    return p.name == want.second && (want.first < 0 || want.first == p.layer);
  };
  auto check_names = [&](const std::vector<std::string>& names, const char* option) {
    std::vector<std::pair<int, std::string>> out;
    for (const auto& n : names) {
      if (n.empty()) continue;
      const auto want = parse_probe_name(n);
      const bool known = std::any_of(ex.probes.begin(), ex.probes.end(), [&](const auto& p) { return matches(p, want); });
      if (!known) {
        std::string have;
        for (const auto& p : ex.probes)
          if (p.layer == 0) have += (have.empty() ? "" : ", ") + p.name;
        throw UsageError(std::string(option) + " " + n + ": no such probe in " + ex.from + " (" +
                         (max_layer == 0 ? std::string("layer 0 only") : "layers 0-" + std::to_string(max_layer)) +
                         "; probes: " + have + ")");
      }
      out.push_back(want);
    }
    return out;
  };
  const auto only = check_names(opt.only, "--probes");
  const auto allowed = check_names(opt.allow_missing, "--allow-missing");
  if (!only.empty()) {
    std::vector<ExpectedProbe> kept;
    for (const auto& p : ex.probes)
      if (std::any_of(only.begin(), only.end(), [&](const auto& w) { return matches(p, w); })) kept.push_back(p);
    ex.probes = std::move(kept);
    ex.from += ", narrowed to the selected probes";
  }
  // A capture (its engine is none of this build's: HF transformers, vLLM, a Recorder) holds the probes its system
  // recorded, any subset: the others are not captured, listed and not compared, as replay treats them.
  const auto engines = engine_names();
  if (only.empty() && a.complete() && !engines.empty() &&
      std::find(engines.begin(), engines.end(), a.meta.engine) == engines.end()) {
    std::vector<ExpectedProbe> kept;
    std::string not_captured;
    for (auto& p : ex.probes)
      if (a.find(p.layer, p.name))
        kept.push_back(p);
      else
        not_captured += (not_captured.empty() ? "" : ", ") + ("layer" + std::to_string(p.layer) + "/" + p.name);
    if (!not_captured.empty() && !kept.empty()) {
      ex.probes = std::move(kept);
      ex.notes.push_back("not captured (not compared): " + not_captured + " (the candidate is a capture by '" +
                         (a.meta.engine.empty() ? std::string("capture") : a.meta.engine) +
                         "', which may record any subset of the probes)");
    }
  }
  for (auto& p : ex.probes)
    p.allowed_missing = std::any_of(allowed.begin(), allowed.end(), [&](const auto& w) { return matches(p, w); });
  return ex;
}

void check_tol_overrides(const std::map<std::string, double>& overrides, const std::vector<std::string>& probes,
                         const std::string& from) {
  for (const auto& [name, value] : overrides) {
    if (std::find(probes.begin(), probes.end(), name) != probes.end()) continue;
    std::string have;
    std::set<std::string> said;
    for (const auto& p : probes)
      if (said.insert(p).second) have += (have.empty() ? "" : ", ") + p;
    throw UsageError("--tol " + name + "=" + fmt_num(value) + ": no probe " + name + " in " + from +
                     " (a --tol names a probe, for every layer: " + have + ")");
  }
}

}  // namespace mla
