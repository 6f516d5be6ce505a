// What the dump's source files share (dump_journal.cpp, dump_write.cpp, dump_read.cpp, dump_ranks.cpp); not an
// interface: probes/dump.h is.
#pragma once
#include <unistd.h>

#include <ctime>
#include <map>
#include <string>

#include "probes/dump.h"

namespace mla::dump_detail {

inline constexpr const char* kFormat = "mla-bisect-dump";
// 2 = 1 plus the optional /weights group. A dump without weights is written as 1, so a reader of 1 still reads it.
inline constexpr int kSchemaVersion = 2;
// Tensor-parallel ranks a dump may hold (the root's tp, a journal header's).
inline constexpr int kMaxTp = 4096;

inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A file descriptor closed when it goes out of scope.
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

// headerless: a journal (or a writer's temporary file) without a header, its writer gone: the snapshot says the
// run stopped before its header and holds nothing else.
enum class JournalState {
  JournalState_none,
  JournalState_folded,
  JournalState_live,
  JournalState_unwritable,
  JournalState_headerless
};

// Folds FILE.h5.journal into FILE.h5 unless its writer is alive; then, with `snapshot`, reads it as it stands.
// Where FILE.h5 cannot be written (a read-only directory), `snapshot` gets the fold (checked for consistent sizes
// only: read_dump checks it in a temporary copy) and the journal stays.
JournalState fold_journal(const std::string& path, Dump* snapshot);  // dump_journal.cpp

// What write_dump_h5 needs of a Dump before it writes anything: every tensor's values fill its shape, the inputs'
// per-sequence vectors and block table agree with the sequence count, every layer's cache has one shape, and a
// record's token_l2, head_l2 and sketch hold its rows. UsageError naming `where` otherwise. A folded journal is
// checked so (dump_write.cpp).
void check_consistent(const Dump& d, const std::string& where);

// One file (FILE.h5, its journal folded first), as read_dump reads it when it is not a set of ranks.
Dump read_one(const std::string& path, const DumpReadOptions& opts);  // dump_read.cpp
bool exists_with_journal(const std::string& path);                    // dump_read.cpp

// FILE.rank<R>.h5 beside FILE.h5, by rank; and reading them as one dump.
std::map<int, std::string> rank_files_beside(const std::string& path);  // dump_ranks.cpp
Dump read_rank_set(const std::string& path, const DumpReadOptions& opts);  // dump_ranks.cpp

}  // namespace mla::dump_detail
