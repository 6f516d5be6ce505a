// Replay of a captured MLA layer: the reference on the capture's own inputs and the checkpoint's weights.
#include "harness/bisect/replay.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "harness/bisect/isolate.h"
#include "core/model/errors.h"
#include "harness/report/compare_report.h"
#include "harness/report/progress.h"
#include "harness/run/calibration_cache.h"
#include "core/weights/checkpoint_config.h"
#include "core/weights/loader.h"
#include "probes/h5.h"
#include "reference/reference_engine.h"
#include "harness/compare/compare.h"

namespace mla {

namespace {

bool close_rel(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)); }

// The reference's dump of the replay, with the provenance `compare` and `explore` need to calibrate from it later.
DumpMeta reference_meta(const MlaConfig& cfg, const RunSpec& spec, const ReplayOptions& opt, int layer) {
  DumpMeta m;
  m.engine = "reference";
  m.engine_dtype = "fp32";
  m.model = cfg.to_json();
  m.run_options = run_spec_to_json(spec);
  m.run_options["weights"] = opt.weights;
  m.run_options["layer_range"] = std::to_string(layer) + ":" + std::to_string(layer + spec.layers);
  m.tp = spec.tp;
  m.mode = mode_name(spec.mode);
  m.probe_level = "full";
  m.command = "mla-bisect replay " + opt.capture + " --weights " + opt.weights + " --layer " + std::to_string(layer);
  return m;
}

// The real model's layer that a capture's layer 0 holds: the root attribute layer_index (-1 when absent). A per-rank
// capture (FILE.rank0.h5 ...) carries it in every part.
int capture_layer_index(const std::string& path) {
  const std::string file = std::filesystem::exists(path) ? path : rank_dump_path(path, 0);
  if (!h5::File::is_hdf5(file)) return -1;  // read_dump has read it already: a journal-only capture
  const auto f = h5::File::open_read(file);
  return static_cast<int>(f.attr_int_or("layer_index", -1));
}

// The checkpoint layer a capture's layer 0 holds, wherever its writer put it: the root attribute layer_index (the
// Python writer, a per-rank set's parts), run_options.layer_index (what survives a folded journal), or the first
// layer of run_options.layer_range (`mla-bisect run --layer-range A:B`); 0 when none of them is there.
int captured_layer(const Dump& cap, const std::string& path) {
  const auto& ro = cap.meta.run_options;
  int layer = capture_layer_index(path);
  if (layer < 0 && ro.contains("layer_index")) {
    if (!ro["layer_index"].is_number_integer())
      throw UsageError(path + ": run_options.layer_index is " + ro["layer_index"].dump() + ", not a layer number");
    layer = ro["layer_index"].get<int>();
    if (layer < 0) throw UsageError(path + ": layer_index " + std::to_string(layer) + " is negative");
  }
  if (layer < 0 && ro.contains("layer_range") && ro["layer_range"].is_string() &&
      !ro["layer_range"].get<std::string>().empty()) {
    try {
      layer = parse_layer_range(ro["layer_range"].get<std::string>()).begin;
    } catch (const UsageError& e) {
      throw UsageError(path + ": run_options.layer_range: " + e.what());
    }
  }
  return layer < 0 ? 0 : layer;
}

// How the captured system stores its latent cache: root attributes kv_cache_dtype and kv_cache_scale (else the same
// keys of run_options, which survive a folded journal). dtype "" or "auto": as the activations.
struct CacheStorage {
  std::string dtype;
  double scale = 1.0;
  bool fp8() const { return dtype == "fp8_e4m3"; }
};

CacheStorage capture_cache_storage(const Dump& cap, const std::string& path) {
  CacheStorage c;
  bool has_scale = false;
  const std::string file = std::filesystem::exists(path) ? path : rank_dump_path(path, 0);
  if (h5::File::is_hdf5(file)) {
    const auto f = h5::File::open_read(file);
    c.dtype = f.attr_string_or("kv_cache_dtype", "");
    if ((has_scale = f.has_attr("kv_cache_scale"))) c.scale = f.attr_double("kv_cache_scale");
  }
  const auto& ro = cap.meta.run_options;
  if (c.dtype.empty() && ro.is_object() && ro.contains("kv_cache_dtype") && ro["kv_cache_dtype"].is_string()) {
    c.dtype = ro["kv_cache_dtype"].get<std::string>();
    if ((has_scale = ro.contains("kv_cache_scale") && ro["kv_cache_scale"].is_number()))
      c.scale = ro["kv_cache_scale"].get<double>();
  }
  if (c.dtype == "auto") c.dtype.clear();
  if (!c.dtype.empty() && !c.fp8())
    throw UsageError(path + ": kv_cache_dtype '" + c.dtype + "' is not a cache storage replay models (auto, fp8_e4m3)");
  if (c.fp8() && !has_scale)
    throw UsageError(path + ": kv_cache_dtype fp8_e4m3 without kv_cache_scale (the per-tensor scale the codes are "
                     "multiplied by)");
  if (!std::isfinite(c.scale) || c.scale <= 0)
    throw UsageError(path + ": kv_cache_scale " + std::to_string(c.scale) + " is not a positive number");
  return c;
}

// A cache stored in fp8: the reference at the candidate's precision whose cache rows are rounded through e4m3 at the
// capture's scale, against the FP32 reference; each probe's tolerance becomes at least k times that noise (kv_cache
// and whatever reads the cache).
void calibrate_cache_storage(ToleranceModel& tol, const CacheStorage& cs, const MlaConfig& cfg, const RunSpec& spec,
                             const std::vector<LayerWeights>& weights, const Inputs& inputs, Precision precision,
                             double k, const Dump& ref) {
  char scale[32];
  std::snprintf(scale, sizeof scale, "%.9g", cs.scale);
  ReferenceEngine engine(std::map<std::string, std::string>{
      {"precision", precision_name(precision)}, {"kv_cache_dtype", cs.dtype}, {"kv_cache_scale", scale}});
  const Dump lo = run_in_process(engine, cfg, spec, weights, inputs, nullptr, -1, nullptr, {}, false);
  for (const auto& ph : ref.probes) {
    const DumpProbe* pl = lo.find(ph.layer, ph.name);
    if (!pl) continue;
    const Metrics m = compare_gathered(gather(*pl), gather(ph), ph, ph.layer, {});
    Tolerance t = tol.for_probe(ph.name, ph.layer);
    if (k * m.rel_l2 <= t.rel_l2 && k * m.max_token_rel <= t.token_rel) continue;
    t.rel_l2 = std::max(t.rel_l2, k * m.rel_l2);
    t.token_rel = std::max(t.token_rel, k * m.max_token_rel);
    std::ostringstream os;
    os.precision(2);
    os << "calibrated: " << k << " x the noise of an fp8 e4m3 cache (scale " << scale << ") at "
       << precision_name(precision) << " " << std::scientific << m.rel_l2;
    t.origin = os.str();
    tol.per_probe[std::to_string(ph.layer) + "/" + ph.name] = t;
  }
}

// What the capture's inputs and records say about themselves, checked before they are trusted: positions against
// each sequence's cache length, the values' dtype against the declared engine_dtype, non-finite inputs.
struct InputFindings {
  std::vector<std::string> warnings;
  std::string dtype;          // the dtype the tolerances are calibrated at
  std::string nonfinite;      // "" or a sentence naming the input that holds NaN/Inf
};

bool bf16_exact(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return (u & 0xFFFFu) == 0 || !std::isfinite(v);
}

bool fp16_exact(float v) {
  if (!std::isfinite(v) || v == 0.0f) return true;
  const float a = std::fabs(v);
  if (a > 65504.0f) return false;
  int e;
  std::frexp(a, &e);                       // a = m * 2^e, m in [0.5, 1)
  const int lsb = std::max(e - 11, -24);   // fp16: 11 significant bits, subnormals down to 2^-24
  const float q = std::ldexp(std::round(std::ldexp(a, -lsb)), lsb);
  return q == a;
}

InputFindings check_inputs(const Dump& cap, const RunSpec& spec, const std::string& declared) {
  InputFindings f;
  f.dtype = declared;
  const Inputs& in = cap.inputs;
  const Batch& b = in.batch;
  const bool input_norm = spec.graph_shape().input_norm;
  const std::string x_name = input_norm ? "h" : "x";

  // Positions: a step after cached context puts its first new token at the cache's length (HF's cache_position,
  // vLLM's and SGLang's positions); a token elsewhere is rotated at a position its cache does not say.
  size_t t0 = 0;
  for (size_t s = 0; s < b.new_lens.size(); ++s) {
    const int ctx = b.context_lens[s];
    bool consecutive = true;
    for (int i = 1; i < b.new_lens[s]; ++i)
      consecutive = consecutive && b.positions[t0 + i] == b.positions[t0] + i;
    if (!consecutive)
      f.warnings.push_back("positions of sequence " + std::to_string(s) + " are not consecutive (" +
                           std::to_string(b.positions[t0]) + ", " + std::to_string(b.positions[t0 + 1]) +
                           ", ...): its new tokens are rotated at positions that do not follow each other");
    else if (ctx > 0 && b.positions[t0] != ctx)
      f.warnings.push_back("positions of sequence " + std::to_string(s) + " start at " + std::to_string(b.positions[t0]) +
                           " but its cache holds " + std::to_string(ctx) + " tokens (position " + std::to_string(ctx) +
                           " expected, " + (b.positions[t0] > ctx ? "+" : "") + std::to_string(b.positions[t0] - ctx) +
                           "): the step's rope and the cache disagree, unless the system's positions are offset "
                           "from the start of its cache");
    t0 += b.new_lens[s];
  }

  // The values' dtype: what the records say they were held in, else what the values are.
  if (declared == "fp32") {
    std::map<std::string, int> held;
    bool any_data = false, all_bf16 = true, all_fp16 = true;
    for (const auto& p : cap.probes) {
      if (p.name == "topk" || p.name == x_name || p.name == "kv_cache") continue;  // indices, the input, the cache
      for (const auto& r : p.ranks) {
        if (!r.dtype.empty() && r.dtype != "fp32") ++held[r.dtype];
        if (r.data.data.empty()) continue;
        any_data = true;
        for (float v : r.data.data) {
          all_bf16 = all_bf16 && bf16_exact(v);
          all_fp16 = all_fp16 && fp16_exact(v);
          if (!all_bf16 && !all_fp16) break;
        }
      }
    }
    std::string held_as;
    for (const char* d : {"bf16", "fp16"})
      if (held.count(d) && (held_as.empty() || held[d] > held[held_as])) held_as = d;
    if (!held_as.empty()) {
      f.dtype = held_as;
      f.warnings.push_back("engine_dtype says fp32, but the probes' records say their tensors were held in " + held_as +
                           ": tolerances are calibrated at " + held_as);
    } else if (any_data && (all_bf16 || all_fp16)) {
      f.dtype = all_bf16 ? "bf16" : "fp16";
      f.warnings.push_back("engine_dtype says fp32, but every value of the computed probes is a " + f.dtype +
                           " value (fp32 tensors holding " + f.dtype + " results): tolerances are calibrated at " +
                           f.dtype);
    }
  }

  // Non-finite values that came with the inputs.
  const auto count_bad = [](const std::vector<float>& v, int64_t row, int64_t& first_row) {
    int64_t n = 0;
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i])) {
        if (n++ == 0) first_row = row > 0 ? static_cast<int64_t>(i) / row : 0;
      }
    return n;
  };
  int64_t first_row = -1;
  const int64_t hidden = in.x.shape.size() == 2 ? in.x.shape[1] : 1;
  if (const int64_t n = count_bad(in.x.data, hidden, first_row))
    f.nonfinite = "the captured input " + x_name + " holds " + std::to_string(n) + " NaN/Inf value" +
                  (n == 1 ? "" : "s") + " (first at token row " + std::to_string(first_row) +
                  "): they came into the layer with its input, from before it";
  for (size_t l = 0; l < in.kv_cache.size() && f.nonfinite.empty(); ++l) {
    int64_t row = 0;
    if (const int64_t n = count_bad(in.kv_cache[l].data, in.kv_cache[l].shape.back(), row))
      f.nonfinite = "the captured latent cache (inputs kv_cache) holds " + std::to_string(n) +
                    " NaN/Inf value(s): they came into the layer with the cached context";
  }
  if (!f.nonfinite.empty()) f.warnings.push_back(f.nonfinite);
  return f;
}

}  // namespace

std::vector<std::string> config_differences(const MlaConfig& a, const MlaConfig& b) {
  std::vector<std::string> out;
  auto num = [&](const char* field, double x, double y) {
    if (!close_rel(x, y)) {
      std::ostringstream os;
      os << field << ": capture " << x << ", checkpoint " << y;
      out.push_back(os.str());
    }
  };
  num("hidden_size", a.hidden, b.hidden);
  num("num_attention_heads", a.heads, b.heads);
  num("q_lora_rank", a.q_lora_rank, b.q_lora_rank);
  num("kv_lora_rank", a.kv_lora_rank, b.kv_lora_rank);
  num("qk_nope_head_dim", a.qk_nope, b.qk_nope);
  num("qk_rope_head_dim", a.qk_rope, b.qk_rope);
  num("v_head_dim", a.v_head, b.v_head);
  num("rope_theta", a.rope_theta, b.rope_theta);
  num("rms_norm_eps", a.rms_eps, b.rms_eps);
  if (a.rope_scaling != b.rope_scaling)
    out.push_back(std::string("rope_scaling: capture ") +
                  (a.rope_scaling == RopeScaling::RopeScaling_yarn ? "yarn" : "none") + ", checkpoint " +
                  (b.rope_scaling == RopeScaling::RopeScaling_yarn ? "yarn" : "none"));
  else if (a.rope_scaling == RopeScaling::RopeScaling_yarn) {
    num("rope_scaling.factor", a.yarn.factor, b.yarn.factor);
    num("rope_scaling.original_max_position_embeddings", a.yarn.original_max_position, b.yarn.original_max_position);
    num("rope_scaling.beta_fast", a.yarn.beta_fast, b.yarn.beta_fast);
    num("rope_scaling.beta_slow", a.yarn.beta_slow, b.yarn.beta_slow);
    num("rope_scaling.mscale", a.yarn.mscale, b.yarn.mscale);
    num("rope_scaling.mscale_all_dim", a.yarn.mscale_all_dim, b.yarn.mscale_all_dim);
  }
  if (a.has_dsa() || b.has_dsa()) {
    num("index_topk", a.index_topk, b.index_topk);
    num("index_n_heads", a.index_n_heads, b.index_n_heads);
    num("index_head_dim", a.index_head_dim, b.index_head_dim);
    if (a.has_dsa() && b.has_dsa() && a.index_rope_style != b.index_rope_style)
      out.push_back(std::string("indexer rope lane order (model_type): capture ") +
                    (a.index_rope_style == RopeStyle::RopeStyle_neox ? "half-split" : "interleaved") + ", checkpoint " +
                    (b.index_rope_style == RopeStyle::RopeStyle_neox ? "half-split" : "interleaved"));
    if (a.index_shared != b.index_shared) {
      const auto list = [](const std::vector<bool>& v) {
        std::string t;
        for (size_t l = 0; l < v.size(); ++l)
          if (v[l]) t += (t.empty() ? "" : ",") + std::to_string(l);
        return t.empty() ? std::string("none") : t;
      };
      out.push_back("indexer_types (shared layers): capture " + list(a.index_shared) + ", checkpoint " +
                    list(b.index_shared));
    }
  }
  if (a.rope_style != b.rope_style)
    out.push_back(std::string("rope lane order: capture ") +
                  (a.rope_style == RopeStyle::RopeStyle_neox ? "neox" : "interleaved") + ", checkpoint " +
                  (b.rope_style == RopeStyle::RopeStyle_neox ? "neox" : "interleaved"));
  return out;
}

BisectReport run_replay(const ReplayOptions& opt) {
  const ProgressLog progress(opt.progress);
  ProgressTicks ticks(progress);  // reading, loading weights, the reference's runs: when a line is due
  auto step = [&](const std::string& what) { progress.step(what); };
  BisectReport rep;
  rep.candidate_dump = opt.capture;

  step("reading the capture " + opt.capture);
  const Dump cap = read_dump(opt.capture);
  require_every_rank(cap, "replay");
  rep.candidate_engine = cap.meta.engine.empty() ? "capture" : cap.meta.engine;
  // A capture whose system stopped (or was killed) before its first probe: nothing to compare, and the reason is the
  // stop, not the file (exit 3, as for a capture that stopped later).
  if (cap.probes.empty() && !cap.complete())
    throw EngineError(opt.capture + ": the capture stopped before its first probe (it says: " + cap.status +
                      "): nothing to compare; the system it observed stopped or was killed before recording any probe");
  if (!cap.has_inputs)
    throw UsageError(opt.capture + ": no /inputs group: replay needs the layer's inputs (x or h, positions)");
  if (cap.probes.empty()) throw UsageError(opt.capture + ": holds no probes (nothing to compare)");
  if (cap.meta.run_options.is_null() || !cap.meta.run_options.is_object())
    throw UsageError(opt.capture + ": root attribute 'run_options' is missing (mode, tokens, tp, input_norm)");

  // Synthetic weights (synthetic[:SEED], what `mla-bisect run` uses by default) have no config of their own: the
  // capture's model is theirs.
  const bool synthetic = WeightSpec{.source = opt.weights}.synthetic();
  if (synthetic && cap.meta.model.is_null())
    throw UsageError("--weights " + opt.weights + ": synthetic weights take their model from the capture, and " +
                     opt.capture + " has no root attribute 'model'; give the checkpoint the captured system ran");
  const MlaConfig cfg = synthetic ? cap.config() : load_model_config(opt.weights);
  if (!cap.meta.model.is_null()) {
    MlaConfig cap_cfg;
    try {
      cap_cfg = cap.config();
    } catch (const UsageError& e) {
      throw UsageError(opt.capture + ": root attribute 'model' is not an MLA config: " + e.what());
    }
    const auto diff = config_differences(cap_cfg, cfg);
    if (!diff.empty()) {
      std::string s;
      for (const auto& d : diff) s += "\n  " + d;
      throw UsageError("the capture's config (" + opt.capture + ": /model) disagrees with the checkpoint's (" +
                       opt.weights + "):" + s);
    }
  }
  RunSpec spec = cap.spec();
  spec.tp = cap.meta.tp > 0 ? cap.meta.tp : spec.tp;
  // The capture's /inputs are the step's real layout. Sequences that differ in new tokens run as batch 1 of their T
  // tokens, each sequence's context taken from the inputs; DSA's idx_scores holds the longest context plus T keys.
  const Batch& laid = cap.inputs.batch;
  if (laid.num_seqs() > 0) {
    if (laid.num_seqs() != spec.batch) spec.context.clear();
    const int keys = laid.longest_context() + spec.tokens;
    if (spec.keys == 0 && spec.graph_shape().keys != keys) spec.keys = keys;
  }
  spec.validate(cfg);
  // The root attribute is the documented place; run_options.layer_index (the Python writer puts it there too) is what
  // survives when mla-bisect folds a killed capture's journal, which carries run_options but not extra root attributes.
  const int layer = opt.layer >= 0 ? opt.layer : captured_layer(cap, opt.capture);
  {
    std::vector<std::string> names;
    for (const auto& p : build_graph(cfg, spec.graph_shape()).probes) names.push_back(p.name);
    check_tol_overrides(opt.overrides, names, "the capture's stage graph");
  }

  // The capture's inputs must have the shape the graph starts from.
  const Inputs& inputs = cap.inputs;
  if (inputs.x.shape.size() != 2 || inputs.x.shape[0] != spec.graph_shape().tokens || inputs.x.shape[1] != cfg.hidden)
    throw UsageError(opt.capture + ": /inputs/x is " + shape_string(inputs.x.shape) + ", expected [" +
                     std::to_string(spec.graph_shape().tokens) + "," + std::to_string(cfg.hidden) +
                     "] (tokens of run_options, hidden_size of the checkpoint)");

  step("loading layer " + std::to_string(layer) + " of " + opt.weights);
  WeightSpec ws;
  ws.source = opt.weights;
  ws.layer_range = std::to_string(layer) + ":" + std::to_string(layer + spec.layers);
  const auto weights = load_weights(ws, cfg, spec, 0).layers;

  step("reference (fp32) on the captured inputs");
  ReferenceEngine ref_engine(std::map<std::string, std::string>{});
  // Weight records (a checksum and sketch of every weight) only where the capture holds weights to compare them with.
  const bool compare_weights = !cap.weights.empty();
  Dump ref = run_in_process(ref_engine, cfg, spec, weights, inputs, nullptr, -1, nullptr, {}, compare_weights);
  ref.path = opt.reference_out.empty() ? "reference (in memory)" : opt.reference_out;
  ref.meta = reference_meta(cfg, spec, opt, layer);
  ref.has_inputs = true;
  ref.inputs = inputs;
  ref.status = "complete";
  if (!opt.reference_out.empty()) {
    write_dump_h5(ref, opt.reference_out);
    rep.reference_dump = opt.reference_out;
  }

  // The graph's probes the capture does not hold are not expected: a capture may hold any subset (compared through
  // CompareOptions::only, without copying the reference's tensors).
  CompareOptions captured;
  std::vector<std::string> not_captured;
  for (const auto& p : ref.probes)
    (cap.find(p.layer, p.name) ? captured.only : not_captured).push_back("layer" + std::to_string(p.layer) + "/" + p.name);
  // The capture's probes the reference's graph has no place for (a dense graph for indexer probes, another form's
  // probes): listed with the reason, never dropped without a word.
  std::vector<std::string> not_comparable;
  for (const auto& p : cap.probes)
    if (!ref.find(p.layer, p.name)) not_comparable.push_back("layer" + std::to_string(p.layer) + "/" + p.name);
  if (captured.only.empty()) {
    std::string have;
    for (const auto& p : cap.probes) have += (have.empty() ? "" : ", ") + ("layer" + std::to_string(p.layer) + "/" + p.name);
    std::string want;
    for (const auto& p : ref.probes) want += (want.empty() ? "" : ", ") + p.name;
    throw UsageError(opt.capture + ": none of its probes (" + have + ") is a probe of the graph (layer0/: " + want +
                     "): nothing to compare");
  }

  const std::string declared = cap.meta.engine_dtype.empty() ? "fp32" : cap.meta.engine_dtype;
  try {
    parse_precision(declared);
  } catch (const UsageError& e) {
    throw UsageError(opt.capture + ": root attribute engine_dtype: " + e.what());
  }
  const InputFindings found = check_inputs(cap, spec, declared);
  for (const auto& w : found.warnings) std::cerr << "warning: " << opt.capture << ": " << w << "\n";
  const std::string dtype = found.dtype;
  const Precision precision = parse_precision(dtype);
  step("calibrating tolerances (reference fp32 vs " + dtype + ")");
  ToleranceModel tol = calibrate_cached(cfg, spec, weights, inputs, precision, opt.k, [&] { return &ref; });
  const CacheStorage storage = capture_cache_storage(cap, opt.capture);
  if (storage.fp8()) {
    step("calibrating the fp8 e4m3 latent cache (scale " + std::to_string(storage.scale) + ")");
    calibrate_cache_storage(tol, storage, cfg, spec, weights, inputs, precision, opt.k, ref);
  }
  tol.overrides = opt.overrides;

  // DSA: where the capture's top-k swapped near-tied keys with the reference's, the reference runs again on the
  // capture's own selection there (harness/run/calibrate.h): those tokens are compared in full after topk.
  std::shared_ptr<SelectionFed> fed;
  if (cfg.has_dsa() && has_near_tie_swaps(cap, ref, tol)) {
    step("reference (fp32) on the capture's selection (its top-k swapped near-tied keys)");
    fed = std::make_shared<SelectionFed>();
    ReferenceEngine fed_engine(std::map<std::string, std::string>{});
    Dump again = run_in_process(fed_engine, cfg, spec, weights, inputs, nullptr, -1, nullptr, {}, compare_weights, false,
                                selection_feed(cap, inputs, tol, fed));
    again.path = ref.path;
    again.meta = ref.meta;
    again.has_inputs = true;
    again.inputs = inputs;
    again.status = "complete";
    ref = std::move(again);
    if (!opt.reference_out.empty()) write_dump_h5(ref, opt.reference_out);
  }
  rep.compare = compare_dumps(cap, ref, tol, captured);
  if (fed)
    for (auto& n : fed->notes("capture")) rep.compare.notes.push_back(n);
  if (!not_captured.empty()) {
    std::string s;
    for (const auto& n : not_captured) s += (s.empty() ? "" : ", ") + n;
    rep.compare.notes.push_back("not captured (not compared): " + s);
  }
  for (const auto& w : found.warnings) rep.compare.notes.push_back("input check: " + w);
  if (!not_comparable.empty()) {
    std::string s;
    for (const auto& n : not_comparable) s += (s.empty() ? "" : ", ") + n;
    rep.compare.notes.push_back("captured but not comparable: " + s + " (not probes of the reference's stage graph for " +
                                "this config and run: " + mode_name(spec.mode) + ", " +
                                (spec.graph_shape().form == AttentionForm::AttentionForm_absorbed ? "absorbed" : "mha") + " attention" +
                                (cfg.has_dsa() ? ", DSA" : ", dense (no DSA indexer)") + ")");
    std::cerr << "warning: " << opt.capture << ": " << rep.compare.notes.back() << "\n";
  }
  // The capture's records sit at layers 0.. of the dump; the report speaks of the checkpoint's layers.
  const auto to_checkpoint_layers = [layer](BisectReport& r) {
    for (auto& p : r.compare.results) p.layer += layer;
    if (r.first) r.first->layer += layer;
    if (r.weight_cause) r.weight_cause->layer += layer;
  };
  if (!cap.complete()) {
    rep.exit_code = ExitCode_engine;
    rep.crash = "the capture stopped early; it says: " + cap.status;
    rep.last_stage = cap.last_stage;
    rep.headline = "capture STOPPED early";
    if (rep.compare.first_divergence >= 0) rep.first = rep.compare.results[rep.compare.first_divergence];
    rep.seconds = progress.seconds();
    to_checkpoint_layers(rep);
    return rep;
  }
  if (rep.compare.first_divergence < 0) {
    rep.exit_code = ExitCode_ok;
    rep.headline = "no divergence: the " + std::to_string(captured.only.size()) +
                   " captured probes are within their calibrated tolerances";
    rep.seconds = progress.seconds();
    to_checkpoint_layers(rep);
    return rep;
  }
  rep.exit_code = ExitCode_divergence;
  rep.first = rep.compare.results[rep.compare.first_divergence];
  const ProbeResult& first = *rep.first;
  rep.full = first.m;

  // Isolation on the candidate's own inputs: the reference's stage fed the capture's tensors.
  step("isolation: the reference's " + first.stage + " on the capture's own inputs");
  const IsolationResult iso = isolate_on_captured_inputs(cap, cfg, spec, weights, inputs, first, rep.compare);
  rep.isolation = iso.sentence;
  if (iso.judged) rep.isolated = iso.isolated;
  // The stage introduced the error: re-run it under each known bug class on the capture's own inputs to it.
  if (iso.judged && iso.introduced && first.layer < static_cast<int>(weights.size())) {
    step("hypotheses: the bug classes of stage " + first.stage + " on the capture's inputs");
    hyp::StageCase hc;
    std::string why;
    if (hyp::make_case(hc, cap, cap, cfg, spec, weights[first.layer], inputs, first.layer, parse_stage(first.stage),
                       hyp::stage_tolerances(rep.compare, first.layer, first.stage), why)) {
      hc.focus = first.name;
      rep.hypotheses = hyp::search(std::move(hc));
    } else {
      rep.hypotheses.reason = "not searched: " + why;
    }
  } else if (iso.judged) {
    rep.hypotheses.reason = "not searched: stage " + first.stage + " agrees with the candidate on its own inputs (carried in)";
  }
  rep.drill = drill_down(first, first.m, first.tol);
  rep.diagnosis = diagnose(first, first.m, first.tol, inputs.batch, rep.compare);
  hyp::explain(rep.diagnosis, rep.hypotheses);
  rep.headline = "first divergence: layer " + std::to_string(layer + first.layer) + " " + first.name + " (stage " + first.stage +
                 ")";
  if (!found.nonfinite.empty() && (first.m.nan_a > 0 || first.m.inf_a > 0 || first.m.nan_b > 0 || first.m.inf_b > 0)) {
    // Non-finite values the layer was given are no stage's doing: the diagnosis names the input.
    rep.diagnosis.evidence.insert(rep.diagnosis.evidence.begin(), "was: " + rep.diagnosis.pattern);
    rep.diagnosis.pattern = found.nonfinite;
    rep.diagnosis.confidence = "measured";
    rep.headline += ": the captured input holds NaN/Inf";
  }
  rep.seconds = progress.seconds();
  to_checkpoint_layers(rep);
  return rep;
}

}  // namespace mla
