// Read-only memory-mapped files and bounds-checked byte access for the weight parsers. Weight files are
// untrusted: every read checks offset + len <= size (without overflow) before touching a byte,
// and a failed check is a UsageError naming the file, what was being read and the offset.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

namespace mla {

// A byte range with the name used in errors. Does not own the bytes: a MappedFile (or a fuzzer's buffer)
// must outlive it. Little-endian reads only (every format here is little-endian).
class Bytes {
 public:
  Bytes() = default;
  Bytes(const uint8_t* data, uint64_t size, std::string origin) : data_(data), size_(size), origin_(std::move(origin)) {}

  uint64_t size() const { return size_; }
  const std::string& origin() const { return origin_; }
  bool fits(uint64_t offset, uint64_t len) const { return offset <= size_ && len <= size_ - offset; }
  // Throws UsageError "ORIGIN: WHAT at offset O: needs LEN bytes, only R left (file size S)" when out of range.
  void check(uint64_t offset, uint64_t len, const std::string& what) const;
  // Pointer to [offset, offset + len), checked.
  const uint8_t* at(uint64_t offset, uint64_t len, const std::string& what) const {
    check(offset, len, what);
    return data_ + offset;
  }
  Bytes sub(uint64_t offset, uint64_t len, const std::string& what) const {
    return Bytes(at(offset, len, what), len, origin_);
  }
  template <class T>
  T le(uint64_t offset, const std::string& what) const {
    T v;
    std::memcpy(&v, at(offset, sizeof(T), what), sizeof(T));
    return v;
  }
  const uint8_t* data() const { return data_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string origin_;
};

// RAII read-only mapping of a whole file. Move-only. Pages are loaded on first touch, so parsing a header
// or reading one layer of a large checkpoint reads only those pages.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws UsageError (missing, unreadable, a directory)
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  Bytes bytes() const { return Bytes(data_, size_, path_); }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Sequential little-endian reading over Bytes, for headers (GGUF). Each read is checked and advances.
class ByteReader {
 public:
  explicit ByteReader(Bytes b, uint64_t pos = 0) : b_(std::move(b)), pos_(pos) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return pos_ <= b_.size() ? b_.size() - pos_ : 0; }
  const Bytes& bytes() const { return b_; }

  template <class T>
  T read(const std::string& what) {
    T v = b_.le<T>(pos_, what);
    pos_ += sizeof(T);
    return v;
  }
  void skip(uint64_t n, const std::string& what) {
    b_.check(pos_, n, what);
    pos_ += n;
  }
  // u64 length + bytes; the length is checked against max_len and the bytes left before anything is copied.
  std::string string(uint64_t max_len, const std::string& what);

 private:
  Bytes b_;
  uint64_t pos_;
};

}  // namespace mla
