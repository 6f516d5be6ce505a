// MappedFile (POSIX mmap) and the checked reads of Bytes / ByteReader.
#include "core/weights/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/model/errors.h"

namespace mla {

void Bytes::check(uint64_t offset, uint64_t len, const std::string& what) const {
  if (fits(offset, len)) return;
  const uint64_t left = offset <= size_ ? size_ - offset : 0;
  throw UsageError(origin_ + ": " + what + " at offset " + std::to_string(offset) + ": needs " + std::to_string(len) +
                   " bytes, only " + std::to_string(left) + " left (file size " + std::to_string(size_) +
                   "; truncated or corrupt file)");
}

std::string ByteReader::string(uint64_t max_len, const std::string& what) {
  const uint64_t at = pos_;
  const uint64_t n = read<uint64_t>(what + " length");
  if (n > max_len)
    throw UsageError(b_.origin() + ": " + what + " at offset " + std::to_string(at) + ": length " + std::to_string(n) +
                     " exceeds the limit of " + std::to_string(max_len) + " bytes");
  const uint8_t* p = b_.at(pos_, n, what + " (" + std::to_string(n) + " bytes)");
  pos_ += n;
  return std::string(reinterpret_cast<const char*>(p), n);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UsageError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw UsageError("cannot stat " + path + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError(path + " is not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw UsageError("cannot map " + path + ": " + std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

}  // namespace mla
