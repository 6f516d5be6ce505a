// Journal records: byte codecs, framing with CRC32, the append-only writer and the scanning reader.
#include "probes/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/model/errors.h"

namespace mla::journal {

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "journal payloads store IEEE float32/float64");

// ---------------------------------------------------------------------------------------------------
// CRC32 (reflected polynomial 0xEDB88320, as zlib and PNG)
// ---------------------------------------------------------------------------------------------------

namespace {
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kCrcTable = make_crc_table();
}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  auto p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::string journal_path(const std::string& dump_path) { return dump_path + ".journal"; }

// ---------------------------------------------------------------------------------------------------
// Byte codecs
// ---------------------------------------------------------------------------------------------------

namespace {

class Out {
 public:
  template <class T> void pod(const T& v) { buf_.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void u32(uint32_t v) { pod(v); }
  void i32(int32_t v) { pod(v); }
  void u64(uint64_t v) { pod(v); }
  void i64(int64_t v) { pod(v); }
  void f64(double v) { pod(v); }
  void str(const std::string& s) {
    u64(s.size());
    buf_.append(s);
  }
  template <class T> void vec(const std::vector<T>& v) {
    u64(v.size());
    buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void tensor(const Tensor& t) {
    vec(t.shape);
    vec(t.data);
  }
  std::string take() { return std::move(buf_); }

 private:
  std::string buf_;
};

class In {
 public:
  explicit In(const std::string& s) : p_(s.data()), n_(s.size()) {}
  template <class T> T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t u32() { return pod<uint32_t>(); }
  int32_t i32() { return pod<int32_t>(); }
  uint64_t u64() { return pod<uint64_t>(); }
  int64_t i64() { return pod<int64_t>(); }
  double f64() { return pod<double>(); }
  std::string str() {
    const uint64_t len = u64();
    need(len);
    std::string s(p_ + pos_, len);
    pos_ += len;
    return s;
  }
  template <class T> std::vector<T> vec() {
    const uint64_t len = u64();
    if (len > (n_ - pos_) / sizeof(T)) throw FormatError("array of " + std::to_string(len) + " runs past the record");
    std::vector<T> v(len);
    if (len) std::memcpy(v.data(), p_ + pos_, len * sizeof(T));
    pos_ += len * sizeof(T);
    return v;
  }
  Tensor tensor() {
    Tensor t;
    t.shape = vec<int64_t>();
    t.data = vec<float>();
    if (!(t.shape.empty() && t.data.empty())) {
      // The extents' product must be the values stored; it is formed only up to them (extents are any int64).
      bool zero = false;
      for (int64_t d : t.shape) {
        if (d < 0) throw FormatError("negative extent in a tensor shape");
        zero = zero || d == 0;
      }
      int64_t n = zero ? 0 : 1;
      for (int64_t d : t.shape) {
        if (zero || n > t.numel() / d) {
          n = zero ? 0 : -1;
          break;
        }
        n *= d;
      }
      if (n != t.numel()) throw FormatError("tensor of shape " + shape_string(t.shape) + " holds " +
                                            std::to_string(t.numel()) + " values");
    }
    return t;
  }
  void done() const {
    if (pos_ != n_) throw FormatError(std::to_string(n_ - pos_) + " unread bytes at the end of a record");
  }

 private:
  void need(uint64_t k) const {
    if (k > n_ - pos_) throw FormatError("record ends early");
  }
  const char* p_;
  size_t n_, pos_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Payloads
// ---------------------------------------------------------------------------------------------------

std::string encode_header(const Header& h) {
  const auto& m = h.meta;
  nlohmann::json j = {{"engine", m.engine},
                      {"engine_options", m.engine_options},
                      {"engine_dtype", m.engine_dtype},
                      {"device", m.device},
                      {"model", m.model},
                      {"run_options", m.run_options},
                      {"tp", m.tp},
                      {"mode", m.mode},
                      {"seed", m.seed},
                      {"inject", m.inject},
                      {"probe_level", m.probe_level},
                      {"command", m.command},
                      {"process_rank", m.process_rank},
                      {"processes", m.processes},
                      {"launch_id", m.launch_id},
                      {"created_utc", h.created_utc},
                      {"tool_version", h.tool_version},
                      {"git_sha", h.git_sha}};
  Out o;
  o.str(kHeaderMagic);
  o.u32(kVersion);
  o.str(j.dump());
  o.u32(h.has_inputs ? 1 : 0);
  if (h.has_inputs) {
    const auto& in = h.inputs;
    const auto& b = in.batch;
    o.tensor(in.x);
    o.vec(b.new_lens);
    o.vec(b.context_lens);
    o.vec(b.positions);
    o.vec(b.token_seq);
    o.vec(b.block_table);
    o.i32(b.max_blocks);
    o.i32(b.num_blocks);
    o.u64(in.kv_cache.size());
    for (const auto& c : in.kv_cache) o.tensor(c);
    o.u64(in.index_cache.size());
    for (const auto& c : in.index_cache) o.tensor(c);
  }
  return o.take();
}

namespace {
// A header's integer: a JSON integer within T's range (nlohmann would convert 1e20 to an int: undefined behaviour).
template <class T> T header_integer(const nlohmann::json& j, const char* key, std::optional<T> fallback = {}) {
  const auto it = j.find(key);
  if (it == j.end() && fallback) return *fallback;
  if (it == j.end()) throw FormatError(std::string("header metadata: no '") + key + "'");
  using L = std::numeric_limits<T>;
  bool fits = false;  // a uint64 takes a negative integer's 64 bits
  if (it->is_number_unsigned()) {
    fits = it->get<uint64_t>() <= static_cast<uint64_t>(L::max());
  } else if (it->is_number_integer()) {
    const int64_t v = it->get<int64_t>();
    fits = v >= 0 ? static_cast<uint64_t>(v) <= static_cast<uint64_t>(L::max())
                  : !L::is_signed || v >= static_cast<int64_t>(L::min());
  }
  if (!fits)
    throw FormatError(std::string("header metadata: '") + key + "' is " + it->dump() + ", not an integer in range");
  return it->is_number_unsigned() ? static_cast<T>(it->get<uint64_t>()) : static_cast<T>(it->get<int64_t>());
}
}  // namespace

Header decode_header(const std::string& payload) {
  In in(payload);
  if (in.str() != kHeaderMagic) throw FormatError("not an mla-bisect journal (bad header magic)");
  const uint32_t version = in.u32();
  if (version != kVersion)
    throw FormatError("journal version " + std::to_string(version) + " (this mla-bisect reads " +
                      std::to_string(kVersion) + ")");
  Header h;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in.str());
    auto& m = h.meta;
    m.engine = j.at("engine").get<std::string>();
    m.engine_options = j.at("engine_options").get<std::string>();
    m.engine_dtype = j.at("engine_dtype").get<std::string>();
    m.device = j.at("device").get<std::string>();
    m.model = j.at("model");
    m.run_options = j.at("run_options");
    m.tp = header_integer<int>(j, "tp");
    m.mode = j.at("mode").get<std::string>();
    m.seed = header_integer<uint64_t>(j, "seed");
    m.inject = j.at("inject").get<std::string>();
    m.probe_level = j.at("probe_level").get<std::string>();
    m.command = j.at("command").get<std::string>();
    m.process_rank = header_integer<int>(j, "process_rank", -1);  // absent in journals of one process per run
    m.processes = header_integer<int>(j, "processes", 0);
    m.launch_id = j.value("launch_id", std::string());
    h.created_utc = j.at("created_utc").get<std::string>();
    h.tool_version = j.at("tool_version").get<std::string>();
    h.git_sha = j.at("git_sha").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("header metadata: ") + e.what());
  }
  h.has_inputs = in.u32() != 0;
  if (h.has_inputs) {
    auto& x = h.inputs;
    auto& b = x.batch;
    x.x = in.tensor();
    b.new_lens = in.vec<int>();
    b.context_lens = in.vec<int>();
    b.positions = in.vec<int>();
    b.token_seq = in.vec<int>();
    b.block_table = in.vec<int>();
    b.max_blocks = in.i32();
    b.num_blocks = in.i32();
    const uint64_t layers = in.u64();
    if (layers > (1u << 20)) throw FormatError("implausible layer count in the header");
    for (uint64_t l = 0; l < layers; ++l) x.kv_cache.push_back(in.tensor());
    const uint64_t index_layers = in.u64();
    if (index_layers > (1u << 20)) throw FormatError("implausible index cache layer count in the header");
    for (uint64_t l = 0; l < index_layers; ++l) x.index_cache.push_back(in.tensor());
  }
  in.done();
  return h;
}

std::string encode_probe(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  Out o;
  o.i32(layer);
  o.i32(rank);
  o.str(spec.name);
  o.str(stage_name(spec.stage));
  o.str(contract_name(spec.contract));
  o.vec(spec.shape);
  o.i32(spec.order);
  o.i32(spec.heads_axis);
  o.i32(spec.rope_from);
  o.vec(rec.shape);
  o.str(rec.dtype);
  o.f64(rec.l2);
  o.f64(rec.absmax);
  o.f64(rec.mean);
  o.f64(rec.std);
  o.i64(rec.nan);
  o.i64(rec.inf);
  o.u64(rec.checksum);
  o.vec(rec.token_l2);
  o.vec(rec.head_l2);
  o.vec(rec.sketch);
  o.u32(static_cast<uint32_t>(rec.level));
  o.tensor(rec.data);
  return o.take();
}

ProbeEntry decode_probe(const std::string& payload) {
  In in(payload);
  ProbeEntry e;
  auto& p = e.probe;
  auto& r = e.rec;
  p.layer = in.i32();
  e.rank = in.i32();
  p.name = in.str();
  p.stage = in.str();
  p.contract = in.str();
  p.shape = in.vec<int64_t>();
  p.order = in.i32();
  p.heads_axis = in.i32();
  p.rope_from = in.i32();
  r.shape = in.vec<int64_t>();
  r.dtype = in.str();
  p.engine_dtype = r.dtype;
  r.l2 = in.f64();
  r.absmax = in.f64();
  r.mean = in.f64();
  r.std = in.f64();
  r.nan = in.i64();
  r.inf = in.i64();
  r.checksum = in.u64();
  r.token_l2 = in.vec<float>();
  r.head_l2 = in.vec<float>();
  r.sketch = in.vec<float>();
  const uint32_t level = in.u32();
  if (level > static_cast<uint32_t>(ProbeLevel::ProbeLevel_full)) throw FormatError("bad probe level");
  r.level = static_cast<ProbeLevel>(level);
  r.data = in.tensor();
  in.done();
  if (p.layer < 0 || e.rank < 0 || p.name.empty()) throw FormatError("bad probe record key");
  return e;
}

std::string encode_stage(int layer, Stage stage, int rank) {
  Out o;
  o.i32(layer);
  o.str(stage_name(stage));
  o.i32(rank);
  return o.take();
}

StageEntry decode_stage(const std::string& payload) {
  In in(payload);
  StageEntry e;
  e.layer = in.i32();
  e.stage = in.str();
  e.rank = in.i32();
  in.done();
  if (e.layer < 0 || e.rank < 0) throw FormatError("bad stage marker");
  return e;
}

std::string encode_finish(const std::string& status) {
  Out o;
  o.str(status);
  return o.take();
}

std::string decode_finish(const std::string& payload) {
  In in(payload);
  std::string s = in.str();
  in.done();
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Framing and scanning
// ---------------------------------------------------------------------------------------------------

namespace {
constexpr size_t kFrameHead = 16;  // magic, type, length
constexpr size_t kFrameTail = 4;   // crc

bool pread_all(int fd, char* buf, size_t n, uint64_t off) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, buf, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    buf += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}
}  // namespace

std::string frame(RecordType type, const std::string& payload) {
  std::string out;
  out.reserve(kFrameHead + payload.size() + kFrameTail);
  const uint32_t magic = kRecordMagic, t = static_cast<uint32_t>(type);
  const uint64_t len = payload.size();
  const uint32_t crc = crc32(payload.data(), payload.size());
  out.append(reinterpret_cast<const char*>(&magic), 4);
  out.append(reinterpret_cast<const char*>(&t), 4);
  out.append(reinterpret_cast<const char*>(&len), 8);
  out.append(payload);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out;
}

Scan scan(int fd, const std::string& path) {
  Scan s;
  struct stat st;
  if (::fstat(fd, &st) != 0) throw UsageError(path + ": cannot stat journal: " + std::strerror(errno));
  s.total_bytes = static_cast<uint64_t>(st.st_size);
  uint64_t off = 0;
  while (off < s.total_bytes) {
    const uint64_t left = s.total_bytes - off;
    char head[kFrameHead];
    if (left < kFrameHead) {
      s.problem = "truncated record header at byte " + std::to_string(off);
      break;
    }
    if (!pread_all(fd, head, kFrameHead, off)) throw UsageError(path + ": cannot read journal at byte " + std::to_string(off));
    uint32_t magic, type;
    uint64_t len;
    std::memcpy(&magic, head, 4);
    std::memcpy(&type, head + 4, 4);
    std::memcpy(&len, head + 8, 8);
    if (magic != kRecordMagic) {
      s.problem = "bad record magic at byte " + std::to_string(off);
      break;
    }
    if (type < 1 || type > 5) {
      s.problem = "unknown record type " + std::to_string(type) + " at byte " + std::to_string(off);
      break;
    }
    if (len > left - kFrameHead || left - kFrameHead - len < kFrameTail) {
      s.problem = "truncated record at byte " + std::to_string(off) + " (" + std::to_string(len) +
                  " payload bytes announced, " + std::to_string(left) + " bytes left)";
      break;
    }
    std::string payload(len, '\0');
    uint32_t crc;
    if (!pread_all(fd, payload.data(), len, off + kFrameHead) ||
        !pread_all(fd, reinterpret_cast<char*>(&crc), 4, off + kFrameHead + len))
      throw UsageError(path + ": cannot read journal at byte " + std::to_string(off));
    if (crc32(payload.data(), payload.size()) != crc) {
      s.problem = "CRC mismatch in the record at byte " + std::to_string(off);
      break;
    }
    s.records.push_back({static_cast<RecordType>(type), std::move(payload), off});
    off += kFrameHead + len + kFrameTail;
    s.good_bytes = off;
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------------

void sync_dir(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems do not open directories
  ::fsync(fd);
  ::close(fd);
}

std::string temp_path(const std::string& journal, long pid) { return journal + ".tmp." + std::to_string(pid); }

std::vector<std::string> abandoned_temps(const std::string& journal) {
  namespace fs = std::filesystem;
  const fs::path p(journal);
  const std::string prefix = p.filename().string() + ".tmp.";
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string path = (dir / name).string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat st;
    const bool plain = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (plain && ::flock(fd, LOCK_EX | LOCK_NB) == 0) out.push_back(path);  // its writer is gone
    ::close(fd);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Writer::Writer(std::string path) : path_(std::move(path)), tmp_(temp_path(path_, static_cast<long>(::getpid()))) {
  // The journal this one replaces, locked first: a live writer's journal is never replaced. Another writer may
  // rename its journal over the one just locked; then the lock is on a file no longer at the path: again.
  for (int attempt = 0;; ++attempt) {
    old_fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (old_fd_ < 0) {
      if (errno == ENOENT) break;
      throw UsageError(path_ + ": cannot open the dump journal: " + std::strerror(errno));
    }
    if (::flock(old_fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(old_fd_);
      old_fd_ = -1;
      if (err == EWOULDBLOCK)
        throw UsageError(path_ + ": another running mla-bisect is writing this dump (its journal is locked)");
      throw UsageError(path_ + ": cannot lock the dump journal: " + std::strerror(err));
    }
    struct stat held, now;
    if (::fstat(old_fd_, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
        held.st_ino == now.st_ino)
      break;
    ::close(old_fd_);
    old_fd_ = -1;
    if (attempt >= 3) throw UsageError(path_ + ": another running mla-bisect is writing this dump");
  }
  // Temporary files of writers that are gone say nothing the journal (or its absence) does not.
  for (const auto& t : abandoned_temps(path_)) ::unlink(t.c_str());
  ::unlink(tmp_.c_str());  // this process's own, from an earlier writer of the same path
  fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0 || ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (fd_ >= 0) ::close(fd_), ::unlink(tmp_.c_str());
    if (old_fd_ >= 0) ::close(old_fd_);
    fd_ = old_fd_ = -1;
    throw UsageError(tmp_ + ": cannot create the dump journal: " + std::strerror(err));
  }
}

Writer::~Writer() {
  if (fd_ >= 0 && !published_) ::unlink(tmp_.c_str());
  if (fd_ >= 0) ::close(fd_);
  if (old_fd_ >= 0) ::close(old_fd_);
}

void Writer::publish() {
  bool placed = false;
  if (old_fd_ < 0) {
    // No journal was there: link() puts this one in place only if none appeared meanwhile.
    if (::link(tmp_.c_str(), path_.c_str()) == 0) {
      ::unlink(tmp_.c_str());
      placed = true;
    } else if (errno == EEXIST) {
      throw UsageError(path_ + ": another running mla-bisect started writing this dump");
    }  // a file system without hard links: rename below
  }
  if (!placed && ::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw UsageError(path_ + ": cannot put the dump journal in place (rename from " + tmp_ + "): " +
                     std::strerror(errno));
  published_ = true;
  if (old_fd_ >= 0) ::close(old_fd_);  // the replaced journal, unlinked by the rename
  old_fd_ = -1;
}

void Writer::append(RecordType type, const std::string& payload) {
  const std::string bytes = frame(type, payload);
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw UsageError(path_ + ": cannot append to the dump journal: " + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void Writer::sync() {
  if (::fsync(fd_) != 0) throw UsageError(path_ + ": fsync of the dump journal failed: " + std::strerror(errno));
  if (!published_) publish();
  sync_dir(path_);
}

void Writer::remove() {
  ::unlink((published_ ? path_ : tmp_).c_str());
  published_ = true;  // nothing left to remove on destruction
  if (old_fd_ >= 0) ::close(old_fd_);
  old_fd_ = -1;
  sync_dir(path_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace mla::journal
