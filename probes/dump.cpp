// Dumps: the journal-backed writer, folding a journal into HDF5 (at finish or on recovery), and the
// HDF5 reader and writer of schema_versions 1 and 2 (docs/dump-format.md: the layout and what the reader refuses).
#include "probes/dump.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include "harness/model/errors.h"
#include "probes/h5.h"
#include "probes/journal.h"
#include "probes/probe_hash.h"

namespace mla {

using nlohmann::json;

namespace {

constexpr const char* kFormat = "mla-bisect-dump";
// 2 = 1 plus the optional /weights group. A dump without weights is written as 1, so older readers still read it.
constexpr int kSchemaVersion = 2;

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// ---------------------------------------------------------------------------------------------------
// Folding a journal into a Dump
// ---------------------------------------------------------------------------------------------------

enum class FoldMode { FoldMode_finish, FoldMode_recover, FoldMode_live };

// Builds the Dump from the intact records of a journal. finish: the status is the writer's; recover: the
// finish record's status if the run got that far, else "stopped: after <the last probe committed>";
// live: "running: ...". A journal whose header is unreadable cannot be folded: UsageError.
Dump fold(const journal::Scan& sc, const std::string& dump_path, const std::string& jpath, FoldMode mode,
          const std::string& finish_status = "") {
  if (sc.records.empty() || sc.records.front().type != journal::RecordType::RecordType_header)
    throw UsageError(jpath + ": the journal has no intact header record (" +
                     (sc.problem.empty() ? std::string("empty file") : sc.problem) +
                     "); nothing can be recovered from it. It is left in place; delete it to read or rewrite " +
                     dump_path);
  journal::Header h;
  try {
    h = journal::decode_header(sc.records.front().payload);
  } catch (const journal::FormatError& e) {
    throw UsageError(jpath + ": unreadable journal header: " + e.what());
  }
  Dump d;
  d.path = dump_path;
  d.meta = std::move(h.meta);
  d.created_utc = h.created_utc;
  d.tool_version = h.tool_version;
  d.git_sha = h.git_sha;
  d.has_inputs = h.has_inputs;
  d.inputs = std::move(h.inputs);

  // A one-rank dump (one process per rank) holds its rank's records at index 0; other ranks are not its business.
  const int own = d.meta.process_rank;
  if (own >= d.meta.tp)
    throw UsageError(jpath + ": the journal's header says rank " + std::to_string(own) + " of tp " +
                     std::to_string(d.meta.tp));
  std::map<std::pair<int, std::string>, size_t> index, weight_index;
  std::vector<std::string> last_stage(std::max(d.meta.tp, 1), own >= 0 ? "" : "not started");
  if (own >= 0) last_stage[own] = "not started";
  std::string last_probe, finished_status, problem = sc.problem;
  bool finished = false;
  uint64_t good = sc.good_bytes;
  for (size_t i = 1; i < sc.records.size(); ++i) {
    const auto& r = sc.records[i];
    try {
      switch (r.type) {
        case journal::RecordType::RecordType_header: throw journal::FormatError("a second header record");
        case journal::RecordType::RecordType_probe:
        case journal::RecordType::RecordType_weight: {
          auto e = journal::decode_probe(r.payload);
          const bool weight = r.type == journal::RecordType::RecordType_weight;
          auto& list = weight ? d.weights : d.probes;
          auto& idx = weight ? weight_index : index;
          const auto key = std::make_pair(e.probe.layer, e.probe.name);
          auto it = idx.find(key);
          if (it == idx.end()) {
            it = idx.emplace(key, list.size()).first;
            list.push_back(e.probe);
          }
          auto& ranks = list[it->second].ranks;
          if (own >= 0 && e.rank != own)
            throw journal::FormatError("probe " + e.probe.name + " rank " + std::to_string(e.rank) +
                                       " in the journal of rank " + std::to_string(own) + "'s process");
          const int slot = own >= 0 ? 0 : e.rank;
          if (slot < static_cast<int>(ranks.size())) {
            ranks[slot] = std::move(e.rec);  // recorded again (a re-run stage): the later one wins
          } else if (slot == static_cast<int>(ranks.size())) {
            ranks.push_back(std::move(e.rec));
          } else {
            throw journal::FormatError("probe " + e.probe.name + " rank " + std::to_string(e.rank) +
                                       " recorded before rank " + std::to_string(ranks.size()));
          }
          if (!weight)
            last_probe = "layer " + std::to_string(e.probe.layer) + " probe " + e.probe.name + " rank " +
                         std::to_string(e.rank);
          break;
        }
        case journal::RecordType::RecordType_stage: {
          const auto e = journal::decode_stage(r.payload);
          if (e.rank >= static_cast<int>(last_stage.size())) last_stage.resize(e.rank + 1, "not started");
          last_stage[e.rank] = "layer " + std::to_string(e.layer) + " stage " + e.stage;
          break;
        }
        case journal::RecordType::RecordType_finish:
          finished_status = journal::decode_finish(r.payload);
          finished = true;
          break;
      }
    } catch (const journal::FormatError& e) {
      problem = std::string("record at byte ") + std::to_string(r.offset) + ": " + e.what();
      good = r.offset;
      break;
    }
  }
  for (auto* list : {&d.probes, &d.weights})
    std::stable_sort(list->begin(), list->end(), [](const DumpProbe& a, const DumpProbe& b) {
      return a.layer != b.layer ? a.layer < b.layer : a.order < b.order;
    });
  d.last_stage = std::move(last_stage);

  // `run --out` journals its setup (run_options "setup": what it does) before the slow part, then starts the
  // journal again with the inputs: a journal still marked so stopped during setup.
  const bool in_setup = last_probe.empty() && d.meta.run_options.is_object() &&
                        d.meta.run_options.contains("setup") && d.meta.run_options["setup"].is_string();
  const std::string where = in_setup ? "during setup (" + d.meta.run_options["setup"].get<std::string>() +
                                           "), before the first stage"
                            : last_probe.empty() ? "before the first probe"
                                                 : "after " + last_probe;
  const uint64_t dropped = sc.total_bytes - good;
  const std::string note = dropped > 0 ? " (journal: " + std::to_string(dropped) + " bytes from byte " +
                                             std::to_string(good) + " dropped: " + problem + ")"
                                       : "";
  switch (mode) {
    case FoldMode::FoldMode_finish:
      if (dropped > 0) throw UsageError(jpath + ": the journal was damaged while the run wrote it: " + problem);
      d.status = finish_status;
      break;
    case FoldMode::FoldMode_recover: d.status = finished ? finished_status : "stopped: " + where + note; break;
    case FoldMode::FoldMode_live: d.status = "running: " + where; break;
  }
  return d;
}

// Removes X.h5.tmp.PID files whose writer is gone (killed while writing the HDF5 file).
void remove_stale_temps(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".tmp.";
  std::error_code ec;
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::strtol(pid_text.c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
  }
}

enum class JournalState { JournalState_none, JournalState_folded, JournalState_live, JournalState_unwritable };

// Folds FILE.h5.journal into FILE.h5 unless its writer is alive; then, with `snapshot`, reads it as it stands.
// Where FILE.h5 cannot be written (a read-only directory), `snapshot` gets the fold and the journal stays.
JournalState fold_journal(const std::string& path, Dump* snapshot) {
  const std::string jpath = journal::journal_path(path);
  Fd fd(::open(jpath.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return JournalState::JournalState_none;
    throw UsageError(jpath + ": cannot open the dump journal: " + std::strerror(errno));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) throw UsageError(jpath + ": cannot lock the dump journal: " + std::strerror(errno));
    if (snapshot) {
      const journal::Scan sc = journal::scan(fd.get(), jpath);
      if (sc.records.empty())
        throw UsageError(path + ": the run writing this dump is alive and has not written its journal header yet");
      *snapshot = fold(sc, path, jpath, FoldMode::FoldMode_live);
    }
    return JournalState::JournalState_live;
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || st.st_nlink == 0) return JournalState::JournalState_none;  // folded meanwhile
  Dump d = fold(journal::scan(fd.get(), jpath), path, jpath, FoldMode::FoldMode_recover);
  try {
    write_dump_h5(d, path);
  } catch (const UsageError&) {
    if (!snapshot) throw;
    *snapshot = std::move(d);
    return JournalState::JournalState_unwritable;
  }
  ::unlink(jpath.c_str());
  journal::sync_dir(jpath);
  remove_stale_temps(path);
  return JournalState::JournalState_folded;
}

// ---------------------------------------------------------------------------------------------------
// HDF5 writing
// ---------------------------------------------------------------------------------------------------

void write_inputs(h5::Group& root, const Inputs& in) {
  h5::Group g = root.create_group("inputs");
  const auto& b = in.batch;
  const int64_t B = b.num_seqs();
  g.write<float>("x", in.x.shape, in.x.data);
  g.write<int32_t>("positions", {static_cast<int64_t>(b.positions.size())}, b.positions);
  g.write<int32_t>("seq_lens", {B}, b.new_lens);
  g.write<int32_t>("context_lens", {B}, b.context_lens);
  g.write<int32_t>("block_table", {B, b.max_blocks}, b.block_table);
  g.set_attr("num_blocks", static_cast<int64_t>(b.num_blocks));
  if (!in.kv_cache.empty()) {
    // [layers, blocks, 64, L+R]: one dataset so h5py slices it per layer.
    const auto& s0 = in.kv_cache.front().shape;
    std::vector<int64_t> shape = {static_cast<int64_t>(in.kv_cache.size())};
    shape.insert(shape.end(), s0.begin(), s0.end());
    std::vector<float> all;
    all.reserve(static_cast<size_t>(shape_numel(shape)));
    for (const auto& c : in.kv_cache) {
      if (c.shape != s0) throw UsageError("dump inputs: kv caches of different shapes per layer");
      all.insert(all.end(), c.data.begin(), c.data.end());
    }
    g.write<float>("kv_cache", shape, all);
  }
}

void write_probe(h5::Group& layer, const DumpProbe& p, const Dump& d) {
  h5::Group g = layer.create_group(p.name);
  g.set_attr("order", static_cast<int64_t>(p.order));
  g.set_attr("stage", p.stage);
  g.set_attr("contract", p.contract);
  g.set_attr("shape", p.shape);
  g.set_attr("engine_dtype", p.engine_dtype);
  g.set_attr("heads_axis", static_cast<int64_t>(p.heads_axis));
  g.set_attr("rope_from", static_cast<int64_t>(p.rope_from));
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const ProbeRecord& rec = p.ranks[r];
    // Rows of this rank's record: the tokens, or a weight's rows (a rows-sharded weight: its block).
    const int64_t T = !rec.shape.empty() ? rec.shape[0] : p.shape.empty() ? 0 : p.shape[0];
    h5::Group rg = g.create_group("rank" + std::to_string(d.rank_of(r)));
    rg.set_attr("l2", rec.l2);
    rg.set_attr("absmax", rec.absmax);
    rg.set_attr("mean", rec.mean);
    rg.set_attr("std", rec.std);
    rg.set_attr("nan", rec.nan);
    rg.set_attr("inf", rec.inf);
    rg.set_attr("checksum", rec.checksum);
    rg.set_attr("level", probe_level_name(rec.level));
    rg.set_attr("shape", rec.shape);
    rg.set_attr("dtype", rec.dtype);
    const auto check = [&](const std::vector<float>& v, int64_t cols, const char* what) {
      if (T <= 0 || static_cast<int64_t>(v.size()) != T * cols)
        throw UsageError(rg.where() + ": " + what + " holds " + std::to_string(v.size()) + " values, expected " +
                         std::to_string(T) + " x " + std::to_string(cols));
    };
    if (!rec.token_l2.empty()) {
      check(rec.token_l2, 1, "token_l2");
      rg.write<float>("token_l2", {T}, rec.token_l2);
    }
    if (!rec.head_l2.empty()) {
      const int64_t heads = T > 0 ? static_cast<int64_t>(rec.head_l2.size()) / T : 0;
      check(rec.head_l2, heads, "head_l2");
      rg.write<float>("head_l2", {T, heads}, rec.head_l2);
    }
    if (!rec.sketch.empty()) {
      check(rec.sketch, kSketchDim, "sketch");
      rg.write<float>("sketch", {T, kSketchDim}, rec.sketch);
    }
    if (!rec.data.empty()) rg.write<float>("data", rec.data.shape, rec.data.data);
  }
}

void write_file(h5::File& f, const Dump& d) {
  const auto& m = d.meta;
  f.set_attr("format", kFormat);
  f.set_attr("schema_version", static_cast<int64_t>(d.weights.empty() ? 1 : kSchemaVersion));
  f.set_attr("tool_version", d.tool_version.empty() ? std::string(MLA_VERSION) : d.tool_version);
  f.set_attr("git_sha", d.git_sha.empty() ? std::string(MLA_GIT_SHA) : d.git_sha);
  f.set_attr("created_utc", d.created_utc.empty() ? utc_now() : d.created_utc);
  f.set_attr("engine", m.engine);
  f.set_attr("engine_options", m.engine_options);
  f.set_attr("engine_dtype", m.engine_dtype);
  f.set_attr("device", m.device);
  f.set_attr("model", m.model.is_null() ? std::string("null") : m.model.dump());
  f.set_attr("run_options", m.run_options.is_null() ? std::string("null") : m.run_options.dump());
  f.set_attr("tp", static_cast<int64_t>(m.tp));
  f.set_attr("mode", m.mode);
  f.set_attr("seed", m.seed);
  f.set_attr("inject", m.inject);
  f.set_attr("probe_level", m.probe_level);
  f.set_attr("command", m.command);
  if (m.processes > 0) {  // one process per rank; absent from one process's dumps (schema_version 1 as before)
    f.set_attr("process_rank", static_cast<int64_t>(m.process_rank));
    f.set_attr("processes", static_cast<int64_t>(m.processes));
    f.set_attr("launch_id", m.launch_id);
  }
  f.set_attr("status", d.status);
  f.set_attr("last_stage", json(d.last_stage).dump());
  if (d.has_inputs) write_inputs(f, d.inputs);
  std::map<int, h5::Group> layers;
  for (const auto& p : d.probes) {
    auto it = layers.find(p.layer);
    if (it == layers.end()) it = layers.emplace(p.layer, f.create_group("layer" + std::to_string(p.layer))).first;
    write_probe(it->second, p, d);
  }
  if (!d.weights.empty()) {
    h5::Group wg = f.create_group("weights");
    std::map<int, h5::Group> wl;
    for (const auto& p : d.weights) {
      auto it = wl.find(p.layer);
      if (it == wl.end()) it = wl.emplace(p.layer, wg.create_group("layer" + std::to_string(p.layer))).first;
      write_probe(it->second, p, d);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// HDF5 reading. Dumps come from other programs too (h5py, the Python package): everything docs/dump-format.md
// calls invalid is a UsageError naming the file and the object inside it ("x.h5:/layer0/q_c/rank0: ...").
// ---------------------------------------------------------------------------------------------------

// The root's engine_dtype: the activations' precision, which tolerances are calibrated for.
constexpr const char* kEngineDtypes = "fp32|bf16|fp16";
// A record's dtype (and its probe's engine_dtype): the format the producer held the tensor in, whose bit patterns
// the checksum covers. fp8 records come from captures of engines that keep some activations in fp8.
constexpr const char* kRecordDtypes = "fp32|bf16|fp16|fp8_e4m3|fp8_e5m2";

// "" (not given) or one of `allowed` ("a|b|c").
void check_dtype(const std::string& where, const char* attr, const std::string& v, const char* allowed) {
  if (v.empty()) return;
  const std::string all = std::string("|") + allowed + "|";
  if (v.find('|') == std::string::npos && all.find("|" + v + "|") != std::string::npos) return;
  throw UsageError(where + ": " + attr + " '" + v + "' is not one of " + allowed);
}

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

// The checksum of an fp8 record (its data as float32 values, which fp8 holds exactly): the 8-bit codes in place of
// compute_probe_record's 16/32-bit patterns; NaN counts as sign|0x7f (e4m3) or sign|0x7e (e5m2).
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

json json_attr(const h5::Object& o, const std::string& name) {
  if (!o.has_attr(name)) return nullptr;
  const std::string text = o.attr_string(name);
  try {
    check_json_nesting(text, o.where() + ": attribute '" + name + "'");
    return json::parse(text);
  } catch (const json::exception& e) {
    throw UsageError(o.where() + ": attribute '" + name + "' is not valid JSON: " + e.what());
  }
}

// config_from_json prints notices (an unknown model_type, DSA's index_topk) for the commands that use a model;
// reading a dump only checks it, so they are held back meanwhile. Dumps are read before a run starts its threads.
class QuietStderr {
 public:
  QuietStderr() : saved_(std::cerr.rdbuf(nullptr)) {}
  ~QuietStderr() { std::cerr.rdbuf(saved_); }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

 private:
  std::streambuf* saved_;
};

// The probes a dump may hold and what each must look like, from as much of the graph as the dump pins down: its
// model and run options (one graph: every attribute exact), its model alone (every graph of that model: shapes
// but the token axis, rope_from; stages of either form), or neither (the names, contracts, heads axes, stages and
// ranks of every graph of every model).
struct ProbeTable {
  std::string basis;   // "the graph of the dump's model and run options (...)" for messages
  bool exact = false;  // one graph: shapes with the token axis, and orders
  bool dims = false;   // the model's dimensions: shapes but the token axis, rope_from
  std::map<std::string, std::vector<ProbeSpec>> by_name;
  std::string names;   // "x, q_a, ..." in graph order, for messages
  bool weights = false;  // the table of layer weights (build_weights), not of probes
};

ProbeTable make_probe_table(const MlaConfig* cfg, const RunSpec* spec, bool weights = false) {
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

const ProbeTable& every_probe(bool weights = false) {
  static const ProbeTable t = make_probe_table(nullptr, nullptr), tw = make_probe_table(nullptr, nullptr, true);
  return weights ? tw : t;
}

// The probe's attributes against the table's expectations for its name.
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

void read_inputs(const h5::Group& root, Dump& d, const MlaConfig* cfg, const RunSpec* spec) {
  const h5::Group g = root.open_group("inputs");
  const std::string& w = g.where();
  for (const auto& c : g.children()) {
    static const char* kNames[] = {"x", "positions", "seq_lens", "context_lens", "block_table", "kv_cache"};
    if (std::find_if(std::begin(kNames), std::end(kNames), [&](const char* n) { return c == n; }) == std::end(kNames))
      throw UsageError(w + "/" + c + ": not part of /inputs (x, positions, seq_lens, context_lens, block_table, "
                       "kv_cache)");
  }
  Inputs& in = d.inputs;
  auto& b = in.batch;
  std::vector<int64_t> xs;
  in.x.data = g.read<float>("x", {-1, -1}, &xs);
  in.x.shape = xs;
  const int64_t T = xs[0];
  if (T <= 0 || xs[1] <= 0) throw UsageError(w + "/x: empty [" + std::to_string(T) + "," + std::to_string(xs[1]) + "]");
  if (cfg && xs[1] != cfg->hidden)
    throw UsageError(w + "/x: shape " + shape_string(xs) + ", but the dump's model has hidden_size " +
                     std::to_string(cfg->hidden));
  if (spec && T != spec->graph_shape().tokens)
    throw UsageError(w + "/x: shape " + shape_string(xs) + " holds " + std::to_string(T) +
                     " tokens, the run options " + std::to_string(spec->graph_shape().tokens) + " (tokens " +
                     std::to_string(spec->tokens) + " x batch " + std::to_string(spec->batch) + ")");
  b.positions = g.read<int32_t>("positions", {T});
  std::vector<int64_t> ss;
  b.new_lens = g.read<int32_t>("seq_lens", {-1}, &ss);
  const int64_t B = ss[0];
  if (B <= 0) throw UsageError(w + "/seq_lens: empty (one entry per sequence)");
  b.context_lens = g.read<int32_t>("context_lens", {B});
  std::vector<int64_t> bs;
  b.block_table = g.read<int32_t>("block_table", {B, -1}, &bs);
  b.max_blocks = static_cast<int>(bs[1]);
  const int64_t nb = g.attr_int("num_blocks");
  if (nb <= 0 || nb > (int64_t{1} << 30))
    throw UsageError(w + ": num_blocks " + std::to_string(nb) + " is out of range");
  b.num_blocks = static_cast<int>(nb);

  // Everything an engine indexes with must be in range: a bad dump is a usage error, never a wild read.
  int64_t total = 0;
  bool any_context = false;
  for (int64_t s = 0; s < B; ++s) {
    if (b.new_lens[s] <= 0) throw UsageError(w + "/seq_lens: sequence " + std::to_string(s) + " has no new tokens");
    if (b.context_lens[s] < 0) throw UsageError(w + "/context_lens: negative for sequence " + std::to_string(s));
    any_context = any_context || b.context_lens[s] > 0;
    const int64_t pages = (static_cast<int64_t>(b.context_lens[s]) + b.new_lens[s] + kPageSize - 1) / kPageSize;
    if (pages > b.max_blocks)
      throw UsageError(w + "/block_table: sequence " + std::to_string(s) + " needs " + std::to_string(pages) +
                       " pages, the table has " + std::to_string(b.max_blocks) + " columns");
    for (int i = 0; i < b.new_lens[s]; ++i) b.token_seq.push_back(static_cast<int>(s));
    total += b.new_lens[s];
  }
  if (total != T)
    throw UsageError(w + ": seq_lens add up to " + std::to_string(total) + " tokens, x has " + std::to_string(T));
  for (int v : b.block_table)
    if (v < 0 || v >= b.num_blocks)
      throw UsageError(w + "/block_table: page id " + std::to_string(v) + " outside [0, " + std::to_string(nb) + ")");
  for (int64_t t = 0; t < T; ++t)
    if (b.positions[t] < 0 || b.positions[t] >= static_cast<int64_t>(b.max_blocks) * kPageSize)
      throw UsageError(w + "/positions: token " + std::to_string(t) + " at position " +
                       std::to_string(b.positions[t]) + " is outside the block table");

  if (g.has("kv_cache")) {
    std::vector<int64_t> cs;
    const auto all = g.read<float>("kv_cache", {-1, nb, kPageSize, -1}, &cs);
    if (cs[0] <= 0 || cs[3] <= 0) throw UsageError(w + "/kv_cache: empty " + shape_string(cs));
    if (cfg && cs[3] != cfg->cache_row())
      throw UsageError(w + "/kv_cache: shape " + shape_string(cs) + ", but the dump's model caches rows of " +
                       "kv_lora_rank + qk_rope_head_dim = " + std::to_string(cfg->cache_row()));
    if (spec && cs[0] != spec->layers)
      throw UsageError(w + "/kv_cache: shape " + shape_string(cs) + " holds " + std::to_string(cs[0]) +
                       " layers, the run options " + std::to_string(spec->layers));
    const int64_t per = nb * kPageSize * cs[3];
    for (int64_t l = 0; l < cs[0]; ++l) {
      Tensor c;
      c.shape = {nb, kPageSize, cs[3]};
      c.data.assign(all.begin() + l * per, all.begin() + (l + 1) * per);
      in.kv_cache.push_back(std::move(c));
    }
  } else if (any_context) {
    throw UsageError(w + ": missing dataset 'kv_cache': context_lens has cached tokens, and the cache rows they "
                     "are attended from are not given");
  } else if (cfg) {
    // Nothing cached: an empty cache per layer, so every engine finds the pages its cache_write stage fills.
    in.kv_cache.assign(spec ? spec->layers : 1, Tensor({nb, kPageSize, cfg->cache_row()}));
  }
  d.has_inputs = true;
}

std::vector<int64_t> local_probe_shape(const DumpProbe& p, int tp) {
  auto s = p.shape;
  if (p.contract == "heads") s[p.heads_axis] /= tp;
  if (p.contract == "rows") s[0] /= tp;
  if (p.contract == "columns" && s.size() > 1) s[1] /= tp;
  return s;
}

// What read_probe needs of the dump around a probe.
struct ProbeContext {
  int tp = 1;
  int own = -1;           // the rank a one-rank dump holds (its only rank group), -1 for every rank
  bool complete = false;  // status "complete": every rank of every probe is there
  const ProbeTable* table = nullptr;
  const DumpReadOptions* opts = nullptr;
  bool weights = false;    // reading /weights: contracts replicated, rows, columns; rows are not tokens
  int64_t tokens = -1;     // T of every probe: /inputs/x's, else the first probe's (-1: not known yet)
  std::string tokens_from;  // where that T comes from, for messages
};

// A group name as write_probe writes it: rank{r}, no sign or leading zeros, r < 10^6.
bool parse_rank_name(const std::string& c, int* rank) {
  if (c.rfind("rank", 0) != 0 || c.size() == 4 || c.size() > 10) return false;
  if (c.find_first_not_of("0123456789", 4) != std::string::npos || (c[4] == '0' && c.size() > 5)) return false;
  *rank = std::stoi(c.substr(4));
  return true;
}

// One rank's record. Without `data` the statistics and token_l2 are required; with it, any of them missing is
// computed from it as the C++ writer computes them (compute_probe_record).
ProbeRecord read_rank(const h5::Group& rg, const DumpProbe& p, int rank, const ProbeContext& ctx) {
  const std::string& w = rg.where();
  for (const auto& c : rg.children()) {
    if (c != "token_l2" && c != "head_l2" && c != "sketch" && c != "data")
      throw UsageError(w + "/" + c + ": not part of a rank's record (token_l2, head_l2, sketch, data)");
    if (!rg.has_dataset(c)) throw UsageError(w + "/" + c + ": is not a dataset");
  }
  const auto local = local_probe_shape(p, ctx.tp);
  const int64_t T = local[0];  // tokens, or this rank's rows of a weight
  ProbeRecord rec;
  rec.shape = rg.has_attr("shape") ? rg.attr_ints("shape") : local;
  if (rec.shape != local)
    throw UsageError(w + ": shape " + shape_string(rec.shape) + ", expected " + shape_string(local) + " (" +
                     p.contract + " probe " + shape_string(p.shape) + " at tp " + std::to_string(ctx.tp) + ")");
  rec.dtype = rg.attr_string_or("dtype", p.engine_dtype);
  check_dtype(w, "dtype", rec.dtype, kRecordDtypes);
  const bool has_data = rg.has("data"), has_sketch = rg.has("sketch");
  if (has_data) {
    const auto ds = rg.open_dataset("data").shape();
    if (ds != local)
      throw UsageError(w + "/data: shape " + shape_string(ds) + ", expected " + shape_string(local) + " (the rank's " +
                       "shape: " + p.contract + " probe " + shape_string(p.shape) + " at tp " + std::to_string(ctx.tp) +
                       ")");
  }
  const std::string level = rg.attr_string_or("level", has_data ? "full" : has_sketch ? "sketch" : "stats");
  try {
    rec.level = parse_probe_level(level);
  } catch (const UsageError&) {
    throw UsageError(w + ": level '" + level + "' (expected stats, sketch or full)");
  }
  if (rec.level == ProbeLevel::ProbeLevel_full && !has_data)
    throw UsageError(w + ": level 'full' without a 'data' dataset");
  if (rec.level != ProbeLevel::ProbeLevel_full && has_data)
    throw UsageError(w + ": a 'data' dataset at level '" + level + "' (a record with its tensor is level full)");
  if (rg.has("token_l2")) rec.token_l2 = rg.read<float>("token_l2", {T});
  if (rg.has("head_l2")) {
    if (p.heads_axis < 0) throw UsageError(w + ": head_l2 on a probe without a heads axis");
    rec.head_l2 = rg.read<float>("head_l2", {T, local[p.heads_axis]});
  }
  if (has_sketch) rec.sketch = rg.read<float>("sketch", {T, kSketchDim});

  static const char* const kStats[] = {"l2", "absmax", "mean", "std", "nan", "inf", "checksum"};
  bool incomplete = rec.token_l2.empty() || (p.heads_axis >= 0 && rec.head_l2.empty()) || rec.sketch.empty();
  for (const char* a : kStats) incomplete = incomplete || !rg.has_attr(a);
  Tensor data;
  if (has_data && (ctx.opts->data || incomplete)) {
    data.data = rg.read<float>("data", local);
    data.shape = local;
  }
  ProbeRecord computed;
  if (has_data && incomplete) {
    ProbeRequest req;
    req.level = ProbeLevel::ProbeLevel_full;
    req.tokens = T;
    req.heads = p.heads_axis >= 0 ? local[p.heads_axis] : 0;
    req.col_offset = p.contract == "heads" || p.contract == "columns"
                         ? static_cast<int64_t>(rank) * (shape_numel(local) / T)
                         : 0;
    req.probe_key = probe_key(p.name);
    computed = compute_probe_record(data, rec.dtype, req);
    if (rec.dtype.rfind("fp8_", 0) == 0 && !rg.has_attr("checksum"))
      computed.checksum = fp8_checksum(data, T, rec.dtype, w);
  }
  // Without data a missing statistic is an error (the attribute readers name it); with data it is computed.
  const auto number = [&](const char* a, double computed_value) {
    return has_data && !rg.has_attr(a) ? computed_value : rg.attr_double(a);
  };
  const auto count = [&](const char* a, int64_t computed_value) {
    return has_data && !rg.has_attr(a) ? computed_value : rg.attr_int(a);
  };
  rec.l2 = number("l2", computed.l2);
  rec.absmax = number("absmax", computed.absmax);
  rec.mean = number("mean", computed.mean);
  rec.std = number("std", computed.std);
  rec.nan = count("nan", computed.nan);
  rec.inf = count("inf", computed.inf);
  const int64_t numel = shape_numel(local);
  if (rec.nan < 0 || rec.inf < 0 || rec.nan + rec.inf > numel)
    throw UsageError(w + ": nan " + std::to_string(rec.nan) + " and inf " + std::to_string(rec.inf) +
                     " do not fit the rank's " + std::to_string(numel) + " values");
  rec.checksum = rg.has_attr("checksum") ? rg.attr_uint("checksum") : computed.checksum;
  if (!has_data && rec.token_l2.empty())
    throw UsageError(w + ": missing dataset 'token_l2' (required when the record has no 'data')");
  if (rec.token_l2.empty()) rec.token_l2 = computed.token_l2;
  if (rec.head_l2.empty()) rec.head_l2 = computed.head_l2;
  if (rec.sketch.empty()) rec.sketch = computed.sketch;
  if (ctx.opts->data) rec.data = std::move(data);
  return rec;
}

DumpProbe read_probe(const h5::Group& g, int layer, const std::string& name, const ProbeContext& ctx) {
  const std::string& w = g.where();
  const int tp = ctx.tp;
  DumpProbe p;
  p.layer = layer;
  p.name = name;
  p.stage = g.attr_string("stage");
  p.contract = g.attr_string("contract");
  p.shape = g.attr_ints("shape");
  const int64_t order = g.attr_int("order");
  p.engine_dtype = g.attr_string_or("engine_dtype", "");
  const int64_t heads_axis = g.attr_int_or("heads_axis", -1), rope_from = g.attr_int_or("rope_from", -1);
  if (!ctx.weights && p.contract != "replicated" && p.contract != "heads" && p.contract != "partial")
    throw UsageError(w + ": contract '" + p.contract + "' (expected replicated, heads or partial)");
  if (ctx.weights && p.contract != "replicated" && p.contract != "rows" && p.contract != "columns")
    throw UsageError(w + ": contract '" + p.contract + "' (a weight's is replicated, rows or columns)");
  if (ctx.weights && p.shape.size() == 2 && p.shape[p.contract == "columns" ? 1 : 0] % tp != 0 &&
      p.contract != "replicated")
    throw UsageError(w + ": " + p.contract + " " + shape_string(p.shape) + " do not divide over tp " +
                     std::to_string(tp));
  try {
    parse_stage(p.stage);
  } catch (const UsageError&) {
    throw UsageError(w + ": stage '" + p.stage + "' is not a stage name");
  }
  check_dtype(w, "engine_dtype", p.engine_dtype, kRecordDtypes);
  if (order < 0 || order > 1000) throw UsageError(w + ": order " + std::to_string(order) + " is out of range");
  p.order = static_cast<int>(order);
  if (p.shape.empty()) throw UsageError(w + ": empty shape");
  for (int64_t s : p.shape)
    if (s <= 0 || s > (int64_t{1} << 40)) throw UsageError(w + ": shape " + shape_string(p.shape) + " is not valid");
  if (heads_axis < -1 || heads_axis >= static_cast<int64_t>(p.shape.size()))
    throw UsageError(w + ": heads_axis " + std::to_string(heads_axis) + " outside shape " + shape_string(p.shape));
  p.heads_axis = static_cast<int>(heads_axis);
  if (rope_from < -1 || rope_from >= p.shape.back())
    throw UsageError(w + ": rope_from " + std::to_string(rope_from) + " outside the last axis of shape " +
                     shape_string(p.shape));
  p.rope_from = static_cast<int>(rope_from);
  if (p.contract == "heads") {
    if (p.heads_axis < 0) throw UsageError(w + ": contract heads without a heads_axis");
    if (p.shape[p.heads_axis] % tp != 0)
      throw UsageError(w + ": " + std::to_string(p.shape[p.heads_axis]) + " heads do not divide over tp " +
                       std::to_string(tp));
  }
  if (!ctx.weights && ctx.tokens >= 0 && p.shape[0] != ctx.tokens)
    throw UsageError(w + ": shape " + shape_string(p.shape) + " holds " + std::to_string(p.shape[0]) + " tokens, " +
                     ctx.tokens_from + " " + std::to_string(ctx.tokens) + " (every probe and the inputs hold the "
                     "step's T tokens)");
  check_against_graph(p, *ctx.table, w);

  std::map<int, std::string> rank_groups;
  for (const auto& c : g.children()) {
    int r = 0;
    if (!parse_rank_name(c, &r))
      throw UsageError(w + "/" + c + ": not a rank group (a probe's group holds rank0, rank1, ... only)");
    if (!g.has_group(c)) throw UsageError(w + "/" + c + ": is not a group");
    rank_groups[r] = c;
  }
  if (rank_groups.empty()) throw UsageError(w + ": no rank groups (rank0, ...): a probe holds at least one record");
  int expect = ctx.own >= 0 ? ctx.own : 0;
  for (const auto& [r, c] : rank_groups) {
    if (ctx.own >= 0 && r != ctx.own)
      throw UsageError(w + ": has " + c + " but the dump holds only rank " + std::to_string(ctx.own) +
                       " (one process per rank)");
    if (r != expect) throw UsageError(w + ": has " + c + " but no rank" + std::to_string(expect));
    if (r >= tp) throw UsageError(w + ": has " + c + " but the dump's tp is " + std::to_string(tp));
    ++expect;
  }
  if (ctx.complete && ctx.own < 0 && expect != tp)
    throw UsageError(w + ": rank" + std::to_string(expect) + " is missing: the dump's status is complete at tp " +
                     std::to_string(tp) + ", so every probe holds rank0 ... rank" + std::to_string(tp - 1));
  for (const auto& [r, c] : rank_groups) p.ranks.push_back(read_rank(g.open_group(c), p, r, ctx));
  return p;
}

// layer{l} as write_file writes it (no sign or leading zeros).
bool parse_layer_name(const std::string& name, int* layer) {
  if (name.rfind("layer", 0) != 0 || name.size() == 5 || name.size() > 12) return false;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return false;
  if (name[5] == '0' && name.size() > 6) return false;
  *layer = std::stoi(name.substr(5));
  return true;
}

// /weights/layer{l}/{weight}/rank{r}: the same records as probes, checked against build_weights.
void read_weights(const h5::File& f, Dump& d, ProbeContext ctx, const MlaConfig* cfg, const RunSpec* spec) {
  if (!f.has_group("weights")) throw UsageError(f.where() + "weights: is not a group");
  const h5::Group wg = f.open_group("weights");
  const ProbeTable table = make_probe_table(cfg, spec, true);
  ctx.table = &table;
  ctx.weights = true;
  for (const auto& c : wg.children()) {
    int layer = 0;
    if (!parse_layer_name(c, &layer) || !wg.has_group(c))
      throw UsageError(wg.where() + "/" + c + ": not a layer group (/weights holds layer{l} groups)");
    if (spec && layer >= spec->layers)
      throw UsageError(wg.where() + "/" + c + ": the run options have " + std::to_string(spec->layers) + " layer" +
                       (spec->layers == 1 ? "" : "s"));
    const h5::Group lg = wg.open_group(c);
    for (const auto& wn : lg.children()) {
      if (!lg.has_group(wn))
        throw UsageError(lg.where() + "/" + wn + ": is not a group (a layer holds one group per weight)");
      d.weights.push_back(read_probe(lg.open_group(wn), layer, wn, ctx));
    }
  }
  std::stable_sort(d.weights.begin(), d.weights.end(), [](const DumpProbe& a, const DumpProbe& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.order < b.order;
  });
}

Dump read_h5(const std::string& path, const DumpReadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(path + ": no such file");
  if (fs::is_directory(path, ec)) throw UsageError(path + ": is a directory, not a dump");
  if (!h5::File::is_hdf5(path)) {
    const auto size = fs::file_size(path, ec);
    throw UsageError(path + ": not an HDF5 file (" + std::to_string(ec ? 0 : size) +
                     " bytes without an HDF5 superblock: a foreign file, or a dump truncated at its start)");
  }
  const h5::File f = h5::File::open_read(path);
  const std::string& w = f.where();
  if (!f.has_attr("format"))
    throw UsageError(path + ": an HDF5 file but not an mla-bisect dump (no 'format' attribute on the root group)");
  const std::string format = f.attr_string("format");
  if (format != kFormat)
    throw UsageError(path + ": format is '" + format + "', expected '" + kFormat + "'");
  Dump d;
  d.path = path;
  d.schema_version = static_cast<int>(f.attr_int("schema_version"));
  if (d.schema_version < 1 || d.schema_version > kSchemaVersion)
    throw UsageError(path + ": schema_version " + std::to_string(d.schema_version) +
                     " is not supported (this mla-bisect " MLA_VERSION " reads schema_version 1 to " +
                     std::to_string(kSchemaVersion) + ")");
  if (d.schema_version < 2 && f.has("weights"))
    throw UsageError(f.where() + "weights: a /weights group needs schema_version 2 (the file says " +
                     std::to_string(d.schema_version) + ")");
  d.tool_version = f.attr_string_or("tool_version", "");
  d.git_sha = f.attr_string_or("git_sha", "");
  d.created_utc = f.attr_string_or("created_utc", "");
  auto& m = d.meta;
  m.engine = f.attr_string_or("engine", "");
  m.engine_options = f.attr_string_or("engine_options", "");
  m.engine_dtype = f.attr_string_or("engine_dtype", "");
  check_dtype(w, "engine_dtype", m.engine_dtype, kEngineDtypes);
  m.device = f.attr_string_or("device", "");
  m.model = json_attr(f, "model");
  m.run_options = json_attr(f, "run_options");
  const int64_t tp = f.attr_int_or("tp", 1);
  if (tp < 1 || tp > 4096) throw UsageError(path + ": tp " + std::to_string(tp) + " is out of range");
  m.tp = static_cast<int>(tp);
  m.mode = f.attr_string_or("mode", "");
  if (!m.mode.empty() && m.mode != "prefill" && m.mode != "decode" && m.mode != "chunked")
    throw UsageError(w + ": mode '" + m.mode + "' (expected prefill, decode or chunked)");
  m.seed = f.has_attr("seed") ? f.attr_uint("seed") : 0;
  m.inject = f.attr_string_or("inject", "");
  m.probe_level = f.attr_string_or("probe_level", "");
  if (!m.probe_level.empty() && m.probe_level != "stats" && m.probe_level != "sketch" && m.probe_level != "full")
    throw UsageError(w + ": probe_level '" + m.probe_level + "' (expected stats, sketch or full)");
  m.command = f.attr_string_or("command", "");
  if (f.has_attr("processes")) {
    const int64_t procs = f.attr_int("processes");
    const int64_t own = f.attr_int_or("process_rank", -1);
    if (procs != tp || own < -1 || own >= tp)
      throw UsageError(path + ": process_rank " + std::to_string(own) + " of " + std::to_string(procs) +
                       " processes does not fit tp " + std::to_string(tp));
    m.processes = static_cast<int>(procs);
    m.process_rank = static_cast<int>(own);
    m.launch_id = f.attr_string_or("launch_id", "");
  } else if (f.has_attr("process_rank")) {
    throw UsageError(w + ": attribute 'process_rank' without 'processes' (one process per rank writes both)");
  }
  if (f.has_attr("layer_index") && f.attr_int("layer_index") < 0)
    throw UsageError(w + ": layer_index " + std::to_string(f.attr_int("layer_index")) + " is negative");
  d.status = f.attr_string_or("status", "complete");
  if (d.status != "complete" && d.status.rfind("stopped", 0) != 0)
    throw UsageError(w + ": status '" + d.status + "' (expected 'complete' or 'stopped: <where>')");
  const json ls = json_attr(f, "last_stage");
  if (!ls.is_null() && !ls.is_array()) throw UsageError(w + ": last_stage is not a JSON array");
  for (const auto& s : ls) {
    if (!s.is_string()) throw UsageError(w + ": last_stage holds " + s.dump() + " where a string belongs");
    d.last_stage.push_back(s.get<std::string>());
  }

  // The model and run options, where given, pin down the graph every probe and input is checked against.
  std::optional<MlaConfig> cfg;
  if (!m.model.is_null()) {
    if (!m.model.is_object()) throw UsageError(w + ": attribute 'model' is not a JSON object (HF config.json keys)");
    try {
      QuietStderr quiet;
      cfg = config_from_json(m.model);
    } catch (const UsageError& e) {
      throw UsageError(w + ": attribute 'model': " + e.what());
    } catch (const json::exception& e) {
      throw UsageError(w + ": attribute 'model': " + e.what());
    }
  }
  std::optional<RunSpec> spec;
  if (!m.run_options.is_null()) {
    if (!m.run_options.is_object()) throw UsageError(w + ": attribute 'run_options' is not a JSON object");
    const auto bad = [&](const std::string& what) { throw UsageError(w + ": attribute 'run_options': " + what); };
    try {
      spec = run_spec_from_json(m.run_options);
    } catch (const UsageError& e) {
      bad(e.what());
    }
    if (spec->tokens <= 0 || spec->batch <= 0 || spec->layers <= 0 || spec->tp <= 0)
      bad("tokens, batch, layers and tp must be positive (" + m.run_options.dump() + ")");
    if (m.run_options.contains("tp") && spec->tp != m.tp)
      bad("tp " + std::to_string(spec->tp) + ", the root attribute tp " + std::to_string(m.tp));
    if (m.run_options.contains("mode") && !m.mode.empty() && mode_name(spec->mode) != m.mode)
      bad(std::string("mode ") + mode_name(spec->mode) + ", the root attribute mode " + m.mode);
    if (cfg && cfg->heads % spec->tp != 0)
      bad("tp " + std::to_string(spec->tp) + " does not divide the model's " + std::to_string(cfg->heads) + " heads");
  }
  const MlaConfig* cfg_p = cfg ? &*cfg : nullptr;
  const RunSpec* spec_p = spec ? &*spec : nullptr;

  // The root holds /inputs and /layer{l} groups only: a probe anywhere else would be silently ignored.
  std::vector<std::pair<int, std::string>> layers;
  for (const auto& c : f.children()) {
    int layer = 0;
    const bool is_layer = parse_layer_name(c, &layer);
    if (!is_layer && c != "inputs" && c != "weights")
      throw UsageError(w + c + ": not part of a dump (the root holds /inputs, /weights and /layer{l} groups; a "
                       "probe is /layer{l}/{probe}/rank{r})");
    if (!f.has_group(c)) throw UsageError(w + c + ": is not a group");
    if (is_layer) {
      if (spec && layer >= spec->layers)
        throw UsageError(w + c + ": the run options have " + std::to_string(spec->layers) + " layer" +
                         (spec->layers == 1 ? "" : "s") + " (layer0 ... layer" + std::to_string(spec->layers - 1) + ")");
      layers.emplace_back(layer, c);
    }
  }

  if (opts.inputs && f.has("inputs")) read_inputs(f, d, cfg_p, spec_p);
  if (opts.probes) {
    const ProbeTable table = make_probe_table(cfg_p, spec_p);
    ProbeContext ctx;
    ctx.tp = m.tp;
    ctx.own = m.process_rank;
    ctx.complete = d.complete();
    ctx.table = &table;
    ctx.opts = &opts;
    if (d.has_inputs) {
      ctx.tokens = d.inputs.x.shape[0];
      ctx.tokens_from = "/inputs/x";
    }
    for (const auto& [layer, c] : layers) {
      const h5::Group lg = f.open_group(c);
      for (const auto& pn : lg.children()) {
        if (!lg.has_group(pn))
          throw UsageError(lg.where() + "/" + pn + ": is not a group (a layer holds one group per probe)");
        d.probes.push_back(read_probe(lg.open_group(pn), layer, pn, ctx));
        if (ctx.tokens < 0) {
          ctx.tokens = d.probes.back().shape[0];
          ctx.tokens_from = "/" + c + "/" + pn;
        }
      }
    }
    std::stable_sort(d.probes.begin(), d.probes.end(), [](const DumpProbe& a, const DumpProbe& b) {
      return a.layer != b.layer ? a.layer < b.layer : a.order < b.order;
    });
    if (f.has("weights")) read_weights(f, d, ctx, cfg_p, spec_p);
  }
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------------------

const DumpProbe* Dump::find(int layer, const std::string& name) const {
  for (const auto& p : probes)
    if (p.layer == layer && p.name == name) return &p;
  return nullptr;
}

const DumpProbe* Dump::find_weight(int layer, const std::string& name) const {
  for (const auto& p : weights)
    if (p.layer == layer && p.name == name) return &p;
  return nullptr;
}

MlaConfig Dump::config() const {
  if (meta.model.is_null()) throw UsageError(path + ": the dump has no model configuration (root attribute 'model')");
  try {
    return config_from_json(meta.model);
  } catch (const UsageError& e) {
    throw UsageError(path + ": model configuration: " + e.what());
  } catch (const json::exception& e) {
    throw UsageError(path + ": model configuration: " + e.what());
  }
}

RunSpec Dump::spec() const {
  if (meta.run_options.is_null()) throw UsageError(path + ": the dump has no run options (root attribute 'run_options')");
  try {
    return run_spec_from_json(meta.run_options);
  } catch (const UsageError& e) {
    throw UsageError(path + ": " + e.what());
  }
}

struct DumpWriter::Impl {
  std::string path;
  journal::Writer journal;
  bool finished = false;
  // A watchdog thread may close the dump while the run's thread is still recording.
  std::mutex mu;
  Impl(std::string p) : path(std::move(p)), journal(journal::journal_path(path)) {}
};

DumpWriter::DumpWriter(std::string path, const DumpMeta& meta, const Inputs* inputs)
    : impl_(std::make_unique<Impl>(std::move(path))) {
  journal::Header h;
  h.meta = meta;
  h.created_utc = utc_now();
  h.tool_version = MLA_VERSION;
  h.git_sha = MLA_GIT_SHA;
  h.has_inputs = inputs != nullptr;
  if (inputs) h.inputs = *inputs;
  impl_->journal.append(journal::RecordType::RecordType_header, journal::encode_header(h));
  impl_->journal.sync();
  // From here on the journal is the truth about this path: an older dump there must not be mistaken for it.
  if (::unlink(impl_->path.c_str()) == 0) journal::sync_dir(impl_->path);
}

DumpWriter::~DumpWriter() = default;  // without finish(), the journal stays for recovery

void DumpWriter::stage_begin(int layer, Stage stage, int rank) {
  const std::string payload = journal::encode_stage(layer, stage, rank);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->finished) return;  // closed by another thread (watchdog): the process is on its way out
  impl_->journal.append(journal::RecordType::RecordType_stage, payload);
}

void DumpWriter::record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  const std::string payload = journal::encode_probe(layer, spec, rank, rec);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->finished) return;
  impl_->journal.append(journal::RecordType::RecordType_probe, payload);
}

void DumpWriter::record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  const std::string payload = journal::encode_probe(layer, spec, rank, rec);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->finished) return;
  impl_->journal.append(journal::RecordType::RecordType_weight, payload);
}

void DumpWriter::finish(const std::string& status) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->finished) return;
  auto& j = impl_->journal;
  j.append(journal::RecordType::RecordType_finish, journal::encode_finish(status));
  j.sync();
  const Dump d = fold(journal::scan(j.fd(), j.path()), impl_->path, j.path(), FoldMode::FoldMode_finish, status);
  write_dump_h5(d, impl_->path);
  j.remove();
  impl_->finished = true;
}

bool recover_dump(const std::string& path) {
  return fold_journal(path, nullptr) == JournalState::JournalState_folded;
}

namespace {

// One file (FILE.h5, its journal folded first), as read_dump reads it when it is not a set of ranks.
Dump read_one(const std::string& path, const DumpReadOptions& opts) {
  try {
    Dump live;
    const JournalState js = fold_journal(path, &live);
    if (js == JournalState::JournalState_live || js == JournalState::JournalState_unwritable) {
      if (!opts.inputs) {
        live.has_inputs = false;
        live.inputs = {};
      }
      if (!opts.probes) live.probes.clear();
      if (!opts.data)
        for (auto& p : live.probes)
          for (auto& r : p.ranks) r.data = {};
      return live;
    }
    return read_h5(path, opts);
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    // Anything else (an allocation a corrupt size asked for, a filesystem error) is still a bad input.
    throw UsageError(path + ": cannot read the dump: " + e.what());
  }
}

bool exists_with_journal(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) || std::filesystem::exists(journal::journal_path(path), ec);
}

// The first key of two JSON values that differs ("" when equal), for naming what two parts disagree on.
std::string first_difference(const json& a, const json& b) {
  if (a == b) return "";
  if (!a.is_object() || !b.is_object()) return a.dump() + " vs " + b.dump();
  for (const auto& [k, v] : a.items())
    if (!b.contains(k) || b.at(k) != v)
      return k + " " + v.dump() + " vs " + (b.contains(k) ? b.at(k).dump() : std::string("(absent)"));
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) return k + " (absent) vs " + v.dump();
  return a.dump() + " vs " + b.dump();
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool same_inputs(const Dump& a, const Dump& b) {
  if (a.has_inputs != b.has_inputs) return false;
  if (!a.has_inputs) return true;
  const Inputs &x = a.inputs, &y = b.inputs;
  const Batch &p = x.batch, &q = y.batch;
  if (x.x.shape != y.x.shape || !same_bytes(x.x.data, y.x.data) || p.new_lens != q.new_lens ||
      p.context_lens != q.context_lens || p.positions != q.positions || p.block_table != q.block_table ||
      p.max_blocks != q.max_blocks || p.num_blocks != q.num_blocks || x.kv_cache.size() != y.kv_cache.size())
    return false;
  for (size_t l = 0; l < x.kv_cache.size(); ++l)
    if (x.kv_cache[l].shape != y.kv_cache[l].shape || !same_bytes(x.kv_cache[l].data, y.kv_cache[l].data)) return false;
  return true;
}

// `path` does not exist; FILE.rank<R>.h5 beside it that do (or their journals), by rank.
std::map<int, std::string> rank_files_beside(const std::string& path) {
  namespace fs = std::filesystem;
  std::map<int, std::string> found;
  const std::string r0 = rank_dump_path(path, 0);
  const fs::path p0(r0);
  const std::string name0 = p0.filename().string();
  const size_t at = name0.rfind(".rank0");
  const std::string prefix = name0.substr(0, at + 5), suffix = name0.substr(at + 6);  // "d.rank", ".h5"
  std::error_code ec;
  const fs::path dir = p0.parent_path().empty() ? fs::path(".") : p0.parent_path();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    const std::string jsuffix = ".journal";
    if (name.size() > jsuffix.size() && name.compare(name.size() - jsuffix.size(), jsuffix.size(), jsuffix) == 0)
      name.resize(name.size() - jsuffix.size());
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const int r = std::stoi(digits);
    found[r] = rank_dump_path(path, r);
  }
  return found;
}

// FILE.rank0.h5 ... FILE.rank<N-1>.h5 read as one dump with every rank (read_dump of FILE.h5).
Dump read_rank_set(const std::string& path, const DumpReadOptions& opts) {
  const std::string p0 = rank_dump_path(path, 0);
  Dump first = read_one(p0, opts);
  const auto& m0 = first.meta;
  if (m0.process_rank != 0)
    throw UsageError(p0 + ": " +
                     (m0.process_rank < 0 ? std::string("holds every rank of one process's run")
                                          : "holds rank " + std::to_string(m0.process_rank)) +
                     ", not rank 0 of a one-process-per-rank run, so " + path + " cannot be read as its set");
  const int n = m0.processes;
  const std::string set = path + " (the set " + p0 + (n > 1 ? " ... " + rank_dump_path(path, n - 1) : "") +
                          " of a one-process-per-rank run at tp " + std::to_string(n) + ")";
  std::vector<Dump> parts;
  parts.push_back(std::move(first));
  for (int r = 1; r < n; ++r) {
    const std::string pr = rank_dump_path(path, r);
    if (!exists_with_journal(pr))
      throw UsageError(pr + ": no such file: rank " + std::to_string(r) + "'s dump is missing from " + set +
                       "; did its process run with --out " + path + " in this directory?");
    Dump d = read_one(pr, opts);
    const auto& m = d.meta;
    const auto differs = [&](const std::string& what, const std::string& detail) {
      throw UsageError(pr + " and " + p0 + " differ in " + what + " (" + detail + "): they are not ranks of one "
                       "launch, so " + path + " cannot be read as their set");
    };
    if (m.process_rank != r || m.processes != n)
      differs("which rank they hold", "rank " + std::to_string(m.process_rank) + " of " + std::to_string(m.processes) +
                                          " processes, expected rank " + std::to_string(r) + " of " + std::to_string(n));
    const auto& a = parts.front().meta;
    if (m.launch_id != a.launch_id)  // e.g. a rank file left by an earlier launch whose process did not rerun
      differs("launch", "launch id " + (m.launch_id.empty() ? std::string("(none)") : m.launch_id) + " vs " +
                            (a.launch_id.empty() ? std::string("(none)") : a.launch_id));
    if (m.tp != a.tp) differs("tp", std::to_string(m.tp) + " vs " + std::to_string(a.tp));
    if (m.engine != a.engine || m.engine_options != a.engine_options || m.engine_dtype != a.engine_dtype)
      differs("engine", m.engine + ":" + m.engine_options + " " + m.engine_dtype + " vs " + a.engine + ":" +
                            a.engine_options + " " + a.engine_dtype);
    if (const std::string diff = first_difference(m.model, a.model); !diff.empty()) differs("model", diff);
    if (const std::string diff = first_difference(m.run_options, a.run_options); !diff.empty())
      differs("run options", diff);
    if (m.mode != a.mode) differs("mode", m.mode + " vs " + a.mode);
    if (m.seed != a.seed) differs("seed", std::to_string(m.seed) + " vs " + std::to_string(a.seed));
    if (m.inject != a.inject) differs("injections", "'" + m.inject + "' vs '" + a.inject + "'");
    if (m.probe_level != a.probe_level) differs("probe level", m.probe_level + " vs " + a.probe_level);
    if (opts.inputs && !same_inputs(d, parts.front())) differs("inputs", "/inputs");
    parts.push_back(std::move(d));
  }

  Dump out;
  out.path = path;
  out.meta = parts.front().meta;
  out.meta.process_rank = -1;
  out.meta.processes = n;
  out.schema_version = parts.front().schema_version;
  out.tool_version = parts.front().tool_version;
  out.git_sha = parts.front().git_sha;
  out.created_utc = parts.front().created_utc;
  out.has_inputs = parts.front().has_inputs;
  out.inputs = std::move(parts.front().inputs);
  out.status = "complete";
  std::string stopped;
  out.last_stage.assign(n, "");
  for (int r = 0; r < n; ++r) {
    const Dump& d = parts[r];
    out.parts.push_back(d.path);
    if (d.meta.device != out.meta.device && out.meta.device.find(d.meta.device) == std::string::npos)
      out.meta.device += "; " + d.meta.device;
    if (!d.complete()) stopped += (stopped.empty() ? "" : "; ") + d.status + " (in " + d.path + ")";
    if (r < static_cast<int>(d.last_stage.size())) out.last_stage[r] = d.last_stage[r];
  }
  if (!stopped.empty()) out.status = stopped;

  // The probes every rank recorded, as one process records them (a stage's probes after every rank ran it). When
  // a rank stopped, the other ranks' later probes cannot be gathered; they stay readable in their own files.
  size_t left_out = 0;
  for (auto list : {&Dump::probes, &Dump::weights}) {
  std::map<std::pair<int, std::string>, std::vector<const DumpProbe*>> by_key;
  for (int r = 0; r < n; ++r)
    for (const auto& p : parts[r].*list) {
      auto& v = by_key[{p.layer, p.name}];
      v.resize(n, nullptr);
      if (!p.ranks.empty()) v[r] = &p;
    }
  for (const auto& [key, per_rank] : by_key) {
    if (std::find(per_rank.begin(), per_rank.end(), nullptr) != per_rank.end()) {
      ++left_out;
      continue;
    }
    DumpProbe merged = *per_rank[0];
    merged.ranks.clear();
    for (int r = 0; r < n; ++r) {
      const DumpProbe& p = *per_rank[r];
      if (p.shape != merged.shape || p.contract != merged.contract || p.order != merged.order)
        throw UsageError(parts[r].path + ": layer " + std::to_string(p.layer) + " probe " + p.name + " is " +
                         p.contract + " " + shape_string(p.shape) + " at graph position " + std::to_string(p.order) +
                         ", in " + p0 + " " + merged.contract + " " + shape_string(merged.shape) + " at " +
                         std::to_string(merged.order));
      merged.ranks.push_back(p.ranks.front());
    }
    (out.*list).push_back(std::move(merged));
  }
  std::stable_sort((out.*list).begin(), (out.*list).end(), [](const DumpProbe& a, const DumpProbe& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.order < b.order;
  });
  }
  if (left_out > 0)
    out.status += "; " + std::to_string(left_out) + " probe" + (left_out == 1 ? "" : "s") +
                  " recorded by only some ranks left out (inspect the rank files for them)";
  return out;
}

}  // namespace

Dump read_dump(const std::string& path, const DumpReadOptions& opts) {
  if (!exists_with_journal(path)) {
    const auto ranks = rank_files_beside(path);
    if (ranks.count(0)) return read_rank_set(path, opts);
    if (!ranks.empty())
      throw UsageError(path + ": no such file, and of the one-process-per-rank set that reads as it " +
                       rank_dump_path(path, 0) + " is missing (found " + ranks.begin()->second +
                       (ranks.size() > 1 ? " and " + std::to_string(ranks.size() - 1) + " more" : std::string()) +
                       "); did rank 0's process run with --out " + path + " in this directory?");
  }
  return read_one(path, opts);
}

std::string rank_dump_path(const std::string& path, int rank) {
  std::filesystem::path p(path);
  const std::string ext = p.extension().string();
  p.replace_extension();
  return p.string() + ".rank" + std::to_string(rank) + ext;
}

void require_every_rank(const Dump& d, const std::string& command) {
  const int own = d.meta.process_rank;
  if (own < 0) return;
  const int n = d.meta.processes;
  // FILE.rank<R>.h5 -> FILE.h5, the name that reads the whole set.
  std::string set;
  const std::filesystem::path p(d.path);
  const std::string ext = p.extension().string(), tag = ".rank" + std::to_string(own);
  std::string stem = std::filesystem::path(p).replace_extension().string();
  if (stem.size() > tag.size() && stem.compare(stem.size() - tag.size(), tag.size(), tag) == 0)
    set = stem.substr(0, stem.size() - tag.size()) + ext;
  const std::string how = set.empty() ? std::string("pass the --out name of the run (FILE.h5), which reads "
                                                    "FILE.rank0.h5 ... as one dump")
                                      : "pass " + set + ", which reads " + rank_dump_path(set, 0) +
                                            (n > 1 ? " ... " + rank_dump_path(set, n - 1) : std::string()) +
                                            " as one dump";
  throw UsageError(d.path + " holds only rank " + std::to_string(own) + " of a tp " + std::to_string(d.meta.tp) +
                   " run made with one process per rank; " + command + " needs every rank: " + how);
}

void write_dump_h5(const Dump& dump, const std::string& path) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    {
      h5::File f = h5::File::create(tmp);
      write_file(f, dump);
      f.flush();
      f.close();
    }
    Fd fd(::open(tmp.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0 || ::fsync(fd.get()) != 0)
      throw UsageError(tmp + ": cannot fsync the new dump: " + std::strerror(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw UsageError(path + ": cannot rename " + tmp + " into place: " + std::strerror(errno));
    journal::sync_dir(path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace mla
