// The rendezvous file: rank 0 writes it atomically, the other ranks poll for it.
#include "harness/run/rendezvous.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "core/model/errors.h"
#include "probes/journal.h"

namespace mla {

namespace {

constexpr char kMagic[8] = {'M', 'L', 'A', 'R', 'D', 'V', '0', '1'};
constexpr size_t kHeaderBytes = 16;  // magic, length, crc32
constexpr auto kPollInterval = std::chrono::milliseconds(20);

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

void write_all(int fd, const std::vector<unsigned char>& bytes, const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw UsageError(what + ": cannot write the rendezvous file: " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

std::vector<unsigned char> publish(const std::string& path, size_t bytes,
                                   const std::function<std::vector<unsigned char>()>& make_id) {
  const std::string fresh = "it must not exist before the launch: use a fresh path per launch, e.g. "
                            "/shared/mla-id.$SLURM_JOB_ID";
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0)
    throw UsageError("--rendezvous " + path + ": the file exists; " + fresh +
                     " (other ranks would read the id of an earlier launch)");
  std::vector<unsigned char> id = make_id();
  if (id.size() != bytes)
    throw EngineError("rendezvous: the communicator id has " + std::to_string(id.size()) + " bytes, expected " +
                      std::to_string(bytes));
  std::vector<unsigned char> file(kHeaderBytes + bytes);
  std::memcpy(file.data(), kMagic, sizeof kMagic);
  put_u32(file.data() + 8, static_cast<uint32_t>(bytes));
  put_u32(file.data() + 12, journal::crc32(id.data(), id.size()));
  if (bytes) std::memcpy(file.data() + kHeaderBytes, id.data(), bytes);

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw UsageError("--rendezvous " + path + ": cannot create " + tmp + ": " + std::strerror(errno));
  try {
    write_all(fd, file, tmp);
    if (::fsync(fd) != 0) throw UsageError(tmp + ": cannot fsync the rendezvous file: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  // link() publishes without replacing a file another process created meanwhile; where the file system has no
  // hard links, rename() (atomic too, but it would replace).
  if (::link(tmp.c_str(), path.c_str()) == 0) {
    ::unlink(tmp.c_str());
  } else if (errno == EEXIST) {
    ::unlink(tmp.c_str());
    throw UsageError("--rendezvous " + path + ": another process created the file while rank 0 was writing it; " +
                     fresh);
  } else if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw UsageError("--rendezvous " + path + ": cannot move " + tmp + " into place: " + why);
  }
  journal::sync_dir(path);
  return id;
}

// What a reader found at the path.
enum class Found { Found_none, Found_torn, Found_id };

Found try_read(const std::string& path, int rank, size_t bytes, std::vector<unsigned char>& id, std::string& torn) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Found::Found_none;
    throw UsageError("--rendezvous " + path + ": rank " + std::to_string(rank) + " cannot open it: " +
                     std::strerror(errno));
  }
  std::vector<unsigned char> file;
  unsigned char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw UsageError("--rendezvous " + path + ": rank " + std::to_string(rank) + " cannot read it: " + why);
    }
    if (n == 0) break;
    file.insert(file.end(), buf, buf + n);
    if (file.size() > kHeaderBytes + bytes + 4096) break;  // far too long: no need to read a foreign file whole
  }
  ::close(fd);
  const std::string who = "--rendezvous " + path + " (read by rank " + std::to_string(rank) + ")";
  if (file.size() >= sizeof kMagic && std::memcmp(file.data(), kMagic, sizeof kMagic) != 0)
    throw UsageError(who + ": not an mla-bisect rendezvous file (no MLARDV01 header): pass a path that only rank 0 "
                           "of this launch writes, fresh for each launch");
  if (file.size() < kHeaderBytes) {
    torn = std::to_string(file.size()) + " of the header's " + std::to_string(kHeaderBytes) + " bytes";
    return Found::Found_torn;
  }
  const uint32_t length = get_u32(file.data() + 8);
  if (length != bytes)
    throw UsageError(who + ": holds a " + std::to_string(length) + "-byte id, this rank expects " +
                     std::to_string(bytes) + " bytes (processes of different engines or builds?)");
  if (file.size() > kHeaderBytes + bytes)
    throw UsageError(who + ": " + std::to_string(file.size()) + " bytes, more than the " +
                     std::to_string(kHeaderBytes + bytes) + " of a " + std::to_string(bytes) + "-byte id");
  if (file.size() < kHeaderBytes + bytes) {
    torn = std::to_string(file.size()) + " of " + std::to_string(kHeaderBytes + bytes) + " bytes";
    return Found::Found_torn;
  }
  id.assign(file.begin() + kHeaderBytes, file.end());
  if (journal::crc32(id.data(), id.size()) != get_u32(file.data() + 12)) {
    torn = "its id fails the checksum";
    return Found::Found_torn;
  }
  return Found::Found_id;
}

}  // namespace

std::vector<unsigned char> rendezvous_exchange(const std::string& path, int rank, size_t bytes,
                                               const std::function<std::vector<unsigned char>()>& make_id,
                                               double timeout_s) {
  if (path.empty()) throw UsageError("one process per rank needs --rendezvous PATH");
  if (rank < 0) throw UsageError("rendezvous: rank " + std::to_string(rank) + " is not a process's rank");
  if (rank == 0) return publish(path, bytes, make_id);
  const auto t0 = std::chrono::steady_clock::now();
  std::string torn;
  for (;;) {
    std::vector<unsigned char> id;
    torn.clear();
    if (try_read(path, rank, bytes, id, torn) == Found::Found_id) return id;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited >= timeout_s) {
      if (!torn.empty())
        throw UsageError("--rendezvous " + path + ": rank " + std::to_string(rank) + " waited " + seconds(waited) +
                         " s and the file stayed incomplete (" + torn +
                         "): it was not written by mla-bisect's rank 0, or was damaged; use a fresh path per launch");
      throw EngineError("--rendezvous " + path + ": rank " + std::to_string(rank) + " waited " + seconds(waited) +
                        " s for rank 0 to publish the communicator id there and it did not appear: is rank 0 "
                        "running, was it launched with the same --rendezvous, and is the path on a file system every "
                        "host sees?");
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

namespace {
constexpr size_t kLaunchIdBytes = 16;

std::vector<unsigned char> random_bytes(size_t n) {
  std::random_device rd;
  std::vector<unsigned char> out(n);
  for (auto& b : out) b = static_cast<unsigned char>(rd() & 0xffu);
  return out;
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}
}  // namespace

void rendezvous_launch(ProcessRank& p, size_t comm_bytes, const std::function<std::vector<unsigned char>()>& make_comm_id) {
  if (!p.per_process()) return;
  const auto make = [&] {
    std::vector<unsigned char> payload = random_bytes(kLaunchIdBytes);
    const std::vector<unsigned char> comm = comm_bytes ? make_comm_id() : std::vector<unsigned char>{};
    if (comm.size() != comm_bytes)
      throw EngineError("rendezvous: the engine made a communicator id of " + std::to_string(comm.size()) +
                        " bytes, expected " + std::to_string(comm_bytes));
    payload.insert(payload.end(), comm.begin(), comm.end());
    return payload;
  };
  const std::vector<unsigned char> payload =
      p.world > 1 ? rendezvous_exchange(p.rendezvous, p.rank, kLaunchIdBytes + comm_bytes, make, p.rendezvous_timeout_s)
                  : make();
  p.launch_id = hex(payload.data(), kLaunchIdBytes);
  p.comm_id.assign(payload.begin() + kLaunchIdBytes, payload.end());
}

}  // namespace mla
