// The crash-safe half of a dump: FILE.h5.journal, an append-only file of CRC'd records that a running
// DumpWriter appends with write(2) (the kernel keeps what was written through SIGKILL and abort), and that
// finish() or any later reader folds into FILE.h5.
//
// Record:  [u32 magic "MLAJ"][u32 type][u64 length][payload: length bytes][u32 crc32 of payload]
// Records: one header (magic string, version, DumpMeta and provenance as JSON, the inputs), then one per
//          stage_begin marker, one per weight record and one per probe record, in the order the run made them, and a finish
//          record (the status) written just before the HDF5 file. Little-endian, this machine's layout:
//          a journal is read back on the machine that wrote it.
// A reader keeps every intact record up to the first one that is truncated or fails its CRC.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "probes/dump.h"

namespace mla::journal {

constexpr uint32_t kRecordMagic = 0x4A4C4D41;  // bytes "AMLJ" on disk
constexpr uint32_t kVersion = 2;  // 2: the header's inputs carry the DSA index cache
constexpr const char* kHeaderMagic = "mla-bisect-journal";

enum class RecordType : uint32_t {
  RecordType_header = 1,
  RecordType_probe = 2,
  RecordType_stage = 3,
  RecordType_finish = 4,
  RecordType_weight = 5,  // a weight record (Dump::weights): the probe payload
};

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);  // IEEE 802.3 (zlib's)

std::string journal_path(const std::string& dump_path);  // FILE.h5 -> FILE.h5.journal

// Payloads.
struct Header {
  DumpMeta meta;
  std::string created_utc, tool_version, git_sha;
  bool has_inputs = false;
  Inputs inputs;
};
struct ProbeEntry {
  DumpProbe probe;  // everything but ranks
  int rank = 0;
  ProbeRecord rec;
};
struct StageEntry {
  int layer = 0;
  std::string stage;
  int rank = 0;
};

std::string encode_header(const Header& h);
std::string encode_probe(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec);
std::string encode_stage(int layer, Stage stage, int rank);
std::string encode_finish(const std::string& status);
// Decoders throw FormatError on a payload that does not parse (after a good CRC: a foreign version).
struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
Header decode_header(const std::string& payload);
ProbeEntry decode_probe(const std::string& payload);
StageEntry decode_stage(const std::string& payload);
std::string decode_finish(const std::string& payload);

// The framed bytes of one record.
std::string frame(RecordType type, const std::string& payload);

struct Record {
  RecordType type;
  std::string payload;
  uint64_t offset = 0;  // of the record in the file
};

// Every intact record of a journal, up to the first bad one.
struct Scan {
  std::vector<Record> records;
  uint64_t good_bytes = 0;   // end of the last intact record
  uint64_t total_bytes = 0;  // file size
  std::string problem;       // why the scan stopped early ("" when it read to the end)
};
Scan scan(int fd, const std::string& path);  // reads via pread; throws UsageError if unreadable

// The writer's side. A journal is never emptied in place: the writer writes its records to a temporary file beside
// it (FILE.h5.journal.tmp.PID, see temp_path), and the first sync() (after the header) fsyncs that file and renames
// it over the journal, so at every instant the journal path holds either the previous journal (or nothing) or the
// new one with its header. The writer holds an exclusive flock on its file for the life of the run (a reader that
// finds the lock knows the run is alive), and on the journal it replaces until the rename; it appends framed
// records with one write(2) each.
class Writer {
 public:
  explicit Writer(std::string path);  // throws UsageError (cannot create, or another live writer)
  ~Writer();                          // before the first sync(): removes the temporary file
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  void append(RecordType type, const std::string& payload);  // throws UsageError on a failed write
  void sync();    // fsync the journal and its directory; the first call puts the journal in place (rename)
  void remove();  // unlink, then close (the lock goes with the fd)
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool published() const { return published_; }

 private:
  void publish();
  std::string path_, tmp_;
  int fd_ = -1;
  int old_fd_ = -1;  // the journal this one replaces, locked until the rename
  bool published_ = false;
};

// The temporary file a writer of process `pid` fills before it becomes the journal at `journal`.
std::string temp_path(const std::string& journal, long pid);
// The temporary files beside `journal` (journal.tmp.N) whose writer is gone (their flock can be taken).
std::vector<std::string> abandoned_temps(const std::string& journal);

// fsync of the directory holding `path` (makes a create/rename/unlink durable).
void sync_dir(const std::string& path);

}  // namespace mla::journal
