// Folding a dump's journal into a Dump: when the writer finishes, on recovery after a crash, and as a live
// snapshot of a run still writing; and the journal-backed writer itself (DumpWriter).
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

#include "core/model/errors.h"
#include "probes/dump_internal.h"
#include "probes/h5.h"
#include "probes/journal.h"

namespace mla {

using nlohmann::json;
using namespace dump_detail;

namespace {

// Folding a journal into a Dump

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
  if (d.meta.tp < 1 || d.meta.tp > kMaxTp)
    throw UsageError(jpath + ": the journal's header says tp " + std::to_string(d.meta.tp) + " (1 to " +
                     std::to_string(kMaxTp) + ")");
  if (own >= d.meta.tp)
    throw UsageError(jpath + ": the journal's header says rank " + std::to_string(own) + " of tp " +
                     std::to_string(d.meta.tp));
  std::map<std::pair<int, std::string>, size_t> index, weight_index;
  std::vector<std::string> last_stage(d.meta.tp, own >= 0 ? "" : "not started");
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
          if (e.rank >= d.meta.tp)
            throw journal::FormatError("a stage marker of rank " + std::to_string(e.rank) + " at tp " +
                                       std::to_string(d.meta.tp));
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
  // Records whose sizes disagree (a foreign or damaged writer under good CRCs) make no dump: refused here, before
  // anything is written or handed on.
  check_consistent(d, jpath);
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

}  // namespace

namespace dump_detail {

// Folds FILE.h5.journal into FILE.h5 unless its writer is alive; then, with `snapshot`, reads it as it stands.
// Where FILE.h5 cannot be written (a read-only directory), `snapshot` gets the fold (checked for consistent sizes
// only: read_dump checks it in a temporary copy) and the journal stays.
JournalState fold_journal(const std::string& path, Dump* snapshot) {
  const std::string jpath = journal::journal_path(path);
  Fd fd(::open(jpath.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 && errno != ENOENT)
    throw UsageError(jpath + ": cannot open the dump journal: " + std::strerror(errno));
  if (fd.get() >= 0 && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
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
  if (fd.get() >= 0 && (::fstat(fd.get(), &st) != 0 || st.st_nlink == 0))
    return JournalState::JournalState_none;  // folded meanwhile
  // A writer fills a temporary file and renames it over the journal once its header is on disk; one killed before
  // that leaves the temporary file. It stands for the run when the journal holds no header (or is absent).
  const std::vector<std::string> temps = journal::abandoned_temps(jpath);
  journal::Scan sc;
  if (fd.get() >= 0) sc = journal::scan(fd.get(), jpath);
  std::string source = jpath;
  const bool headerless = fd.get() < 0 || sc.records.empty();
  if (headerless) {
    for (auto it = temps.rbegin(); it != temps.rend(); ++it) {
      Fd tfd(::open(it->c_str(), O_RDONLY | O_CLOEXEC));
      if (tfd.get() < 0) continue;
      journal::Scan ts = journal::scan(tfd.get(), *it);
      if (!ts.records.empty() && ts.records.front().type == journal::RecordType::RecordType_header) {
        sc = std::move(ts);
        source = *it;
        break;
      }
    }
  }
  if (source == jpath && headerless) {
    if (fd.get() < 0 && temps.empty()) return JournalState::JournalState_none;
    // Killed before any header reached the disk (an empty journal, or only an empty temporary file): the run
    // stopped before it wrote anything but that it was writing here. Garbage where a header belongs stays an error.
    if (fd.get() >= 0 && sc.total_bytes > 0) fold(sc, path, jpath, FoldMode::FoldMode_recover);  // throws
    if (!snapshot) return JournalState::JournalState_none;
    Dump d;
    d.path = path;
    d.status = "stopped: before the run wrote its header (" +
               (fd.get() >= 0 ? jpath + " is empty" : temps.front() + " holds no header") +
               "; engine, model and run options are not known). Delete " +
               (fd.get() >= 0 ? jpath : temps.front()) + " or run again with --out " + path;
    *snapshot = std::move(d);
    return JournalState::JournalState_headerless;
  }
  Dump d = fold(sc, path, source, FoldMode::FoldMode_recover);
  try {
    write_dump_h5(d, path);
  } catch (const UsageError&) {
    if (!snapshot) throw;
    *snapshot = std::move(d);
    return JournalState::JournalState_unwritable;
  }
  if (fd.get() >= 0) ::unlink(jpath.c_str());
  for (const auto& t : temps) ::unlink(t.c_str());
  journal::sync_dir(jpath);
  remove_stale_temps(path);
  return JournalState::JournalState_folded;
}

}  // namespace dump_detail

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

}  // namespace mla
