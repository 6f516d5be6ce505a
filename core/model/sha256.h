// SHA-256 (FIPS 180-4), lower-case hex: the golden manifest's file hashes and the calibration cache's keys.
#pragma once
#include <cstddef>
#include <string>

namespace mla {

// SHA-256 of a file's bytes. Throws UsageError when it cannot be read.
std::string sha256_file(const std::string& path);
std::string sha256_hex(const void* data, size_t n);

}  // namespace mla
