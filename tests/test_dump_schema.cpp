// The dump schema (docs/dump-format.md) as the reader enforces it: a valid dump from the C++ writer, broken one
// rule at a time with the HDF5 C API, is refused by read_dump with a UsageError naming the file and the object
// inside it, and by `mla-bisect inspect` with exit code 2. Also what the reader accepts beyond the writer's own
// output: records whose statistics it computes from their data (fp8 checksums included), int64 checksums, unknown
// attributes, dumps without a model or run options, the goldens, and the doc's h5py example.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/engine/engine.h"
#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/errors.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "probes/dump.h"
#include "core/probe/probe.h"
#include "core/probe/probe_hash.h"
#include "tests/cli_util.h"

namespace {

using namespace mla;
namespace fs = std::filesystem;
using nlohmann::json;

// Edits an HDF5 file in place with the C API, as a buggy producer would have written it. Failures throw.
class Edit {
 public:
  explicit Edit(const std::string& path) : f_(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    if (f_ < 0) throw std::runtime_error("cannot open " + path + " for writing");
  }
  ~Edit() { H5Fclose(f_); }
  Edit(const Edit&) = delete;
  Edit& operator=(const Edit&) = delete;

  void set(const std::string& obj, const std::string& name, const std::string& v) {
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    const char* p = v.c_str();
    put(obj, name, t, scalar(), t, &p);
    H5Tclose(t);
  }
  void set(const std::string& obj, const std::string& name, int64_t v) {
    put(obj, name, H5T_STD_I64LE, scalar(), H5T_NATIVE_INT64, &v);
  }
  void set(const std::string& obj, const std::string& name, double v) {
    put(obj, name, H5T_IEEE_F64LE, scalar(), H5T_NATIVE_DOUBLE, &v);
  }
  void set(const std::string& obj, const std::string& name, const std::vector<int64_t>& v) {
    const hsize_t n = v.size();
    put(obj, name, H5T_STD_I64LE, H5Screate_simple(1, &n, nullptr), H5T_NATIVE_INT64, v.data());
  }
  void unset(const std::string& obj, const std::string& name) {
    ok(H5Adelete_by_name(f_, obj.c_str(), name.c_str(), H5P_DEFAULT), "delete attribute " + name + " of " + obj);
  }
  void remove(const std::string& path) { ok(H5Ldelete(f_, path.c_str(), H5P_DEFAULT), "delete " + path); }
  void move(const std::string& from, const std::string& to) {
    ok(H5Lmove(f_, from.c_str(), f_, to.c_str(), H5P_DEFAULT, H5P_DEFAULT), "move " + from + " to " + to);
  }
  void group(const std::string& path) {
    const hid_t g = H5Gcreate2(f_, path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ok(g, "create group " + path);
    H5Gclose(g);
  }
  // (Re)writes a dataset of `shape` filled from `values`, cycled.
  void floats(const std::string& path, const std::vector<hsize_t>& shape, const std::vector<float>& values = {0.f}) {
    data(path, shape, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, cycled(values, shape).data());
  }
  void ints(const std::string& path, const std::vector<hsize_t>& shape, const std::vector<int32_t>& values) {
    data(path, shape, H5T_STD_I32LE, H5T_NATIVE_INT32, cycled(values, shape).data());
  }

 private:
  static hid_t scalar() { return H5Screate(H5S_SCALAR); }
  static void ok(herr_t r, const std::string& what) {
    if (r < 0) throw std::runtime_error("HDF5 edit failed: " + what);
  }
  template <class T> static std::vector<T> cycled(const std::vector<T>& v, const std::vector<hsize_t>& shape) {
    size_t n = 1;
    for (hsize_t d : shape) n *= d;
    std::vector<T> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = v[i % v.size()];
    return out;
  }
  // Takes `space`.
  void put(const std::string& obj, const std::string& name, hid_t ftype, hid_t space, hid_t mtype, const void* v) {
    const hid_t o = H5Oopen(f_, obj.c_str(), H5P_DEFAULT);
    ok(o, "open " + obj);
    if (H5Aexists(o, name.c_str()) > 0) H5Adelete(o, name.c_str());
    const hid_t a = H5Acreate2(o, name.c_str(), ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    ok(a, "create attribute " + name + " of " + obj);
    if (H5Sget_simple_extent_npoints(space) > 0) ok(H5Awrite(a, mtype, v), "write attribute " + name);
    H5Aclose(a);
    H5Sclose(space);
    H5Oclose(o);
  }
  void data(const std::string& path, const std::vector<hsize_t>& shape, hid_t ftype, hid_t mtype, const void* v) {
    if (H5Lexists(f_, path.c_str(), H5P_DEFAULT) > 0) remove(path);
    const hid_t s = H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr);
    const hid_t d = H5Dcreate2(f_, path.c_str(), ftype, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ok(d, "create dataset " + path);
    ok(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), "write dataset " + path);
    H5Dclose(d);
    H5Sclose(s);
  }
  hid_t f_;
};

// A valid dump written by DumpWriter from a reference run of tiny.
struct Base {
  std::string path;
  RunSpec spec;
  MlaConfig cfg;
  int num_blocks = 0;
};

Base write_base(const std::string& path, const RunSpec& spec, const ProbePlan& plan) {
  Base b;
  b.path = path;
  b.spec = spec;
  b.cfg = *find_preset("tiny");
  Runner runner(b.cfg, spec);
  const auto weights = synthetic_weights(b.cfg, spec.layers, spec.graph_shape().input_norm, 3);
  const Inputs inputs = synthetic_inputs(b.cfg, spec, weights);
  b.num_blocks = inputs.batch.num_blocks;
  auto engine = make_engine(EngineSpec::parse("reference"));
  DumpMeta m;
  m.engine = "reference";
  m.engine_options = "precision=fp32";
  m.engine_dtype = "fp32";
  m.model = b.cfg.to_json();
  m.run_options = run_spec_to_json(spec);
  m.tp = spec.tp;
  m.mode = mode_name(spec.mode);
  m.probe_level = probe_level_name(plan.level);
  m.command = "test_dump_schema";
  DumpWriter writer(path, m, &inputs);
  runner.run(*engine, weights, inputs, plan, writer);
  return b;
}

// Written once for every test here: prefill, mha, tp 2, 4 tokens, sketch level with three probes in full (a
// replicated one, a heads one and kv_cache); decode, absorbed, tp 1, two sequences with cached context.
class DumpSchema : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<test::ScratchDir>("dump_schema");
    RunSpec p;
    p.mode = Mode::Mode_prefill;
    p.form = AttentionForm::AttentionForm_mha;
    p.tp = 2;
    p.tokens = 4;
    ProbePlan pp;
    pp.level = ProbeLevel::ProbeLevel_sketch;
    pp.full = {"q_c", "q_nope", "kv_cache"};
    prefill_ = std::make_unique<Base>(write_base(dir_->path("prefill.h5"), p, pp));
    RunSpec d;
    d.mode = Mode::Mode_decode;
    d.form = AttentionForm::AttentionForm_absorbed;
    d.tokens = 1;
    d.batch = 2;
    d.context = {70, 10};
    ProbePlan dp;
    dp.level = ProbeLevel::ProbeLevel_stats;
    decode_ = std::make_unique<Base>(write_base(dir_->path("decode.h5"), d, dp));
  }
  static void TearDownTestSuite() {
    prefill_.reset();
    decode_.reset();
    dir_.reset();
  }
  static const Base& prefill() { return *prefill_; }
  static const Base& decode() { return *decode_; }
  static std::string scratch(const std::string& file) { return dir_->path(file); }
  // A fresh copy of `base` to break.
  static std::string copy_of(const Base& base, const std::string& name) {
    const std::string p = dir_->path(name + ".h5");
    fs::copy_file(base.path, p, fs::copy_options::overwrite_existing);
    return p;
  }

 private:
  static std::unique_ptr<test::ScratchDir> dir_;
  static std::unique_ptr<Base> prefill_, decode_;
};
std::unique_ptr<test::ScratchDir> DumpSchema::dir_;
std::unique_ptr<Base> DumpSchema::prefill_, DumpSchema::decode_;

// read_dump's UsageError message, "" when it reads.
std::string refusal(const std::string& path, const DumpReadOptions& ro = {}) {
  try {
    read_dump(path, ro);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------------------
// One rule broken at a time
// ---------------------------------------------------------------------------------------------------

struct Rule {
  const char* name;
  bool decode;                         // break the decode base (else the prefill one)
  std::function<void(Edit&, const Base&)> edit;
  std::string object;                  // the object the message names: "/layer0/q_c/rank0"
  std::string says;                    // and what it says
};

void PrintTo(const Rule& r, std::ostream* os) { *os << r.name; }

json run_options_with(const Base& b, const char* key, const json& value) {
  json j = run_spec_to_json(b.spec);
  j[key] = value;
  return j;
}

std::vector<Rule> rules() {
  using E = Edit;
  using B = Base;
  return {
      // The root.
      {"engine_dtype", false, [](E& e, const B&) { e.set("/", "engine_dtype", std::string("bfloat16")); }, "/",
       "engine_dtype 'bfloat16' is not one of fp32|bf16|fp16"},
      {"mode", false, [](E& e, const B&) { e.set("/", "mode", std::string("training")); }, "/", "mode 'training'"},
      {"status", false, [](E& e, const B&) { e.set("/", "status", std::string("done")); }, "/", "status 'done'"},
      {"probe_level", false, [](E& e, const B&) { e.set("/", "probe_level", std::string("most")); }, "/",
       "probe_level 'most'"},
      {"model_not_object", false, [](E& e, const B&) { e.set("/", "model", std::string("[1,2]")); }, "/",
       "attribute 'model' is not a JSON object"},
      {"model_not_json", false, [](E& e, const B&) { e.set("/", "model", std::string("{\"hidden_size\":")); }, "/",
       "attribute 'model' is not valid JSON"},
      {"model_field_missing", false,
       [](E& e, const B& b) {
         json m = b.cfg.to_json();
         m.erase("hidden_size");
         e.set("/", "model", m.dump());
       },
       "/", "missing field 'hidden_size'"},
      {"run_options_tp", false,
       [](E& e, const B& b) { e.set("/", "run_options", run_options_with(b, "tp", 4).dump()); }, "/",
       "attribute 'run_options': tp 4, the root attribute tp 2"},
      {"run_options_mode", false,
       [](E& e, const B& b) { e.set("/", "run_options", run_options_with(b, "mode", "decode").dump()); }, "/",
       "mode decode, the root attribute mode prefill"},
      {"run_options_tokens", false,
       [](E& e, const B& b) { e.set("/", "run_options", run_options_with(b, "tokens", 0).dump()); }, "/",
       "must be positive"},
      {"run_options_not_object", false, [](E& e, const B&) { e.set("/", "run_options", std::string("7")); }, "/",
       "attribute 'run_options' is not a JSON object"},
      {"tp_float", false, [](E& e, const B&) { e.set("/", "tp", 2.0); }, "/",
       "attribute 'tp' holds floating-point values where integers belong"},
      {"tp_out_of_range", false, [](E& e, const B&) { e.set("/", "tp", int64_t{0}); }, "", "tp 0 is out of range"},
      {"last_stage", false, [](E& e, const B&) { e.set("/", "last_stage", std::string("\"rope\"")); }, "/",
       "last_stage is not a JSON array"},
      {"layer_index", false, [](E& e, const B&) { e.set("/", "layer_index", int64_t{-1}); }, "/",
       "layer_index -1 is negative"},
      {"process_rank_alone", false, [](E& e, const B&) { e.set("/", "process_rank", int64_t{0}); }, "/",
       "'process_rank' without 'processes'"},
      {"probe_at_root", false, [](E& e, const B&) { e.move("/layer0/q_c", "/q_c"); }, "/q_c", "not part of a dump"},
      {"dataset_at_root", false, [](E& e, const B&) { e.floats("/notes", {2}); }, "/notes", "not part of a dump"},
      {"layer_beyond_run", false, [](E& e, const B&) { e.move("/layer0", "/layer1"); }, "/layer1",
       "the run options have 1 layer"},
      {"layer_leading_zero", false, [](E& e, const B&) { e.move("/layer0", "/layer00"); }, "/layer00",
       "not part of a dump"},

      // Probe groups.
      {"dataset_in_layer", false, [](E& e, const B&) { e.floats("/layer0/extra", {4}); }, "/layer0/extra",
       "is not a group"},
      {"unknown_probe", false, [](E& e, const B&) { e.move("/layer0/q_c", "/layer0/q_cc"); }, "/layer0/q_cc",
       "'q_cc' is not a probe name"},
      {"probe_of_the_other_form", false, [](E& e, const B&) { e.move("/layer0/k_nope", "/layer0/q_latent"); },
       "/layer0/q_latent", "'q_latent' is not a probe of the graph of the dump's model and run options (mha form"},
      {"probe_of_the_other_form_decode", true, [](E& e, const B&) { e.move("/layer0/q_latent", "/layer0/k_nope"); },
       "/layer0/k_nope", "'k_nope' is not a probe of the graph of the dump's model and run options (absorbed form"},
      {"contract_unknown", false, [](E& e, const B&) { e.set("/layer0/q_c", "contract", std::string("sharded")); },
       "/layer0/q_c", "contract 'sharded' (expected replicated, heads or partial)"},
      {"contract_not_the_graphs", false,
       [](E& e, const B&) { e.set("/layer0/q_c", "contract", std::string("partial")); }, "/layer0/q_c",
       "attribute 'contract' is 'partial' but the graph of the dump's model and run options"},
      {"heads_axis_out_of_range", false, [](E& e, const B&) { e.set("/layer0/q_nope", "heads_axis", int64_t{3}); },
       "/layer0/q_nope", "heads_axis 3 outside shape [4,8,16]"},
      {"heads_axis_not_the_graphs", false, [](E& e, const B&) { e.set("/layer0/q_nope", "heads_axis", int64_t{2}); },
       "/layer0/q_nope", "attribute 'heads_axis' is 2 but the graph"},
      {"heads_not_dividing", false,
       [](E& e, const B&) { e.set("/layer0/q_nope", "shape", std::vector<int64_t>{4, 7, 16}); }, "/layer0/q_nope",
       "7 heads do not divide over tp 2"},
      {"shape_not_the_graphs", false,
       [](E& e, const B&) { e.set("/layer0/kv_c", "shape", std::vector<int64_t>{4, 40}); }, "/layer0/kv_c",
       "attribute 'shape' is [4,40] but the graph of the dump's model and run options (mha form, 4 tokens) gives "
       "[4,32]"},
      {"shape_empty", false, [](E& e, const B&) { e.set("/layer0/kv_c", "shape", std::vector<int64_t>{}); },
       "/layer0/kv_c", "empty shape"},
      {"shape_other_tokens", false,
       [](E& e, const B&) { e.set("/layer0/kv_c", "shape", std::vector<int64_t>{5, 32}); }, "/layer0/kv_c",
       "holds 5 tokens, /inputs/x 4"},
      {"order_not_the_graphs", false, [](E& e, const B&) { e.set("/layer0/q_c", "order", int64_t{9}); },
       "/layer0/q_c", "attribute 'order' is 9 but the graph of the dump's model and run options (mha form, 4 tokens) "
                      "gives 2"},
      {"order_missing", false, [](E& e, const B&) { e.unset("/layer0/q_c", "order"); }, "/layer0/q_c",
       "missing attribute 'order'"},
      {"stage_not_the_graphs", false, [](E& e, const B&) { e.set("/layer0/q_c", "stage", std::string("q_b_proj")); },
       "/layer0/q_c", "attribute 'stage' is 'q_b_proj' but the graph"},
      {"stage_unknown", false, [](E& e, const B&) { e.set("/layer0/q_c", "stage", std::string("qq")); },
       "/layer0/q_c", "stage 'qq' is not a stage name"},
      {"rope_from_out_of_range", false, [](E& e, const B&) { e.set("/layer0/k_pe", "rope_from", int64_t{99}); },
       "/layer0/k_pe", "rope_from 99 outside the last axis of shape [4,8]"},
      {"rope_from_not_the_graphs", false, [](E& e, const B&) { e.set("/layer0/kv_cache", "rope_from", int64_t{8}); },
       "/layer0/kv_cache", "attribute 'rope_from' is 8 but the graph"},
      {"probe_engine_dtype", false,
       [](E& e, const B&) { e.set("/layer0/q_c", "engine_dtype", std::string("float32")); }, "/layer0/q_c",
       "engine_dtype 'float32' is not one of fp32|bf16|fp16|fp8_e4m3|fp8_e5m2"},

      // Rank groups.
      {"not_a_rank_group", false, [](E& e, const B&) { e.group("/layer0/q_c/meta"); }, "/layer0/q_c/meta",
       "not a rank group"},
      {"rank_leading_zero", false, [](E& e, const B&) { e.move("/layer0/q_c/rank1", "/layer0/q_c/rank01"); },
       "/layer0/q_c/rank01", "not a rank group"},
      {"rank_missing_in_complete_dump", false, [](E& e, const B&) { e.remove("/layer0/q_a/rank1"); },
       "/layer0/q_a", "rank1 is missing: the dump's status is complete at tp 2"},
      {"rank_beyond_tp", false, [](E& e, const B&) { e.group("/layer0/q_a/rank2"); }, "/layer0/q_a",
       "has rank2 but the dump's tp is 2"},
      {"no_rank_groups", false,
       [](E& e, const B&) {
         e.remove("/layer0/q_a/rank0");
         e.remove("/layer0/q_a/rank1");
       },
       "/layer0/q_a", "no rank groups"},

      // Rank records.
      {"l2_missing", false, [](E& e, const B&) { e.unset("/layer0/q_a/rank0", "l2"); }, "/layer0/q_a/rank0",
       "missing attribute 'l2'"},
      {"l2_string", false, [](E& e, const B&) { e.set("/layer0/q_a/rank0", "l2", std::string("large")); },
       "/layer0/q_a/rank0", "attribute is not a number: 'l2'"},
      {"nan_negative", false, [](E& e, const B&) { e.set("/layer0/q_a/rank1", "nan", int64_t{-1}); },
       "/layer0/q_a/rank1", "nan -1 and inf 0 do not fit"},
      {"inf_float", false, [](E& e, const B&) { e.set("/layer0/q_a/rank1", "inf", 1.5); }, "/layer0/q_a/rank1",
       "attribute 'inf' holds floating-point values where integers belong"},
      {"checksum_float", false, [](E& e, const B&) { e.set("/layer0/q_a/rank1", "checksum", 3.0); },
       "/layer0/q_a/rank1", "attribute 'checksum' holds floating-point values where integers belong"},
      {"token_l2_missing", false, [](E& e, const B&) { e.remove("/layer0/q_a/rank0/token_l2"); },
       "/layer0/q_a/rank0", "missing dataset 'token_l2' (required when the record has no 'data')"},
      {"token_l2_length", false, [](E& e, const B&) { e.floats("/layer0/q_a/rank0/token_l2", {3}); },
       "/layer0/q_a/rank0/token_l2", "shape [3], expected [4]"},
      {"head_l2_shape", false, [](E& e, const B&) { e.floats("/layer0/q_pe/rank0/head_l2", {4, 8}); },
       "/layer0/q_pe/rank0/head_l2", "shape [4,8], expected [4,4]"},
      {"head_l2_without_heads", false, [](E& e, const B&) { e.floats("/layer0/q_a/rank0/head_l2", {4, 1}); },
       "/layer0/q_a/rank0", "head_l2 on a probe without a heads axis"},
      {"sketch_shape", false, [](E& e, const B&) { e.floats("/layer0/q_a/rank0/sketch", {4, 16}); },
       "/layer0/q_a/rank0/sketch", "shape [4,16], expected [4,32]"},
      {"unknown_dataset", false, [](E& e, const B&) { e.floats("/layer0/q_a/rank0/token_L2", {4}); },
       "/layer0/q_a/rank0/token_L2", "not part of a rank's record"},
      {"data_shape", false, [](E& e, const B&) { e.floats("/layer0/q_nope/rank1/data", {4, 8, 16}); },
       "/layer0/q_nope/rank1/data", "shape [4,8,16], expected [4,4,16]"},
      {"rank_shape", false,
       [](E& e, const B&) { e.set("/layer0/q_nope/rank1", "shape", std::vector<int64_t>{4, 8, 16}); },
       "/layer0/q_nope/rank1", "shape [4,8,16], expected [4,4,16]"},
      {"rank_dtype", false, [](E& e, const B&) { e.set("/layer0/q_a/rank0", "dtype", std::string("bfloat16")); },
       "/layer0/q_a/rank0", "dtype 'bfloat16' is not one of fp32|bf16|fp16|fp8_e4m3|fp8_e5m2"},
      {"level_full_without_data", false,
       [](E& e, const B&) { e.set("/layer0/q_a/rank0", "level", std::string("full")); },
       "/layer0/q_a/rank0", "level 'full' without a 'data' dataset"},
      {"data_below_level_full", false,
       [](E& e, const B&) { e.set("/layer0/q_c/rank0", "level", std::string("sketch")); }, "/layer0/q_c/rank0",
       "a 'data' dataset at level 'sketch'"},
      {"level_unknown", false, [](E& e, const B&) { e.set("/layer0/q_a/rank0", "level", std::string("medium")); },
       "/layer0/q_a/rank0", "level 'medium'"},
      {"fp8_data_not_fp8", false,
       [](E& e, const B&) {
         e.set("/layer0/q_c/rank0", "dtype", std::string("fp8_e4m3"));
         e.unset("/layer0/q_c/rank0", "checksum");
       },
       "/layer0/q_c/rank0/data", "is not an fp8_e4m3 value"},

      // /inputs.
      {"inputs_unknown_dataset", false, [](E& e, const B&) { e.floats("/inputs/h", {4, 64}); }, "/inputs/h",
       "not part of /inputs"},
      {"inputs_x_hidden", false, [](E& e, const B&) { e.floats("/inputs/x", {4, 60}); }, "/inputs/x",
       "shape [4,60], but the dump's model has hidden_size 64"},
      {"inputs_x_tokens", false, [](E& e, const B&) { e.floats("/inputs/x", {5, 64}); }, "/inputs/x",
       "holds 5 tokens, the run options 4"},
      {"inputs_positions_float", false, [](E& e, const B&) { e.floats("/inputs/positions", {4}); },
       "/inputs/positions", "dataset holds floating-point values where integers belong"},
      {"inputs_seq_lens_sum", false, [](E& e, const B&) { e.ints("/inputs/seq_lens", {1}, {3}); }, "/inputs",
       "seq_lens add up to 3 tokens, x has 4"},
      {"inputs_page_out_of_range", false,
       [](E& e, const B& b) { e.ints("/inputs/block_table", {1, 2}, {0, b.num_blocks}); }, "/inputs/block_table",
       "outside [0,"},
      {"inputs_num_blocks_missing", false, [](E& e, const B&) { e.unset("/inputs", "num_blocks"); }, "/inputs",
       "missing attribute 'num_blocks'"},
      {"inputs_kv_cache_row", false,
       [](E& e, const B& b) { e.floats("/inputs/kv_cache", {1, hsize_t(b.num_blocks), 64, 41}); },
       "/inputs/kv_cache", "caches rows of kv_lora_rank + qk_rope_head_dim = 40"},
      {"inputs_kv_cache_layers", false,
       [](E& e, const B& b) { e.floats("/inputs/kv_cache", {2, hsize_t(b.num_blocks), 64, 40}); },
       "/inputs/kv_cache", "holds 2 layers, the run options 1"},
      {"inputs_kv_cache_missing_with_context", true, [](E& e, const B&) { e.remove("/inputs/kv_cache"); },
       "/inputs", "missing dataset 'kv_cache': context_lens has cached tokens"},

      // Without a model and run options, what every model shares still holds.
      {"no_model_contract", false,
       [](E& e, const B&) {
         e.unset("/", "model");
         e.unset("/", "run_options");
         e.set("/layer0/kv_c", "contract", std::string("partial"));
       },
       "/layer0/kv_c", "attribute 'contract' is 'partial' but the probe table gives replicated for kv_c"},
      {"no_model_axes", false,
       [](E& e, const B&) {
         e.unset("/", "model");
         e.set("/layer0/kv_c", "shape", std::vector<int64_t>{4, 32, 1});
       },
       "/layer0/kv_c", "attribute 'shape' is [4,32,1] but the probe table gives 2 axes"},
  };
}

class DumpSchemaRule : public DumpSchema, public ::testing::WithParamInterface<Rule> {};

TEST_P(DumpSchemaRule, ReaderAndInspectRefuseItNamingTheObject) {
  const Rule& rule = GetParam();
  const Base& base = rule.decode ? decode() : prefill();
  ASSERT_EQ(refusal(base.path), "") << "the unbroken dump must read";
  const std::string path = copy_of(base, rule.name);
  {
    Edit e(path);
    rule.edit(e, base);
  }
  const std::string where = path + ":" + rule.object;  // "d.h5:/layer0/q_c/rank0", or the file alone
  const std::string msg = refusal(path);
  ASSERT_NE(msg, "") << rule.name << ": read_dump accepted the broken dump";
  EXPECT_EQ(msg.rfind(rule.object.empty() ? path : where, 0), 0u) << "the message must start with " << where;
  EXPECT_CONTAINS(msg, rule.says);

  // inspect (stats, maps and sketches only: no data read) refuses it as well, with exit code 2.
  const std::string args = "inspect '" + path + "'";
  const test::CliResult r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << test::describe(args, r);
  EXPECT_CONTAINS(r.err, rule.object.empty() ? path : where);
  EXPECT_CONTAINS(r.err, rule.says);
}

INSTANTIATE_TEST_SUITE_P(Rules, DumpSchemaRule, ::testing::ValuesIn(rules()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------------
// What the reader accepts
// ---------------------------------------------------------------------------------------------------

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_F(DumpSchema, StatisticsLeftOutOfAFullRecordAreComputedFromItsData) {
  const Dump ref = read_dump(prefill().path);
  const std::string path = copy_of(prefill(), "computed");
  // q_nope rank 1: a heads probe off column 0 (the sketch's column offset matters); q_c rank 0: replicated.
  const std::vector<std::string> records = {"/layer0/q_nope/rank1", "/layer0/q_c/rank0", "/layer0/kv_cache/rank1"};
  {
    Edit e(path);
    for (const auto& r : records) {
      for (const char* a : {"l2", "absmax", "mean", "std", "nan", "inf", "checksum", "level", "shape", "dtype"})
        e.unset(r, a);
      for (const char* d : {"token_l2", "sketch"}) e.remove(r + "/" + d);
    }
    e.remove("/layer0/q_nope/rank1/head_l2");
  }
  for (const bool with_data : {true, false}) {
    DumpReadOptions ro;
    ro.data = with_data;
    const Dump d = read_dump(path, ro);
    const std::vector<std::pair<std::string, int>> probes = {{"q_nope", 1}, {"q_c", 0}, {"kv_cache", 1}};
    for (const auto& [name, rank] : probes) {
      SCOPED_TRACE(name + " rank " + std::to_string(rank) + (with_data ? "" : " (read without data)"));
      const ProbeRecord& got = d.find(0, name)->ranks[rank];
      const ProbeRecord& want = ref.find(0, name)->ranks[rank];
      EXPECT_TRUE(same_bits(got.l2, want.l2)) << got.l2 << " vs " << want.l2;
      EXPECT_TRUE(same_bits(got.absmax, want.absmax));
      EXPECT_TRUE(same_bits(got.mean, want.mean));
      EXPECT_TRUE(same_bits(got.std, want.std));
      EXPECT_EQ(got.nan, want.nan);
      EXPECT_EQ(got.inf, want.inf);
      EXPECT_EQ(got.checksum, want.checksum);
      EXPECT_NE(got.checksum, 0u);
      EXPECT_TRUE(same_bits(got.token_l2, want.token_l2));
      EXPECT_TRUE(same_bits(got.head_l2, want.head_l2));
      EXPECT_FALSE(got.sketch.empty());
      EXPECT_TRUE(same_bits(got.sketch, want.sketch));
      EXPECT_EQ(got.level, ProbeLevel::ProbeLevel_full);
      EXPECT_EQ(got.shape, want.shape);
      EXPECT_EQ(got.data.empty(), !with_data);
    }
  }
}

TEST_F(DumpSchema, AnFp8ChecksumIsComputedFromTheCodesOfItsValues) {
  const std::string path = copy_of(prefill(), "fp8");
  // q_c rank 0 is [4, 48]: zeros but for a few values whose e4m3fn codes are known.
  std::vector<float> data(4 * 48, 0.f);
  const float nan = std::nanf("");
  const std::vector<std::tuple<int, float, uint32_t>> special = {
      {0, 0.5f, 0x30}, {1, 1.0f, 0x38}, {9, -1.0f, 0xb8}, {50, 448.f, 0x7e}, {51, -0.0f, 0x80},
      {100, nan, 0x7f}, {130, -nan, 0xff}, {191, 0.001953125f /* 2^-9: the smallest subnormal */, 0x01}};
  for (const auto& [i, v, code] : special) data[i] = v;
  {
    Edit e(path);
    e.floats("/layer0/q_c/rank0/data", {4, 48}, data);
    e.set("/layer0/q_c/rank0", "dtype", std::string("fp8_e4m3"));
    e.unset("/layer0/q_c/rank0", "checksum");
  }
  uint64_t want = 0;
  for (int i = 0; i < 4 * 48; ++i) {
    uint32_t code = 0;
    for (const auto& [j, v, c] : special)
      if (j == i) code = c;
    want += checksum_term(static_cast<uint64_t>(i / 48), static_cast<uint64_t>(i % 48), code);
  }
  const Dump d = read_dump(path);
  const ProbeRecord& r = d.find(0, "q_c")->ranks[0];
  EXPECT_EQ(r.dtype, "fp8_e4m3");
  EXPECT_EQ(r.checksum, want);
}

TEST_F(DumpSchema, ASignedChecksumReadsAsTheSame64Bits) {
  const Dump ref = read_dump(prefill().path);
  const uint64_t sum = ref.find(0, "q_a")->ranks[0].checksum;
  int64_t as_signed;
  std::memcpy(&as_signed, &sum, 8);
  const std::string path = copy_of(prefill(), "signed_checksum");
  {
    Edit e(path);
    e.set("/layer0/q_a/rank0", "checksum", as_signed);
  }
  EXPECT_EQ(read_dump(path).find(0, "q_a")->ranks[0].checksum, sum);
}

TEST_F(DumpSchema, UnknownAttributesAreIgnored) {
  const std::string path = copy_of(prefill(), "extra_attrs");
  {
    Edit e(path);
    for (const char* obj : {"/", "/inputs", "/layer0", "/layer0/q_c", "/layer0/q_c/rank1", "/inputs/x"})
      e.set(obj, "producer_note", std::string("kept by the producer, ignored by mla-bisect"));
    e.set("/", "layer_index", int64_t{12});
  }
  EXPECT_EQ(refusal(path), "");
}

TEST_F(DumpSchema, WithoutModelOrRunOptionsTheSharedRulesAreEnough) {
  for (const bool keep_model : {true, false}) {
    const std::string path = copy_of(prefill(), keep_model ? "no_run_options" : "no_model");
    {
      Edit e(path);
      e.unset("/", "run_options");
      if (!keep_model) e.unset("/", "model");
    }
    const Dump d = read_dump(path);
    EXPECT_EQ(d.probes.size(), read_dump(prefill().path).probes.size());
  }
  // Without a model, kv_c's width is not known: any [T, W] reads (its records must still fit the shape).
  const std::string path = copy_of(prefill(), "no_model_width");
  {
    Edit e(path);
    e.unset("/", "model");
    e.unset("/", "run_options");
    e.remove("/inputs");
    e.set("/layer0/kv_c", "shape", std::vector<int64_t>{4, 40});
    for (const char* r : {"/layer0/kv_c/rank0", "/layer0/kv_c/rank1"}) {
      e.set(r, "shape", std::vector<int64_t>{4, 40});
      e.unset(r, "checksum");
    }
  }
  EXPECT_EQ(refusal(path), "");
}

TEST_F(DumpSchema, WithoutContextTheCacheMayBeLeftOutAndReadsAsZeros) {
  const std::string path = copy_of(prefill(), "no_cache");
  {
    Edit e(path);
    e.remove("/inputs/kv_cache");
  }
  const Dump d = read_dump(path);
  ASSERT_EQ(d.inputs.kv_cache.size(), 1u);
  EXPECT_EQ(d.inputs.kv_cache[0].shape, (std::vector<int64_t>{prefill().num_blocks, 64, 40}));
  for (float v : d.inputs.kv_cache[0].data) ASSERT_EQ(v, 0.f);
}

TEST_F(DumpSchema, AStoppedRunMayHoldTheLeadingRanksOnly) {
  const std::string path = copy_of(prefill(), "stopped");
  {
    Edit e(path);
    e.set("/", "status", std::string("stopped: after layer 0 probe o rank 0"));
    e.remove("/layer0/o/rank1");
  }
  const Dump d = read_dump(path);
  EXPECT_FALSE(d.complete());
  EXPECT_EQ(d.find(0, "o")->ranks.size(), 1u);
}

TEST_F(DumpSchema, TheGoldensRead) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(MLA_SOURCE_DIR) / "golden")) {
    if (e.path().extension() != ".h5") continue;
    ++n;
    DumpReadOptions ro;
    ro.data = false;
    EXPECT_EQ(refusal(e.path().string(), ro), "") << e.path();
  }
  EXPECT_GT(n, 0);
}

// The h5py example of docs/dump-format.md writes a dump that reads, and the reader fills in its statistics.
TEST_F(DumpSchema, TheDocsH5pyExampleWritesAValidDump) {
  const std::string py = MLA_PYTHON_EXE;
  if (py.empty()) GTEST_SKIP() << "MLA_PYTHON is not set at configure time: the h5py example is not run";
  if (std::system(("'" + py + "' -c 'import h5py, numpy' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << py << " cannot import h5py and numpy (run scripts/setup.sh)";
  const std::string doc = test::slurp(fs::path(MLA_SOURCE_DIR) / "docs" / "dump-format.md");
  const std::string open = "```python\n";
  const size_t at = doc.find(open);
  ASSERT_NE(at, std::string::npos) << "docs/dump-format.md has no python example";
  const size_t end = doc.find("```", at + open.size());
  ASSERT_NE(end, std::string::npos);
  const std::string script_path = scratch("minimal_dump.py"), out = scratch("minimal.h5");
  test::spit(script_path, doc.substr(at + open.size(), end - at - open.size()));
  const test::CliResult py_run = test::run_shell("'" + py + "' '" + script_path + "' '" + out + "' 2>&1");
  ASSERT_EQ(py_run.exit_code, 0) << py_run.out;

  const Dump d = read_dump(out);
  EXPECT_TRUE(d.complete());
  ASSERT_EQ(d.probes.size(), 1u);
  const DumpProbe& p = d.probes[0];
  EXPECT_EQ(p.name, "kv_c_norm");
  ASSERT_EQ(p.ranks.size(), 1u);
  const ProbeRecord& r = p.ranks[0];
  ASSERT_EQ(r.data.shape, (std::vector<int64_t>{4, 32}));
  double ss = 0;
  for (float v : r.data.data) ss += static_cast<double>(v) * v;
  EXPECT_TRUE(same_bits(r.l2, std::sqrt(ss)));
  EXPECT_EQ(r.token_l2.size(), 4u);
  EXPECT_EQ(r.sketch.size(), 4u * kSketchDim);
  EXPECT_EQ(r.level, ProbeLevel::ProbeLevel_full);
  ProbeRequest req;
  req.level = ProbeLevel::ProbeLevel_full;
  req.tokens = 4;
  req.probe_key = probe_key("kv_c_norm");
  EXPECT_EQ(r.checksum, compute_probe_record(r.data, "fp32", req).checksum);
  ASSERT_TRUE(d.has_inputs);
  EXPECT_EQ(d.inputs.x.shape, (std::vector<int64_t>{4, 64}));

  const test::CliResult ins = test::run_cli("inspect '" + out + "'");
  EXPECT_EQ(ins.exit_code, 0) << ins.err;
  EXPECT_CONTAINS(ins.out, "kv_c_norm");
}

}  // namespace
