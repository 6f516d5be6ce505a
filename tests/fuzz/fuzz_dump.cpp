// libFuzzer target: the dump reader (read_dump: probes/dump_read.cpp, dump_journal.cpp, dump_ranks.cpp, h5.cpp,
// journal.cpp), structure-aware. libhdf5's own parser of the file's bytes is not what this fuzzes (it is a system
// library with crashes of its own on corrupt bytes): the input is an edit script that HDF5 itself applies to a valid
// dump, so every file the reader sees is a well-formed HDF5 file whose content is hostile.
//
// At start-up, real dumps of the tiny models are written with write_dump_h5 (scenarios: tp 1 and 2, sketch and full
// records, /weights, decode with a stored kv_cache, DSA's index_cache, no model or run options, a one-process-per-rank
// set FILE.rank0.h5 + FILE.rank1.h5); each is read back once, and must read. An input picks a scenario, then a list of
// edits, each applied in memory (HDF5's core driver on the file's image, H5Fget_file_image back):
//   attributes set (any name; int/uint/float of any width and byte order, NaN/inf/huge/negative values, arrays of any
//   length, fixed/variable strings, JSON of model/run_options with keys mutated, null and empty dataspaces,
//   compound/enum/array/opaque/vlen types) or deleted; groups created; datasets written (any numeric or foreign
//   dtype, rank 0 to 4, extents from 0 to 2^62: the large ones chunked with no or partial data, optionally a fill
//   value or deflate); links deleted, moved, hard-linked, copied (H5Ocopy), soft links (inside, dangling, loops,
//   through an external link) and external links; files dropped or cloned under another name (rank files, a target
//   of external links); and the journal sidecar FILE.h5.journal (or an abandoned writer's FILE.h5.journal.tmp.N):
//   header, probe, weight, stage and finish records with fields overridden, bytes edited, CRCs intact or broken.
// Then read_dump reads the path as inspect and compare do (with and without full tensors), and Dump::config/spec
// parse what it kept. A UsageError (or another std::exception) is the expected answer to a bad dump; a crash, a
// sanitizer report, a leak or an allocation beyond libFuzzer's -malloc_limit_mb is a finding.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/errors.h"
#include "core/model/stage_graph.h"
#include "probes/dump.h"
#include "probes/dump_internal.h"
#include "probes/journal.h"
#include "core/probe/probe.h"

namespace {

using namespace mla;
using nlohmann::json;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------------
// Scenarios: valid dumps written once by the library's own writer
// ---------------------------------------------------------------------------------------------------

struct Scenario {
  std::vector<std::pair<std::string, std::string>> files;  // file name in the work dir -> HDF5 image
  Dump dump;               // what the files hold (journal records are made from it)
  std::vector<int64_t> dims;  // extents that mean something in this dump (T, H, B, pages, heads, ...)
};

// MLA_FUZZ_DUMP_TRACE=1: every edit printed to stderr (reproducing a finding: which file made it).
bool g_trace = false;
void trace(const std::string& s) {
  if (g_trace) std::fprintf(stderr, "fuzz_dump: %s\n", s.c_str());
}

std::string g_dir;  // the work dir: a fresh set of files per input
std::vector<Scenario> g_scenarios;
std::vector<std::string> g_probe_names, g_stage_names;

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void clear_dir() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(g_dir, ec)) fs::remove_all(e.path(), ec);
}

Tensor random_tensor(const std::vector<int64_t>& shape, std::mt19937& rng) {
  Tensor t(shape);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : t.data) v = nd(rng);
  return t;
}

struct ScenarioSpec {
  std::string preset = "tiny";
  bool no_q_lora = false;
  RunSpec spec;
  ProbeLevel level = ProbeLevel::ProbeLevel_stats;
  std::vector<std::string> full;  // probes recorded in full
  bool weights = false;
  bool model_known = true, spec_known = true;
  bool rank_set = false;  // one process per rank: FILE.rank<r>.h5 each
};

Dump synth(const ScenarioSpec& ss, const MlaConfig& cfg, std::mt19937& rng) {
  const RunSpec& spec = ss.spec;
  Dump d;
  auto& m = d.meta;
  m.engine = "reference";
  m.engine_options = "precision=fp32";
  m.engine_dtype = "fp32";
  m.device = "cpu";
  m.model = ss.model_known ? cfg.to_json() : json(nullptr);
  m.run_options = ss.spec_known ? run_spec_to_json(spec) : json(nullptr);
  m.tp = spec.tp;
  m.mode = mode_name(spec.mode);
  m.seed = spec.seed;
  m.probe_level = probe_level_name(ss.level);
  m.command = "mla-bisect run --model tiny";
  d.tool_version = "fuzz";
  d.git_sha = "0";
  d.created_utc = "2026-01-01T00:00:00Z";
  d.status = "complete";
  d.has_inputs = true;
  Inputs& in = d.inputs;
  in.batch = make_batch(spec);
  const int64_t T = in.batch.tokens();
  in.x = random_tensor({T, cfg.hidden}, rng);
  if (in.batch.longest_context() > 0) {
    for (int l = 0; l < spec.layers; ++l) {
      in.kv_cache.push_back(random_tensor({in.batch.num_blocks, kPageSize, cfg.cache_row()}, rng));
      if (cfg.has_dsa())
        in.index_cache.push_back(random_tensor({in.batch.num_blocks, kPageSize, cfg.index_head_dim}, rng));
    }
  }
  const GraphShape g = spec.graph_shape();
  const auto add = [&](std::vector<DumpProbe>& list, const std::vector<ProbeSpec>& specs, int layer) {
    for (const auto& p : specs) {
      DumpProbe dp;
      dp.layer = layer;
      dp.name = p.name;
      dp.stage = stage_name(p.stage);
      dp.contract = contract_name(p.contract);
      dp.shape = p.shape;
      dp.order = p.order;
      dp.heads_axis = p.heads_axis;
      dp.rope_from = p.rope_from;
      dp.engine_dtype = "fp32";
      const ProbeLevel lvl =
          std::find(ss.full.begin(), ss.full.end(), p.name) != ss.full.end() ? ProbeLevel::ProbeLevel_full : ss.level;
      for (int r = 0; r < spec.tp; ++r) {
        const Tensor t = random_tensor(local_shape(p, spec.tp), rng);
        dp.ranks.push_back(compute_probe_record(t, "fp32", make_probe_request(p, spec.tp, r, lvl)));
      }
      list.push_back(std::move(dp));
    }
  };
  for (int l = 0; l < spec.layers; ++l) {
    add(d.probes, build_graph(cfg, g).probes, l);
    if (ss.weights) add(d.weights, build_weights(cfg, g), l);
  }
  return d;
}

void check_reads(const std::string& path, const std::string& what) {
  try {
    (void)read_dump(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_dump: the %s scenario does not read: %s\n", what.c_str(), e.what());
    std::abort();
  }
}

void make_scenario(const std::string& what, const ScenarioSpec& ss, std::mt19937& rng) {
  MlaConfig cfg = *find_preset(ss.preset);
  if (ss.no_q_lora) {
    cfg.q_lora_rank = 0;
    cfg.derive();
  }
  Scenario sc;
  sc.dump = synth(ss, cfg, rng);
  clear_dir();
  const std::string main = g_dir + "/d.h5";
  if (ss.rank_set) {
    for (int r = 0; r < ss.spec.tp; ++r) {
      Dump part = sc.dump;
      part.meta.processes = ss.spec.tp;
      part.meta.process_rank = r;
      part.meta.launch_id = "fuzz-launch";
      for (auto* list : {&part.probes, &part.weights})
        for (auto& p : *list) p.ranks = {p.ranks[r]};
      const std::string name = "d.rank" + std::to_string(r) + ".h5";
      write_dump_h5(part, g_dir + "/" + name);
      check_reads(g_dir + "/" + name, what + " (" + name + ")");
    }
    check_reads(main, what);
    for (int r = 0; r < ss.spec.tp; ++r) {
      const std::string name = "d.rank" + std::to_string(r) + ".h5";
      sc.files.emplace_back(name, slurp(g_dir + "/" + name));
    }
  } else {
    write_dump_h5(sc.dump, main);
    check_reads(main, what);
    sc.files.emplace_back("d.h5", slurp(main));
  }
  const auto& b = sc.dump.inputs.batch;
  const int64_t T = b.tokens();
  sc.dims = {0, 1, 2, 3, 4, T, T + 1, T - 1, 2 * T, cfg.hidden, b.num_seqs(), b.num_blocks, b.num_blocks + 1,
             b.max_blocks, kPageSize, kSketchDim, cfg.heads, cfg.heads / std::max(ss.spec.tp, 1), cfg.cache_row(),
             cfg.kv_lora_rank, cfg.qk_rope, cfg.qk_nope, cfg.v_head, cfg.q_lora_rank, ss.spec.layers,
             int64_t{1} << 20, int64_t{1} << 24, (int64_t{1} << 31) + 1, int64_t{1} << 40, int64_t{1} << 62};
  g_scenarios.push_back(std::move(sc));
  clear_dir();
}

void make_scenarios() {
  std::mt19937 rng(12345);
  ScenarioSpec s;
  s.spec.tokens = 2;
  make_scenario("tp 1 stats", s, rng);

  ScenarioSpec s2;
  s2.spec.tokens = 2;
  s2.spec.tp = 2;
  s2.spec.layers = 2;
  s2.level = ProbeLevel::ProbeLevel_sketch;
  s2.full = {"x", "q_pe", "o_partial", "kv_b_proj", "o_proj", "q_a_layernorm"};
  s2.weights = true;
  make_scenario("tp 2 sketch, weights", s2, rng);

  ScenarioSpec s3;
  s3.no_q_lora = true;
  s3.spec.mode = Mode::Mode_decode;
  s3.spec.form = AttentionForm::AttentionForm_absorbed;
  s3.spec.tokens = 1;
  s3.spec.batch = 2;
  s3.spec.context = {3, 70};
  s3.level = ProbeLevel::ProbeLevel_full;
  make_scenario("decode, stored kv_cache, no q LoRA", s3, rng);

  ScenarioSpec s4;
  s4.preset = "tiny-dsa";
  s4.spec.mode = Mode::Mode_decode;
  s4.spec.form = AttentionForm::AttentionForm_absorbed;
  s4.spec.tokens = 1;
  s4.spec.context = {20};
  s4.full = {"topk", "idx_scores"};
  make_scenario("DSA decode", s4, rng);

  ScenarioSpec s5;
  s5.spec.tokens = 2;
  s5.model_known = s5.spec_known = false;
  s5.level = ProbeLevel::ProbeLevel_sketch;
  s5.full = {"lse"};
  make_scenario("no model, no run options", s5, rng);

  ScenarioSpec s6;
  s6.spec.tokens = 2;
  s6.spec.tp = 2;
  s6.level = ProbeLevel::ProbeLevel_sketch;
  s6.full = {"attn_out"};
  s6.weights = true;
  s6.rank_set = true;
  make_scenario("one process per rank", s6, rng);

  std::set<std::string> names;
  for (const char* p : {"tiny", "tiny-dsa"}) {
    MlaConfig c = *find_preset(p);
    for (int q = 0; q < 2; ++q) {
      if (q) {
        c.q_lora_rank = 0;
        c.derive();
      }
      for (const auto f : {AttentionForm::AttentionForm_mha, AttentionForm::AttentionForm_absorbed})
        for (const bool norm : {false, true}) {
          GraphShape g;
          g.tokens = 2;
          g.keys = 4;
          g.form = f;
          g.input_norm = norm;
          for (const auto& ps : build_graph(c, g).probes) names.insert(ps.name);
          for (const auto& ps : build_weights(c, g)) names.insert(ps.name);
          for (const auto& st : build_graph(c, g).stages) g_stage_names.push_back(stage_name(st.stage));
        }
    }
  }
  g_probe_names.assign(names.begin(), names.end());
  std::sort(g_stage_names.begin(), g_stage_names.end());
  g_stage_names.erase(std::unique(g_stage_names.begin(), g_stage_names.end()), g_stage_names.end());
}

// ---------------------------------------------------------------------------------------------------
// Values the edits draw from
// ---------------------------------------------------------------------------------------------------

const int64_t kInts[] = {0,
                         1,
                         -1,
                         2,
                         3,
                         4,
                         7,
                         8,
                         16,
                         31,
                         32,
                         63,
                         64,
                         65,
                         127,
                         128,
                         255,
                         1000,
                         1001,
                         1024,
                         1025,
                         4096,
                         4097,
                         65536,
                         int64_t{1} << 20,
                         int64_t{1} << 22,
                         (int64_t{1} << 22) + 1,
                         int64_t{1} << 30,
                         (int64_t{1} << 30) + 1,
                         std::numeric_limits<int32_t>::max(),
                         int64_t{std::numeric_limits<int32_t>::max()} + 1,
                         std::numeric_limits<int32_t>::min(),
                         int64_t{std::numeric_limits<int32_t>::min()} - 1,
                         std::numeric_limits<uint32_t>::max(),
                         int64_t{1} << 40,
                         (int64_t{1} << 40) + 1,
                         int64_t{1} << 53,
                         std::numeric_limits<int64_t>::max(),
                         std::numeric_limits<int64_t>::min(),
                         -2,
                         -64};

const double kDoubles[] = {0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.5,
                           2.5,
                           3.0,
                           1e308,
                           -1e308,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(),
                           -std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::denorm_min(),
                           9.3e18,
                           1.8446744073709552e19,
                           4294967296.0,
                           2147483648.0,
                           1e-300,
                           4096.0,
                           1e20};

const char* const kStrings[] = {"",
                                "complete",
                                "stopped: after layer 0 probe x rank 0",
                                "stopped",
                                "running: x",
                                "mla-bisect-dump",
                                "mla-bisect-dump ",
                                "fp32",
                                "bf16",
                                "fp16",
                                "fp8_e4m3",
                                "fp8_e5m2",
                                "fp32|bf16",
                                "|",
                                "replicated",
                                "heads",
                                "partial",
                                "rows",
                                "columns",
                                "stats",
                                "sketch",
                                "full",
                                "prefill",
                                "decode",
                                "chunked",
                                "mha",
                                "absorbed",
                                "null",
                                "{}",
                                "[]",
                                "[\"layer 0 stage rope\"]",
                                "[1]",
                                "{\"a\":",
                                "reference",
                                "\xff\xfe",
                                "rank0",
                                "layer0"};

const char* const kRootAttrs[] = {"format", "schema_version", "tool_version", "git_sha", "created_utc", "engine",
                                  "engine_options", "engine_dtype", "device", "model", "run_options", "tp", "mode",
                                  "seed", "inject", "probe_level", "command", "process_rank", "processes",
                                  "launch_id", "layer_index", "status", "last_stage", "kv_cache_dtype",
                                  "kv_cache_scale"};
const char* const kProbeAttrs[] = {"order", "stage", "contract", "shape", "heads_axis", "rope_from", "engine_dtype"};
const char* const kRankAttrs[] = {"l2", "absmax", "mean", "std", "nan", "inf", "checksum", "level", "shape", "dtype"};
const char* const kJsonAttrs[] = {"model", "run_options", "last_stage"};
const char* const kStringAttrs[] = {"format",  "tool_version", "git_sha",     "created_utc", "engine",
                                    "engine_options", "engine_dtype", "device", "mode", "inject", "probe_level",
                                    "command", "launch_id", "status", "stage", "contract", "level", "dtype",
                                    "kv_cache_dtype"};
const char* const kShapeAttrs[] = {"shape"};

const char* const kObjectNames[] = {"inputs", "weights", "layer0", "layer1", "layer2", "layer3", "layer00",
                                    "layer-1", "layer", "layer4294967296", "layer999999999", "x", "positions",
                                    "seq_lens", "context_lens", "block_table", "kv_cache", "index_cache", "rank0",
                                    "rank1", "rank2", "rank3", "rank00", "rank", "rank-1", "rank4096",
                                    "rank999999", "rank9999999", "token_l2", "head_l2", "sketch", "data", "extra"};

const char* const kModelKeys[] = {"hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
                                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_hidden_layers",
                                  "rope_theta", "rms_norm_eps", "rope_interleave", "rope_scaling", "rope_parameters",
                                  "index_topk", "index_n_heads", "index_head_dim", "model_type", "name",
                                  "text_config", "index_shared", "indexer_types"};
const char* const kRunKeys[] = {"mode", "form", "tp", "layers", "tokens", "batch", "context", "seed",
                                "position_offset", "input_norm", "keys", "setup", "kv_cache_dtype",
                                "kv_cache_scale"};

template <class T, size_t N> constexpr size_t count_of(const T (&)[N]) { return N; }

// ---------------------------------------------------------------------------------------------------
// One input: the files it makes
// ---------------------------------------------------------------------------------------------------

struct Image {
  std::string name;   // in the work dir
  std::string bytes;  // the HDF5 file image
  hid_t file = H5I_INVALID_HID;
  std::vector<std::string> paths;  // objects known in it ("/" first)
};

class Builder {
 public:
  Builder(FuzzedDataProvider& fdp, const Scenario& sc) : f_(fdp), sc_(sc) {
    for (const auto& [name, bytes] : sc.files) images_.push_back(Image{name, bytes, H5I_INVALID_HID, {}});
  }
  ~Builder() {
    for (auto& im : images_) close(im, false);
  }

  void run(int max_ops) {
    if (const char* e = std::getenv("MLA_FUZZ_DUMP_OPS")) max_ops = std::atoi(e);  // bisecting a finding
    for (int i = 0; i < max_ops && f_.remaining_bytes() > 0; ++i) op();
  }

  // Writes every file into the work dir.
  void write_files() {
    for (auto& im : images_) {
      close(im, true);
      if (!im.name.empty()) spit(g_dir + "/" + im.name, im.bytes);
    }
    for (const auto& [name, bytes] : journals_) spit(g_dir + "/" + name, bytes);
  }

 private:
  // ------------------------------------------------------------------ choices
  uint8_t byte() { return f_.ConsumeIntegral<uint8_t>(); }
  bool chance(int in256) { return byte() < in256; }
  template <class T, size_t N> T pick(const T (&a)[N]) { return a[f_.ConsumeIntegral<uint16_t>() % N]; }
  std::string pick_or_random(const char* const* dict, size_t n, size_t len = 24) {
    const uint16_t c = f_.ConsumeIntegral<uint16_t>();
    if (c % 16 == 15) return f_.ConsumeRandomLengthString(len);
    return dict[(c / 16) % n];
  }
  int64_t int_value() {
    switch (byte() % 4) {
      case 0: return pick(kInts);
      case 1: return sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()];
      case 2:  // next to an extreme value, wrapping around
        return static_cast<int64_t>(static_cast<uint64_t>(pick(kInts)) +
                                    static_cast<uint64_t>(f_.ConsumeIntegralInRange<int64_t>(-2, 2)));
      default: return f_.ConsumeIntegral<int64_t>();
    }
  }
  double double_value() {
    switch (byte() % 3) {
      case 0: return pick(kDoubles);
      case 1: return static_cast<double>(int_value());
      default: {
        const uint64_t bits = f_.ConsumeIntegral<uint64_t>();
        double d;
        std::memcpy(&d, &bits, 8);
        return d;
      }
    }
  }
  std::string string_value() {
    switch (byte() % 4) {
      case 0: return f_.ConsumeRandomLengthString(64);
      case 1: return g_stage_names[f_.ConsumeIntegral<uint16_t>() % g_stage_names.size()];
      default: return pick(kStrings);
    }
  }
  std::string probe_name() {
    if (byte() % 8 == 7) return f_.ConsumeRandomLengthString(16);
    return g_probe_names[f_.ConsumeIntegral<uint16_t>() % g_probe_names.size()];
  }
  std::string object_name() {
    switch (byte() % 3) {
      case 0: return probe_name();
      default: return pick_or_random(kObjectNames, count_of(kObjectNames));
    }
  }
  std::vector<int64_t> shape_value() {
    std::vector<int64_t> s(byte() % 5);
    for (auto& d : s) d = byte() % 4 ? sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()] : int_value();
    return s;
  }

  json json_value(int depth = 0) {
    switch (byte() % 12) {
      case 0: return int_value();
      case 1: return double_value();  // NaN and inf dump as null
      case 2: return string_value();
      case 3: return byte() % 2 == 0;
      case 4: return nullptr;
      case 5: {
        json a = json::array();
        for (int n = byte() % 4; n > 0; --n) a.push_back(depth < 3 ? json_value(depth + 1) : json(int_value()));
        return a;
      }
      case 6: {
        json o = json::object();
        for (int n = byte() % 3; n > 0; --n)
          o[pick_or_random(kModelKeys, count_of(kModelKeys))] = depth < 3 ? json_value(depth + 1) : json(1);
        return o;
      }
      case 7: return static_cast<uint64_t>(f_.ConsumeIntegral<uint64_t>());
      case 8: return json::array({int_value()});
      default: return int_value() % 4096;
    }
  }

  // JSON text; strings that are not UTF-8 (input bytes) are written with U+FFFD in their place.
  static std::string text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

  // The scenario's model, run options or last_stage with a few keys changed, or other JSON text.
  std::string json_text(const std::string& attr) {
    const auto& m = sc_.dump.meta;
    json j = attr == "model" ? m.model : attr == "run_options" ? m.run_options : json(sc_.dump.last_stage);
    if (byte() % 16 == 15) return f_.ConsumeRandomLengthString(256);
    const bool model = attr == "model";
    for (int n = byte() % 4 + 1; n > 0; --n) {
      switch (byte() % 8) {
        case 0:
          if (j.is_object() && !j.empty()) {
            auto it = j.begin();
            std::advance(it, f_.ConsumeIntegral<uint16_t>() % j.size());
            j.erase(it);
          }
          break;
        case 1: j = json_value(); break;
        case 2:
          if (model) j = json{{"text_config", j}};
          else if (j.is_array()) j.push_back(json_value());
          break;
        default: {
          if (!j.is_object()) j = json::object();
          const std::string key = model ? pick_or_random(kModelKeys, count_of(kModelKeys))
                                        : pick_or_random(kRunKeys, count_of(kRunKeys));
          j[key] = json_value();
        }
      }
    }
    return text(j);
  }

  // ------------------------------------------------------------------ HDF5 images
  Image& cur() { return images_[cur_ % images_.size()]; }

  hid_t open(Image& im) {
    if (im.file >= 0) return im.file;
    if (im.bytes.empty()) return H5I_INVALID_HID;
    const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 1 << 16, 0);
    H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
    H5Pset_file_image(fapl, im.bytes.data(), im.bytes.size());
    im.file = H5Fopen(("mem-" + std::to_string(&im - images_.data())).c_str(), H5F_ACC_RDWR, fapl);
    H5Pclose(fapl);
    H5Eclear2(H5E_DEFAULT);
    if (im.file >= 0 && im.paths.empty()) list(im.file, "/", im.paths, 0);
    return im.file;
  }

  void close(Image& im, bool keep) {
    if (im.file < 0) return;
    if (keep) {
      H5Fflush(im.file, H5F_SCOPE_LOCAL);
      const ssize_t n = H5Fget_file_image(im.file, nullptr, 0);
      if (n > 0) {
        std::string b(static_cast<size_t>(n), '\0');
        if (H5Fget_file_image(im.file, b.data(), b.size()) == n) im.bytes = std::move(b);
      }
    }
    H5Fclose(im.file);
    H5Eclear2(H5E_DEFAULT);
    im.file = H5I_INVALID_HID;
  }

  // Every object under `path` by hard links (the scenarios are trees).
  static void list(hid_t file, const std::string& path, std::vector<std::string>& out, int depth) {
    out.push_back(path);
    if (depth > 5) return;
    const hid_t g = H5Gopen2(file, path.c_str(), H5P_DEFAULT);
    if (g < 0) {
      H5Eclear2(H5E_DEFAULT);
      return;
    }
    H5G_info_t info;
    if (H5Gget_info(g, &info) >= 0) {
      for (hsize_t i = 0; i < info.nlinks; ++i) {
        char name[256];
        if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0) continue;
        list(file, path + (path == "/" ? "" : "/") + name, out, depth + 1);
      }
    }
    H5Gclose(g);
    H5Eclear2(H5E_DEFAULT);
  }

  std::string pick_path(Image& im) {
    if (im.paths.empty()) return "/";
    return im.paths[f_.ConsumeIntegral<uint16_t>() % im.paths.size()];
  }
  static std::string child(const std::string& parent, const std::string& name) {
    return parent + (parent == "/" ? "" : "/") + name;
  }

  // ------------------------------------------------------------------ edits
  void op() {
    const uint8_t k = byte();
    trace("op " + std::to_string(k) + " on " + cur().name);
    if (k < 100) return set_attr();
    if (k < 110) return delete_attr();
    if (k < 164) return write_dataset();
    if (k < 172) return create_group();
    if (k < 182) return delete_link();
    if (k < 188) return move_link();
    if (k < 200) return copy_object();
    if (k < 206) return soft_link();
    if (k < 210) return external_link();
    if (k < 214) return hard_link();
    if (k < 218) {
      cur_ = byte();  // switch file
      return;
    }
    if (k < 222) return clone_file();
    if (k < 224) {
      close(cur(), false);
      cur().name.clear();  // the file is not written
      return;
    }
    return journal_record();
  }

  // The attribute names that belong on the object at `path`, judged by its depth.
  std::string attr_name(const std::string& path) {
    if (byte() % 8 == 7) return pick_or_random(kRootAttrs, count_of(kRootAttrs));
    const auto depth = std::count(path.begin(), path.end(), '/');
    const bool weights = path.rfind("/weights", 0) == 0;
    if (path == "/") return pick_or_random(kRootAttrs, count_of(kRootAttrs));
    if (path == "/inputs")
      return byte() % 2 ? std::string("num_blocks") : pick_or_random(kRankAttrs, count_of(kRankAttrs));
    if (depth - weights == 2) return pick_or_random(kProbeAttrs, count_of(kProbeAttrs));
    return pick_or_random(kRankAttrs, count_of(kRankAttrs));
  }

  static void put_attr(hid_t obj, const std::string& name, hid_t type, hid_t space, hid_t mtype, const void* buf) {
    if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
    const hid_t a = H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
      if (buf) H5Awrite(a, mtype, buf);
      H5Aclose(a);
    }
    H5Eclear2(H5E_DEFAULT);
  }

  static hid_t int_type(uint8_t c) {
    static const hid_t* const kTypes[] = {&H5T_STD_I8LE_g,  &H5T_STD_U8LE_g,  &H5T_STD_I16BE_g, &H5T_STD_U16LE_g,
                                          &H5T_STD_I32LE_g, &H5T_STD_U32BE_g, &H5T_STD_I64BE_g, &H5T_STD_U64LE_g,
                                          &H5T_STD_I64LE_g, &H5T_STD_I32BE_g};
    H5open();
    return *kTypes[c % count_of(kTypes)];
  }

  void set_attr() {
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    const std::string path = pick_path(im);
    const hid_t obj = H5Oopen(file, path.c_str(), H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);
    if (obj < 0) return;
    const std::string name = attr_name(path);
    trace("  attribute " + path + " " + name);
    // Mostly a value of the attribute's own kind, else any kind.
    int kind = byte() % 24;
    const auto is = [&](const char* const* list, size_t n) {
      return std::any_of(list, list + n, [&](const char* s) { return name == s; });
    };
    if (kind < 12) {
      if (is(kJsonAttrs, count_of(kJsonAttrs))) kind = 100;
      else if (is(kShapeAttrs, 1)) kind = 5;
      else if (is(kStringAttrs, count_of(kStringAttrs))) kind = 7;
      else kind = kind % 4 == 0 ? 3 : 0;
    }
    const hid_t scalar = H5Screate(H5S_SCALAR);
    switch (kind) {
      case 0: {
        const int64_t v = int_value();
        put_attr(obj, name, H5T_STD_I64LE, scalar, H5T_NATIVE_INT64, &v);
        break;
      }
      case 1: {
        const uint64_t v = static_cast<uint64_t>(int_value());
        put_attr(obj, name, H5T_STD_U64LE, scalar, H5T_NATIVE_UINT64, &v);
        break;
      }
      case 2: {  // other widths and byte orders (HDF5 converts, clamping)
        const int64_t v = int_value();
        put_attr(obj, name, int_type(byte()), scalar, H5T_NATIVE_INT64, &v);
        break;
      }
      case 3: {
        const double v = double_value();
        put_attr(obj, name, byte() % 2 ? H5T_IEEE_F64LE : H5T_IEEE_F64BE, scalar, H5T_NATIVE_DOUBLE, &v);
        break;
      }
      case 4: {
        const double v = double_value();  // HDF5 converts (out of range: inf)
        put_attr(obj, name, H5T_IEEE_F32LE, scalar, H5T_NATIVE_DOUBLE, &v);
        break;
      }
      case 5:
      case 6: {  // 1-D arrays, of any length: the attribute's own values with one changed, or others
        std::vector<int64_t> s;
        const uint8_t how = byte();
        if (how % 2 == 0 && H5Aexists(obj, name.c_str()) > 0) {
          const hid_t a = H5Aopen(obj, name.c_str(), H5P_DEFAULT);
          const hid_t sp = H5Aget_space(a);
          const hssize_t n = H5Sget_simple_extent_npoints(sp);
          if (n > 0 && n < 64) {
            s.resize(static_cast<size_t>(n));
            if (H5Aread(a, H5T_NATIVE_INT64, s.data()) < 0) s.clear();
          }
          H5Sclose(sp);
          H5Aclose(a);
          H5Eclear2(H5E_DEFAULT);
          if (!s.empty()) {
            const int64_t v = how % 4 == 0 ? sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()] : int_value();
            s[byte() % s.size()] = v;
          }
        }
        if (s.empty()) s = shape_value();
        if (byte() % 16 == 0) s.resize(f_.ConsumeIntegralInRange<size_t>(0, 5000), 1);
        std::vector<double> dv(s.begin(), s.end());
        const hsize_t n = s.size();
        const hid_t sp = H5Screate_simple(1, &n, nullptr);
        if (kind == 5) put_attr(obj, name, int_type(byte() % 4 ? 8 : byte()), sp, H5T_NATIVE_INT64, s.data());
        else put_attr(obj, name, H5T_IEEE_F64LE, sp, H5T_NATIVE_DOUBLE, dv.data());
        H5Sclose(sp);
        break;
      }
      case 7:
      case 100: {  // a variable-length string
        const std::string s = kind == 100 ? json_text(name) : string_value();
        const hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, H5T_VARIABLE);
        H5Tset_cset(t, byte() % 2 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
        const char* p = s.c_str();
        put_attr(obj, name, t, scalar, t, &p);
        H5Tclose(t);
        break;
      }
      case 8: {  // a fixed-length string, its size any, terminated or not
        std::string s = string_value();
        const size_t size = byte() % 4 ? std::max<size_t>(s.size(), 1) : f_.ConsumeIntegralInRange<size_t>(1, 300);
        s.resize(size, byte() % 2 ? '\0' : 'x');
        const hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, size);
        H5Tset_strpad(t, static_cast<H5T_str_t>(byte() % 3));
        put_attr(obj, name, t, scalar, t, s.data());
        H5Tclose(t);
        break;
      }
      case 9: {  // strings: two, or none
        const hsize_t n = byte() % 3;
        const hid_t sp = H5Screate_simple(1, &n, nullptr);
        const hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, H5T_VARIABLE);
        const std::string a = string_value(), b = string_value();
        const char* p[2] = {a.c_str(), b.c_str()};
        put_attr(obj, name, t, sp, t, p);
        H5Tclose(t);
        H5Sclose(sp);
        break;
      }
      case 10: {  // a null dataspace: no value at all
        const hid_t sp = H5Screate(H5S_NULL);
        if (byte() % 2) {
          put_attr(obj, name, H5T_STD_I64LE, sp, H5T_NATIVE_INT64, nullptr);
        } else {
          const hid_t t = H5Tcopy(H5T_C_S1);
          H5Tset_size(t, H5T_VARIABLE);
          put_attr(obj, name, t, sp, t, nullptr);
          H5Tclose(t);
        }
        H5Sclose(sp);
        break;
      }
      case 11: {  // 2-D
        const hsize_t dims[2] = {static_cast<hsize_t>(byte() % 3), static_cast<hsize_t>(byte() % 3)};
        const int64_t v[4] = {int_value(), int_value(), int_value(), int_value()};
        const hid_t sp = H5Screate_simple(2, dims, nullptr);
        put_attr(obj, name, H5T_STD_I64LE, sp, H5T_NATIVE_INT64, v);
        H5Sclose(sp);
        break;
      }
      case 12: {  // compound
        const hid_t t = H5Tcreate(H5T_COMPOUND, 8);
        H5Tinsert(t, "a", 0, H5T_NATIVE_INT64);
        const int64_t v = int_value();
        put_attr(obj, name, t, scalar, t, &v);
        H5Tclose(t);
        break;
      }
      case 13: {  // enum
        const hid_t t = H5Tenum_create(H5T_NATIVE_INT);
        int a = 0, b = 1;
        H5Tenum_insert(t, "FALSE", &a);
        H5Tenum_insert(t, "TRUE", &b);
        const int v = byte() % 2;
        put_attr(obj, name, t, scalar, t, &v);
        H5Tclose(t);
        break;
      }
      case 14: {  // an array type: one element holding three numbers
        const hsize_t n = 3;
        const hid_t t = H5Tarray_create2(H5T_NATIVE_INT64, 1, &n);
        const int64_t v[3] = {int_value(), int_value(), int_value()};
        put_attr(obj, name, t, scalar, t, v);
        H5Tclose(t);
        break;
      }
      case 15: {  // opaque
        const hid_t t = H5Tcreate(H5T_OPAQUE, 4);
        H5Tset_tag(t, "fuzz");
        const uint32_t v = f_.ConsumeIntegral<uint32_t>();
        put_attr(obj, name, t, scalar, t, &v);
        H5Tclose(t);
        break;
      }
      case 16: {  // bitfield
        const uint64_t v = f_.ConsumeIntegral<uint64_t>();
        put_attr(obj, name, H5T_STD_B64LE, scalar, H5T_NATIVE_B64, &v);
        break;
      }
      case 17: {  // a variable-length sequence of ints
        const hid_t t = H5Tvlen_create(H5T_NATIVE_INT64);
        int64_t v[2] = {int_value(), int_value()};
        hvl_t h{static_cast<size_t>(byte() % 3), v};
        put_attr(obj, name, t, scalar, t, &h);
        H5Tclose(t);
        break;
      }
      case 18: {  // a variable-length string holding no string (a null pointer)
        const hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, H5T_VARIABLE);
        const char* p = nullptr;
        put_attr(obj, name, t, scalar, t, &p);
        H5Tclose(t);
        break;
      }
      case 19: {  // an empty 1-D array
        const hsize_t n = 0;
        const hid_t sp = H5Screate_simple(1, &n, nullptr);
        put_attr(obj, name, byte() % 2 ? H5T_STD_I64LE : H5T_IEEE_F64LE, sp, H5T_NATIVE_INT64, nullptr);
        H5Sclose(sp);
        break;
      }
      case 20: {  // a half-width float type (HDF5 converts to and from it)
        const hid_t t = H5Tcopy(H5T_IEEE_F32LE);
        H5Tset_fields(t, 15, 10, 5, 0, 10);
        H5Tset_size(t, 2);
        H5Tset_ebias(t, 15);
        const double v = double_value();
        put_attr(obj, name, t, scalar, H5T_NATIVE_DOUBLE, &v);
        H5Tclose(t);
        break;
      }
      default: {  // JSON text under any name
        const std::string s = json_text(pick(kJsonAttrs));
        const hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, H5T_VARIABLE);
        const char* p = s.c_str();
        put_attr(obj, name, t, scalar, t, &p);
        H5Tclose(t);
      }
    }
    H5Sclose(scalar);
    H5Oclose(obj);
    H5Eclear2(H5E_DEFAULT);
  }

  void delete_attr() {
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    const std::string path = pick_path(im);
    const std::string name = attr_name(path);
    H5Adelete_by_name(file, path.c_str(), name.c_str(), H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);
  }

  void create_group() {
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    const std::string at = child(pick_path(im), object_name());
    const hid_t g = H5Gcreate2(file, at.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g >= 0) {
      H5Gclose(g);
      im.paths.push_back(at);
    }
    H5Eclear2(H5E_DEFAULT);
  }

  void delete_link() {
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    const std::string at = pick_path(im);
    trace("  delete " + at);
    H5Ldelete(file, at.c_str(), H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);
  }

  void move_link() {
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    const std::string from = pick_path(im);
    const std::string to = child(byte() % 2 ? pick_path(im) : from.substr(0, std::max<size_t>(from.rfind('/'), 1)),
                                 object_name());
    trace("  move " + from + " to " + to);
    if (H5Lmove(file, from.c_str(), file, to.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0) im.paths.push_back(to);
    H5Eclear2(H5E_DEFAULT);
  }

  void copy_object() {  // a whole subtree under another name (a second rank, layer or probe)
    Image& im = cur();
    hid_t file = open(im);
    if (file < 0) return;
    const std::string from = pick_path(im);
    const std::string parent = byte() % 2 ? from.substr(0, std::max<size_t>(from.rfind('/'), 1)) : pick_path(im);
    const std::string to = child(parent, object_name());
    trace("  copy " + from + " to " + to);
    // Copied from a freshly opened image: libhdf5 1.10.8's H5Ocopy after other edits in the same open file can fail
    // retagging its cached metadata ("can't insert duplicate key") and then loses B-tree nodes (a leak of its own).
    close(im, true);
    file = open(im);
    if (file < 0) return;
    if (H5Ocopy(file, from.c_str(), file, to.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0) list(file, to, im.paths, 3);
    else if (g_trace) H5Eprint2(H5E_DEFAULT, stderr);
    H5Eclear2(H5E_DEFAULT);
  }

  void soft_link() {
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    const std::string at = child(pick_path(im), object_name());
    std::string target;
    switch (byte() % 5) {
      case 0: target = at; break;  // itself
      case 1: target = f_.ConsumeRandomLengthString(32); break;
      case 2: target = "/elsewhere/" + object_name(); break;  // through an external link, when there is one
      default: target = pick_path(im);
    }
    trace("  soft link " + at + " to " + target);
    if (byte() % 2) H5Ldelete(file, at.c_str(), H5P_DEFAULT);
    if (H5Lcreate_soft(target.c_str(), file, at.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0) im.paths.push_back(at);
    H5Eclear2(H5E_DEFAULT);
  }

  void external_link() {
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    const std::string at = byte() % 4 ? child(pick_path(im), object_name()) : std::string("/elsewhere");
    static const char* const kFiles[] = {"other.h5", "d.h5", "d.rank1.h5", "/nonexistent/x.h5", "", "/etc/hostname"};
    const std::string target_file = byte() % 8 == 7 ? f_.ConsumeRandomLengthString(32) : pick(kFiles);
    const std::string target_obj = byte() % 2 ? std::string("/") : pick_path(im);
    trace("  external link " + at + " to " + target_file + ":" + target_obj);
    if (byte() % 2) H5Ldelete(file, at.c_str(), H5P_DEFAULT);
    if (H5Lcreate_external(target_file.c_str(), target_obj.c_str(), file, at.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0)
      im.paths.push_back(at);
    H5Eclear2(H5E_DEFAULT);
  }

  void hard_link() {  // one object under two names, or a group inside itself
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    const std::string from = pick_path(im);
    const std::string at = child(pick_path(im), object_name());
    trace("  hard link " + at + " to " + from);
    if (H5Lcreate_hard(file, from.c_str(), file, at.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0) im.paths.push_back(at);
    H5Eclear2(H5E_DEFAULT);
  }

  void clone_file() {
    static const char* const kNames[] = {"d.h5", "other.h5", "d.rank0.h5", "d.rank1.h5", "d.rank2.h5", "d.rank01.h5"};
    Image& src = cur();
    close(src, true);
    if (src.bytes.empty() || images_.size() >= 6) return;
    Image copy{pick(kNames), src.bytes, H5I_INVALID_HID, src.paths};
    for (auto& im : images_)
      if (im.name == copy.name) {
        close(im, false);
        im.name.clear();
      }
    images_.push_back(std::move(copy));
    cur_ = images_.size() - 1;
  }

  // A dataset of any type and extents at a path the reader looks at (or anywhere).
  void write_dataset() {
    Image& im = cur();
    const hid_t file = open(im);
    if (file < 0) return;
    std::string at;
    const uint8_t where = byte() % 4;
    std::vector<hsize_t> old_dims;  // of the dataset replaced, where one is
    hid_t old_type = H5I_INVALID_HID;
    if (where < 2) {  // a dataset of the dump, its extents changed
      std::vector<std::string> datasets;
      for (const auto& p : im.paths) {
        const hid_t o = H5Oopen(file, p.c_str(), H5P_DEFAULT);
        if (o >= 0 && H5Iget_type(o) == H5I_DATASET) {
          datasets.push_back(p);
        }
        if (o >= 0) H5Oclose(o);
      }
      H5Eclear2(H5E_DEFAULT);
      if (datasets.empty()) return;
      at = datasets[f_.ConsumeIntegral<uint16_t>() % datasets.size()];
      const hid_t d = H5Dopen2(file, at.c_str(), H5P_DEFAULT);
      if (d >= 0) {
        const hid_t sp = H5Dget_space(d);
        const int nd = H5Sget_simple_extent_ndims(sp);
        if (nd > 0) {
          old_dims.resize(nd);
          H5Sget_simple_extent_dims(sp, old_dims.data(), nullptr);
        }
        if (byte() % 4) old_type = H5Dget_type(d);
        H5Sclose(sp);
        H5Dclose(d);
      }
      H5Eclear2(H5E_DEFAULT);
    } else if (where == 2 && im.paths.size() > 1) {
      at = pick_path(im);  // any object replaced
    } else {
      at = child(pick_path(im), object_name());
    }
    if (at == "/") return;
    trace("dataset " + im.name + ":" + at);
    H5Ldelete(file, at.c_str(), H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);

    // The file type.
    static const hid_t* const kTypes[] = {&H5T_IEEE_F32LE_g, &H5T_IEEE_F32LE_g, &H5T_IEEE_F64LE_g, &H5T_IEEE_F32BE_g,
                                          &H5T_STD_I32LE_g,  &H5T_STD_I32LE_g,  &H5T_STD_I64LE_g,  &H5T_STD_U64LE_g,
                                          &H5T_STD_I8LE_g,   &H5T_STD_U8LE_g,   &H5T_STD_I16BE_g,  &H5T_STD_U32LE_g,
                                          &H5T_STD_I64BE_g};
    const uint8_t tc = byte() % 20;
    hid_t type;
    bool numeric = true;
    if (old_type >= 0) {
      type = old_type;
      numeric = H5Tget_class(type) == H5T_INTEGER || H5Tget_class(type) == H5T_FLOAT;
    } else if (tc < count_of(kTypes)) {
      type = H5Tcopy(*kTypes[tc]);
    } else {
      numeric = false;
      switch (tc) {
        case 13:
          type = H5Tcopy(H5T_C_S1);
          H5Tset_size(type, 8);
          break;
        case 14:
          type = H5Tcreate(H5T_COMPOUND, 8);
          H5Tinsert(type, "v", 0, H5T_NATIVE_FLOAT);
          H5Tinsert(type, "w", 4, H5T_NATIVE_FLOAT);
          break;
        case 15: {
          const hsize_t n = 2;
          type = H5Tarray_create2(H5T_NATIVE_FLOAT, 1, &n);
          break;
        }
        case 16:
          type = H5Tcopy(H5T_STD_B32LE);
          break;
        case 17:
          type = H5Tenum_create(H5T_NATIVE_INT);
          {
            int a = 0;
            H5Tenum_insert(type, "A", &a);
          }
          break;
        case 18:
          type = H5Tcreate(H5T_OPAQUE, 4);
          H5Tset_tag(type, "o");
          break;
        default:  // half floats: HDF5 converts them
          type = H5Tcopy(H5T_IEEE_F32LE);
          H5Tset_fields(type, 15, 10, 5, 0, 10);
          H5Tset_size(type, 2);
          H5Tset_ebias(type, 15);
          numeric = true;
      }
    }
    const size_t esize = H5Tget_size(type);

    // The dataspace: scalar, null, or rank 1 to 4 of meaningful or extreme extents.
    const uint8_t rc = byte() % 16;
    std::vector<hsize_t> dims;
    hid_t space;
    if (!old_dims.empty() && rc < 12) {
      // One or two axes changed (or one more or one fewer).
      dims = old_dims;
      if (rc == 10) dims.push_back(static_cast<hsize_t>(sc_.dims[byte() % sc_.dims.size()]));
      if (rc == 11 && dims.size() > 1) dims.pop_back();
      for (int k = rc % 2 + 1; k > 0 && rc < 10; --k) {
        const int64_t v = byte() % 8 ? sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()] : int_value();
        dims[byte() % dims.size()] = static_cast<hsize_t>(std::clamp<int64_t>(v, 0, int64_t{1} << 62));
      }
      space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    } else if (rc == 14) {
      space = H5Screate(H5S_SCALAR);
    } else if (rc == 15) {
      space = H5Screate(H5S_NULL);
    } else {
      dims.resize(rc % 4 + 1);
      for (auto& d : dims) {
        const int64_t v = byte() % 8 ? sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()] : int_value();
        d = static_cast<hsize_t>(std::clamp<int64_t>(v, 0, int64_t{1} << 62));
      }
      space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    }
    // The element count, saturating.
    uint64_t n = 1;
    bool huge = false;
    for (auto d : dims) {
      if (d != 0 && n > (uint64_t{1} << 62) / d) huge = true;
      n = huge ? 0 : n * d;
    }
    if (huge) n = std::numeric_limits<uint64_t>::max();
    if (rc == 15) n = 0;

    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    const uint8_t fill = byte();
    if (fill % 4 == 1 && numeric) {
      const double fv = double_value();
      H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &fv);
    }
    constexpr uint64_t kWriteMax = 256 * 1024;  // bytes of data this edit writes at most
    const bool small = esize > 0 && n <= kWriteMax / esize;
    // Chunks of at most 64 KiB: small datasets sometimes chunked (and deflated), large ones always unless left
    // contiguous and unwritten.
    const uint8_t layout = byte() % 8;
    std::vector<hsize_t> chunk;
    if (!dims.empty() && (!small || layout < 2) && !(layout == 7 && !small)) {
      chunk.resize(dims.size());
      uint64_t cbytes = esize;
      for (size_t i = dims.size(); i-- > 0;) {
        const uint64_t room = std::max<uint64_t>(1, (64 * 1024) / cbytes);
        chunk[i] = std::max<hsize_t>(1, std::min<uint64_t>({dims[i], room, byte() % 2 ? 64u : 4096u}));
        cbytes *= chunk[i];
      }
      std::vector<hsize_t> maxdims(dims);
      bool unlimited = false;
      for (size_t i = 0; i < dims.size(); ++i)
        if (dims[i] == 0 || byte() % 8 == 0) maxdims[i] = H5S_UNLIMITED, unlimited = true;
      if (unlimited) {
        H5Sclose(space);
        space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data());
      }
      H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
      if (layout == 1) {
        H5Pset_shuffle(dcpl);
        H5Pset_deflate(dcpl, 1);
      }
    }
    if (g_trace) {
      std::string t = "  type class " + std::to_string(H5Tget_class(type)) + " size " + std::to_string(esize) + " dims";
      for (auto x : dims) t += " " + std::to_string(x);
      t += rc == 14 ? " scalar" : rc == 15 ? " null" : "";
      t += " chunk";
      for (auto x : chunk) t += " " + std::to_string(x);
      trace(t + " layout " + std::to_string(layout) + " fill " + std::to_string(fill % 4));
    }
    // Values kept elsewhere: external storage (raw bytes of another file) or a virtual dataset (another file's or
    // this one's dataset). Never written here: a write would go to that file.
    bool elsewhere = false;
    if (chunk.empty() && !dims.empty() && layout >= 5 && fill % 8 >= 6) {
      static const char* const kFiles[] = {"other.h5", "d.h5", "/etc/hostname", "/nonexistent"};
      const char* target = kFiles[byte() % count_of(kFiles)];
      elsewhere = true;
      if (fill % 8 == 6) {
        H5Pset_external(dcpl, target, 0, H5F_UNLIMITED);
      } else {
        const std::string src = pick_path(im);
        H5Pset_virtual(dcpl, space, byte() % 2 ? "." : target, src.c_str(), space);
      }
      trace(std::string("  stored in ") + target);
    }
    const hid_t d = H5Dcreate2(file, at.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);
    if (d >= 0) {
      im.paths.push_back(at);
      const uint8_t pattern = elsewhere ? 7 : byte();
      trace("  written with pattern " + std::to_string(pattern % 8));
      if (small && n > 0 && pattern % 8 != 7) {
        // The whole dataset: zeros, 0xff bytes (NaN, -1), input bytes repeated, or counting 0, 1, 2, ...
        std::string buf(n * esize, '\0');
        if (pattern % 8 == 1) {
          std::fill(buf.begin(), buf.end(), '\xff');
        } else if (pattern % 8 == 2) {
          const std::string src = f_.ConsumeBytesAsString(std::min<size_t>(f_.ConsumeIntegral<uint16_t>(), 4096));
          if (!src.empty())
            for (size_t i = 0; i < buf.size(); ++i) buf[i] = src[i % src.size()];
        }
        if (numeric && pattern % 8 >= 3) {
          std::vector<double> v(n);
          const int64_t mod = std::max<int64_t>(1, pattern % 8 == 3 ? int_value() % 4096 : 1 << 30);
          for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<double>(static_cast<int64_t>(i) % mod);
          if (pattern % 8 == 4 && n > 0) v[f_.ConsumeIntegral<uint32_t>() % n] = double_value();
          H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
        } else {
          H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
        }
      } else if (!chunk.empty() && !huge && !elsewhere && pattern % 2 == 0) {
        // Only the first chunk: the rest of a large dataset stored nowhere. (Not where the element count passes
        // 2^62: libhdf5 1.10 itself crashes writing a chunk of a dataset of 4 x 2^62 x 64 x 3.)
        uint64_t cn = 1;
        for (auto c : chunk) cn *= c;
        const hid_t fs_ = H5Dget_space(d);
        std::vector<hsize_t> start(chunk.size(), 0);
        H5Sselect_hyperslab(fs_, H5S_SELECT_SET, start.data(), nullptr, chunk.data(), nullptr);
        const hid_t ms = H5Screate_simple(static_cast<int>(chunk.size()), chunk.data(), nullptr);
        std::string buf(cn * esize, '\0');
        H5Dwrite(d, type, ms, fs_, H5P_DEFAULT, buf.data());
        H5Sclose(ms);
        H5Sclose(fs_);
      }
      H5Dclose(d);
    }
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Tclose(type);
    H5Eclear2(H5E_DEFAULT);
  }

  // ------------------------------------------------------------------ journal records
  class Out {
   public:
    template <class T> void pod(const T& v) { b_.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
    void str(const std::string& s) {
      pod<uint64_t>(s.size());
      b_.append(s);
    }
    template <class T> void vec(const std::vector<T>& v) {
      pod<uint64_t>(v.size());
      b_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    }
    void tensor(const Tensor& t) {
      vec(t.shape);
      vec(t.data);
    }
    std::string take() { return std::move(b_); }

   private:
    std::string b_;
  };

  // Which of `nbits` fields an edit changes: mostly none or one, at times two.
  uint32_t sparse_mask(int nbits) {
    const uint8_t c = byte();
    uint32_t m = 0;
    if (c >= 96) m |= 1u << (byte() % nbits);
    if (c >= 224) m |= 1u << (byte() % nbits);
    return m;
  }

  template <class T> void maybe_resize(std::vector<T>& v) {
    if (byte() % 4 == 0) v.resize(static_cast<size_t>(std::clamp<int64_t>(int_value(), 0, 5000)));
    if (!v.empty() && byte() % 4 == 0) v[f_.ConsumeIntegral<uint16_t>() % v.size()] = static_cast<T>(int_value());
  }
  void maybe_tensor(Tensor& t) {
    if (byte() % 4 == 0) t.shape = shape_value();
    if (byte() % 4 == 0) t.data.resize(static_cast<size_t>(std::clamp<int64_t>(int_value(), 0, 1 << 16)));
  }

  std::string header_payload() {
    const Dump& d = sc_.dump;
    const auto& m = d.meta;
    json j = {{"engine", m.engine},       {"engine_options", m.engine_options},
              {"engine_dtype", m.engine_dtype}, {"device", m.device},
              {"model", m.model},         {"run_options", m.run_options},
              {"tp", m.tp},               {"mode", m.mode},
              {"seed", m.seed},           {"inject", m.inject},
              {"probe_level", m.probe_level}, {"command", m.command},
              {"process_rank", m.process_rank}, {"processes", m.processes},
              {"launch_id", m.launch_id}, {"created_utc", d.created_utc},
              {"tool_version", d.tool_version}, {"git_sha", d.git_sha}};
    const uint32_t mask = sparse_mask(10);
    if (mask & 1) j["model"] = json::parse(json_text("model"), nullptr, false);
    if (mask & 2) j["run_options"] = json::parse(json_text("run_options"), nullptr, false);
    if (mask & 4)
      for (int n = byte() % 3 + 1; n > 0; --n) {
        static const char* const kKeys[] = {"tp", "process_rank", "processes", "mode", "engine_dtype",
                                            "probe_level", "seed", "engine", "launch_id"};
        j[pick(kKeys)] = json_value();
      }
    if (mask & 8) j.erase(pick(kRootAttrs));
    Out o;
    o.str(mask & 16 ? string_value() : std::string(journal::kHeaderMagic));
    o.pod<uint32_t>(mask & 32 ? static_cast<uint32_t>(int_value()) : journal::kVersion);
    o.str(mask & 64 ? f_.ConsumeRandomLengthString(128) : text(j));
    const bool inputs = d.has_inputs && !(mask & 128);
    o.pod<uint32_t>(inputs ? 1 : 0);
    if (inputs) {
      Inputs in = d.inputs;
      auto& b = in.batch;
      if (mask & 256) {
        maybe_tensor(in.x);
        maybe_resize(b.new_lens);
        maybe_resize(b.context_lens);
        maybe_resize(b.positions);
        maybe_resize(b.token_seq);
        maybe_resize(b.block_table);
        if (byte() % 4 == 0) b.max_blocks = static_cast<int>(int_value());
        if (byte() % 4 == 0) b.num_blocks = static_cast<int>(int_value());
        if (byte() % 4 == 0) in.kv_cache.resize(byte() % 4);
        for (auto& c : in.kv_cache) maybe_tensor(c);
        if (byte() % 4 == 0) in.index_cache.resize(byte() % 3);
      }
      o.tensor(in.x);
      o.vec(b.new_lens);
      o.vec(b.context_lens);
      o.vec(b.positions);
      o.vec(b.token_seq);
      o.vec(b.block_table);
      o.pod<int32_t>(b.max_blocks);
      o.pod<int32_t>(b.num_blocks);
      o.pod<uint64_t>(mask & 512 ? static_cast<uint64_t>(int_value()) : in.kv_cache.size());
      for (const auto& c : in.kv_cache) o.tensor(c);
      o.pod<uint64_t>(in.index_cache.size());
      for (const auto& c : in.index_cache) o.tensor(c);
    }
    return o.take();
  }

  std::string probe_payload(bool weight) {
    const auto& list = weight && !sc_.dump.weights.empty() ? sc_.dump.weights : sc_.dump.probes;
    const DumpProbe& p = list[f_.ConsumeIntegral<uint16_t>() % list.size()];
    int rank = static_cast<int>(byte() % p.ranks.size());
    ProbeRecord r = p.ranks[rank];
    DumpProbe q = p;
    const uint32_t mask = sparse_mask(18);
    int32_t level = static_cast<int32_t>(r.level);
    if (mask & 1) q.layer = static_cast<int>(int_value());
    if (mask & 2) rank = static_cast<int>(int_value());
    if (mask & 4) q.name = probe_name();
    if (mask & 8) q.stage = string_value();
    if (mask & 16) q.contract = string_value();
    if (mask & 32) q.shape = shape_value();
    if (mask & 64) q.order = static_cast<int>(int_value());
    if (mask & 128) q.heads_axis = static_cast<int>(int_value());
    if (mask & 256) q.rope_from = static_cast<int>(int_value());
    if (mask & 512) r.shape = shape_value();
    if (mask & 1024) r.dtype = string_value();
    if (mask & 2048) r.l2 = double_value(), r.absmax = double_value(), r.mean = double_value(), r.std = double_value();
    if (mask & 4096) r.nan = int_value(), r.inf = int_value();
    if (mask & 8192) maybe_resize(r.token_l2);
    if (mask & 16384) maybe_resize(r.head_l2);
    if (mask & 32768) maybe_resize(r.sketch);
    if (mask & 65536) level = static_cast<int32_t>(int_value());
    if (mask & 131072) maybe_tensor(r.data);
    Out o;
    o.pod<int32_t>(q.layer);
    o.pod<int32_t>(rank);
    o.str(q.name);
    o.str(q.stage);
    o.str(q.contract);
    o.vec(q.shape);
    o.pod<int32_t>(q.order);
    o.pod<int32_t>(q.heads_axis);
    o.pod<int32_t>(q.rope_from);
    o.vec(r.shape);
    o.str(r.dtype);
    o.pod<double>(r.l2);
    o.pod<double>(r.absmax);
    o.pod<double>(r.mean);
    o.pod<double>(r.std);
    o.pod<int64_t>(r.nan);
    o.pod<int64_t>(r.inf);
    o.pod<uint64_t>(r.checksum);
    o.vec(r.token_l2);
    o.vec(r.head_l2);
    o.vec(r.sketch);
    o.pod<uint32_t>(static_cast<uint32_t>(level));
    o.tensor(r.data);
    return o.take();
  }

  void journal_record() {
    static const char* const kNames[] = {"d.h5.journal", "d.h5.journal", "d.h5.journal", "d.h5.journal.tmp.999999",
                                         "d.rank0.h5.journal", "d.rank1.h5.journal"};
    const std::string jname = pick(kNames);
    std::string& j = journals_[jname];
    // A journal starts with its header (mostly).
    const uint8_t t = j.empty() && byte() % 8 ? 0 : byte() % 8;
    journal::RecordType type = journal::RecordType::RecordType_header;
    std::string payload;
    switch (t) {
      case 0:
      case 1: type = journal::RecordType::RecordType_header, payload = header_payload(); break;
      case 2:
      case 3: type = journal::RecordType::RecordType_probe, payload = probe_payload(false); break;
      case 4: type = journal::RecordType::RecordType_weight, payload = probe_payload(true); break;
      case 5: {
        type = journal::RecordType::RecordType_stage;
        Out o;
        o.pod<int32_t>(static_cast<int32_t>(int_value()));
        o.str(string_value());
        o.pod<int32_t>(static_cast<int32_t>(int_value()));
        payload = o.take();
        break;
      }
      case 6: {
        type = journal::RecordType::RecordType_finish;
        Out o;
        o.str(string_value());
        payload = o.take();
        break;
      }
      default:
        type = static_cast<journal::RecordType>(byte() % 7);
        payload = f_.ConsumeRandomLengthString(512);
    }
    // A few bytes of the payload changed under a good CRC (a decoder's input), then the frame whole or damaged.
    for (int n = byte() % 8 == 0 ? byte() % 4 + 1 : 0; n > 0 && !payload.empty(); --n)
      payload[f_.ConsumeIntegral<uint32_t>() % payload.size()] = static_cast<char>(byte());
    std::string fr = journal::frame(type, payload);
    trace("  journal " + jname + " record type " + std::to_string(static_cast<int>(type)) + ", " +
          std::to_string(payload.size()) + " bytes");
    switch (byte() % 16) {
      case 0: fr[fr.size() - 1] ^= 1; break;                                  // CRC
      case 1: fr.resize(fr.size() - 1 - byte() % std::min<size_t>(fr.size() - 1, 24)); break;  // truncated
      case 2: {  // a length beyond the file
        const uint64_t len = static_cast<uint64_t>(int_value());
        std::memcpy(fr.data() + 8, &len, 8);
        break;
      }
      case 3: fr = f_.ConsumeRandomLengthString(64); break;
      default: break;
    }
    j += fr;
  }

  FuzzedDataProvider& f_;
  const Scenario& sc_;
  std::vector<Image> images_;
  size_t cur_ = 0;
  std::map<std::string, std::string> journals_;
};

[[noreturn]] void inconsistent(const std::string& what) {
  std::fprintf(stderr, "fuzz_dump: read_dump returned a dump it should have refused: %s\n", what.c_str());
  std::abort();
}

// What a consumer does with a dump it read: the sizes that commands index with hold (a dump read is one that
// can be written again, as golden make does; the inputs' per-token vectors match x), the model and run options
// parse.
void use(const Dump& d) {
  try {
    dump_detail::check_consistent(d, d.path);
  } catch (const UsageError& e) {
    inconsistent(e.what());
  }
  if (d.has_inputs) {
    const auto& b = d.inputs.batch;
    const auto& x = d.inputs.x.shape;
    if (x.size() != 2 || x[0] != b.tokens() || b.token_seq.size() != b.positions.size())
      inconsistent("inputs x " + shape_string(x) + " for " + std::to_string(b.tokens()) + " positions, " +
                   std::to_string(b.token_seq.size()) + " token sequences");
  }
  for (const auto* list : {&d.probes, &d.weights})
    for (const auto& p : *list) {
      if (p.ranks.empty() || static_cast<int>(p.ranks.size()) > std::max(d.meta.tp, 1))
        inconsistent(p.name + " holds " + std::to_string(p.ranks.size()) + " ranks at tp " +
                     std::to_string(d.meta.tp));
      for (const auto& r : p.ranks)
        if (!r.data.empty() && r.data.shape != r.shape)
          inconsistent(p.name + " data " + shape_string(r.data.shape) + " in a record of " + shape_string(r.shape));
    }
  try {
    if (!d.meta.model.is_null()) (void)d.config();
  } catch (const std::exception&) {
  }
  try {
    if (!d.meta.run_options.is_null()) (void)d.spec();
  } catch (const std::exception&) {
  }
  try {
    require_every_rank(d, "fuzz");
  } catch (const std::exception&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static std::ostringstream sink;  // the reader's notices (config_from_json) are not wanted here
  std::cerr.rdbuf(sink.rdbuf());
  H5open();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  g_trace = std::getenv("MLA_FUZZ_DUMP_TRACE") != nullptr;
  // The files live in /dev/shm where there is one (no disk traffic per input), else in the temporary directory.
  std::string base = "/dev/shm";
  if (::access(base.c_str(), W_OK) != 0) base = fs::temp_directory_path().string();
  std::string tmpl = base + "/mla-fuzz-dump.XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    std::perror("fuzz_dump: mkdtemp");
    std::abort();
  }
  g_dir = tmpl;
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(g_dir, ec);
  });
  make_scenarios();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const Scenario& sc = g_scenarios[fdp.ConsumeIntegral<uint8_t>() % g_scenarios.size()];
  const uint8_t how = fdp.ConsumeIntegral<uint8_t>();
  clear_dir();
  {
    Builder b(fdp, sc);
    b.run(48);
    b.write_files();
  }
  const std::string path = g_dir + "/d.h5";
  // Read as compare does (everything), as inspect does (no full tensors), or with parts left out; then again (a
  // journal is folded into the file by the first read).
  for (int pass = 0; pass < 2; ++pass) {
    DumpReadOptions o;
    // Mostly everything (compare), else without full tensors (inspect), without inputs or without probes.
    const uint8_t bits = (pass == 0 ? how : static_cast<uint8_t>(how >> 3)) % 8;
    o.data = bits != 5;
    o.inputs = bits != 6;
    o.probes = bits != 7;
    try {
      const Dump d = read_dump(path, o);
      trace("read: status " + d.status);
      use(d);
    } catch (const std::exception& e) {
      trace(std::string("read: ") + e.what());
    }
    if (pass == 0 && !(how & 0x40)) break;
  }
  H5Eclear2(H5E_DEFAULT);
  return 0;
}
