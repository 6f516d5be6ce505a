// Dumps: what one run recorded, as an HDF5 file (schema_version 1, docs/dump-format.md),
// written crash-safely: during the run every record goes to an append-only journal beside the file
// (FILE.h5.journal, CRC'd records); the journal is folded into the HDF5 file at the end of the run or by
// any later command that opens the dump, so probes recorded before a crash survive it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/inputs.h"
#include "core/probe/probe.h"

namespace mla {

// Provenance written as root attributes.
struct DumpMeta {
  std::string engine;          // "reference", "cuda"
  std::string engine_options;  // canonical option string
  std::string engine_dtype;    // activation dtype
  std::string device = "cpu";  // device / driver / toolkit string
  nlohmann::json model;        // MlaConfig::to_json()
  nlohmann::json run_options;  // run spec and the command line
  int tp = 1;
  std::string mode;
  uint64_t seed = 0;
  std::string inject;          // injections the engine ran with ("" = none)
  std::string probe_level;
  std::string command;         // the command line that produced the dump
  // One process per rank (`run --rank`): the tp rank whose records this dump holds (one per probe) and the number
  // of processes of the run (= tp). -1 / 0: one process recorded every rank. A merged set (read_dump of FILE.h5
  // over FILE.rank0.h5 ...) has process_rank -1 and processes N.
  int process_rank = -1;
  int processes = 0;
  std::string launch_id;  // one process per rank: the launch's id (rank 0 draws it; every rank's dump carries it)
};

// One probe of one layer, every rank's record.
struct DumpProbe {
  int layer = 0;
  std::string name;
  std::string stage;
  std::string contract;        // replicated | heads | partial
  std::vector<int64_t> shape;  // global
  int order = 0;               // position in the graph
  int heads_axis = -1;
  int rope_from = -1;
  std::string engine_dtype;
  // index = rank; fewer than tp when the run stopped mid-probe (the leading ranks that recorded it). A one-rank
  // dump (meta.process_rank >= 0) holds that rank's record at index 0.
  std::vector<ProbeRecord> ranks;
};

struct Dump {
  std::string path;
  DumpMeta meta;
  int schema_version = 1;
  std::string tool_version, git_sha, created_utc;
  std::string status;  // "complete" or "stopped: <where>"
  bool has_inputs = false;
  Inputs inputs;       // /inputs: x, positions, seq_lens, context_lens, block_table, kv_cache (per layer)
  std::vector<DumpProbe> probes;  // in (layer, order) order
  // /weights: the weights each layer computed with (build_weights), as this engine held them; empty where the
  // engine or producer recorded none. Same record layout as probes (rows play the tokens' part).
  std::vector<DumpProbe> weights;  // in (layer, order) order
  // Last stage each rank had begun when the run stopped (hang reports): "layer L stage S" per rank.
  std::vector<std::string> last_stage;
  // One process per rank: the files FILE.rank0.h5 ... that read_dump merged into this dump, in rank order.
  std::vector<std::string> parts;

  bool complete() const { return status == "complete"; }
  // The tp rank of DumpProbe::ranks[index].
  int rank_of(size_t index) const { return meta.process_rank >= 0 ? meta.process_rank : static_cast<int>(index); }
  const DumpProbe* find(int layer, const std::string& name) const;
  const DumpProbe* find_weight(int layer, const std::string& name) const;
  MlaConfig config() const;  // from meta.model
  RunSpec spec() const;      // from meta.run_options
};

// The ProbeSink that writes a dump. Construction writes the journal header (meta, inputs), fsyncs it and renames it
// over any earlier journal (journal::Writer: never emptied in place), and
// removes an older FILE.h5 (the journal is now the truth about that path); each record is appended with
// write(2) (survives SIGKILL and abort: the kernel holds the bytes); finish() appends a finish record, writes
// the HDF5 file (temp + fsync + rename), then removes the journal. Destroyed without finish() (an exception),
// it leaves the journal for recovery. Thread-safe: a watchdog thread may finish() while the run's thread
// records; records after finish() are dropped. Journal format: probes/journal.h.
class DumpWriter : public ProbeSink {
 public:
  DumpWriter(std::string path, const DumpMeta& meta, const Inputs* inputs);  // inputs may be null
  ~DumpWriter() override;
  void stage_begin(int layer, Stage stage, int rank) override;
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void finish(const std::string& status) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What read_dump loads; commands that need less (inspect, run --input) skip the rest.
struct DumpReadOptions {
  bool inputs = true;  // /inputs
  bool probes = true;  // /layer{l}/... and /weights/...
  bool data = true;    // full tensors (rank{r}/data); false: stats, maps and sketches only
};

// Reads a dump. If a journal is beside it (the writer died), folds it first: every intact record is kept,
// the status says where the run stopped. If the writer is still alive (it holds the journal's lock), the
// journal is read as it stands, nothing is written, and the status says "running: ...". (Where FILE.h5 cannot
// be written, e.g. a read-only directory, the fold is written to a temporary directory and read back from there,
// checked as any dump, and the journal stays.) Throws UsageError
// with the path and what is wrong for a missing, truncated, corrupt or foreign file, or for one that
// docs/dump-format.md calls invalid (naming the object inside the file: "d.h5:/layer0/q_c/rank0: ..."). A record
// with its tensor ('data') may leave out its statistics, maps and sketch: they are computed from the tensor.
// One process per rank: where FILE.h5 does not exist but FILE.rank0.h5 ... do (rank_dump_path), they are read and
// merged into one Dump with every rank, as one process's tp-N dump reads; they must agree on the model, run
// options, engine, mode, seed, injections, probe level and inputs, else a UsageError names the file that differs
// (or is missing). The status is the first stopped part's, naming its file. A single FILE.rankR.h5 reads as
// itself: rank R's records only (meta.process_rank R); commands that gather ranks refuse it (require_every_rank).
Dump read_dump(const std::string& path, const DumpReadOptions& opts = {});

// FILE.h5 -> FILE.rank<R>.h5: the dump of rank R of a one-process-per-rank run whose --out is FILE.h5.
std::string rank_dump_path(const std::string& path, int rank);
// Throws UsageError when `d` holds one rank of a one-process-per-rank run: `command` (compare, explore, ...) needs
// every rank; the message names the set's path that merges them.
void require_every_rank(const Dump& d, const std::string& command);

// Folds FILE.h5.journal into FILE.h5 if present; returns true if it did (false: no journal, or its writer is
// still alive). The status is the finish record's if the run got that far (it was killed while writing the
// HDF5 file), else "stopped: after layer L probe P rank R" (the last record committed); last_stage holds
// "layer L stage S" per rank from the stage markers. Where the journal is missing or holds no header, the temporary
// file of a writer killed before its rename (FILE.h5.journal.tmp.PID) is folded instead; an empty journal without
// one is not folded (false; read_dump reads it as stopped before its header). A journal whose bytes are not an intact
// header is a UsageError and is left in place. (read_dump calls this.)
bool recover_dump(const std::string& path);

// Writes a Dump as HDF5 atomically (temp file in the same directory, fsync, rename). Used by the writer,
// by recovery, and by golden make.
void write_dump_h5(const Dump& dump, const std::string& path);

}  // namespace mla
