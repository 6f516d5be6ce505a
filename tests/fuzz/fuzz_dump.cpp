// libFuzzer target: the dump reader (read_dump: probes/dump_read.cpp, dump_records.cpp, dump_check.cpp,
// dump_journal.cpp, dump_ranks.cpp, h5.cpp, journal.cpp), structure-aware. libhdf5's own parser of the file's bytes
// is not what this fuzzes (it is a system library with crashes of its own on corrupt bytes): the input is an edit
// script that HDF5 itself applies to a valid dump, so every file the reader sees is a well-formed HDF5 file whose
// content is hostile.
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
// The edits are a Builder's (tests/fuzz/dump_edits/, a file per kind of edit: builder.h lists them).
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
#include "tests/fuzz/dump_edits/builder.h"

namespace fuzz_dump {

// MLA_FUZZ_DUMP_TRACE=1: every edit printed to stderr (reproducing a finding: which file made it).
bool g_trace = false;
void trace(const std::string& s) {
  if (g_trace) std::fprintf(stderr, "fuzz_dump: %s\n", s.c_str());
}

std::string g_dir;  // the work dir: a fresh set of files per input
std::vector<std::string> g_probe_names, g_stage_names;

void spit(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

namespace {

// ---------------------------------------------------------------------------------------------------
// Scenarios: valid dumps written once by the library's own writer
// ---------------------------------------------------------------------------------------------------

std::vector<Scenario> g_scenarios;

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
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

}  // namespace fuzz_dump

using namespace fuzz_dump;

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
