// GGUF (v2/v3) reader: header, metadata of every type (nested arrays included), tensor infos,
// alignment, with every check of the reference reader and its CVE fixes. Metadata values are kept as
// offsets into the mapping (nothing is copied but keys and tensor names), so memory stays proportional to
// the number of entries, which the parser bounds by the bytes left before reserving anything.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/weights/mapped_file.h"

namespace mla {

enum class GgufType : uint32_t {
  GgufType_u8 = 0, GgufType_i8 = 1, GgufType_u16 = 2, GgufType_i16 = 3, GgufType_u32 = 4, GgufType_i32 = 5,
  GgufType_f32 = 6, GgufType_bool = 7, GgufType_string = 8, GgufType_array = 9, GgufType_u64 = 10,
  GgufType_i64 = 11, GgufType_f64 = 12,
};
const char* gguf_type_name(GgufType t);

struct GgufValue {
  GgufType type = GgufType::GgufType_u8;
  uint64_t offset = 0;     // file offset of the value's bytes
  uint64_t u = 0;          // unsigned scalars, bool
  int64_t i = 0;           // signed scalars
  double f = 0;            // f32, f64
  uint64_t str_len = 0;    // strings: bytes at offset + 8
  GgufType elem = GgufType::GgufType_u8;  // arrays: element type, count, elements from elems_offset
  uint64_t count = 0;
  uint64_t elems_offset = 0;
  bool is_int() const;
  bool is_float() const { return type == GgufType::GgufType_f32 || type == GgufType::GgufType_f64; }
};

struct GgufKV {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // innermost first: an HF [out, in] matrix has ne = [in, out]
  uint32_t type = 0;        // ggml type id
  uint64_t offset = 0;      // relative to the data section
  uint64_t nbytes = 0;
  int64_t numel = 0;
  uint64_t info_offset = 0;  // where its info starts in the file (for errors)
  std::vector<int64_t> shape() const { return {ne.rbegin(), ne.rend()}; }  // outermost first (row-major)
};

struct GgufHeader {
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_start = 0;
  std::vector<GgufKV> kvs;               // file order
  std::vector<GgufTensorInfo> tensors;   // file order
};

// Limits beyond the reference reader's (ggml's gguf.cpp) checks, each far above any real file.
constexpr int kGgufMaxArrayDepth = 8;
constexpr uint64_t kGgufMaxKeyLength = 65535;
constexpr uint64_t kGgufMaxAlignment = uint64_t{1} << 20;

GgufHeader parse_gguf(const Bytes& file);

// Typed metadata access. Integer keys accept any integer type (u8..i64); float keys f32 or f64; anything
// else (a string, a bool, an array where a number is expected) is a UsageError naming the key and both types.
std::optional<int64_t> gguf_get_int(const Bytes& file, const GgufHeader& h, const std::string& key);
std::optional<double> gguf_get_float(const Bytes& file, const GgufHeader& h, const std::string& key);
std::optional<std::string> gguf_get_string(const Bytes& file, const GgufHeader& h, const std::string& key);
std::string gguf_string(const Bytes& file, const GgufValue& v);
// The first max_items elements of an array value (nested arrays come back as array values).
std::vector<GgufValue> gguf_array_elements(const Bytes& file, const GgufValue& v, size_t max_items);
// A value for people: scalars in full, strings quoted and cut at 80 bytes, arrays as
// "[type x count] first, ..." with at most max_items elements (nested arrays summarized).
std::string gguf_value_text(const Bytes& file, const GgufValue& v, size_t max_items = 6);

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const GgufHeader& header() const { return header_; }
  Bytes bytes() const { return file_->bytes(); }
  const GgufKV* find_kv(const std::string& key) const;
  const GgufTensorInfo* find(const std::string& name) const;
  Bytes data(const GgufTensorInfo& t) const;
  std::optional<int64_t> get_int(const std::string& key) const { return gguf_get_int(bytes(), header_, key); }
  std::optional<double> get_float(const std::string& key) const { return gguf_get_float(bytes(), header_, key); }
  std::optional<std::string> get_string(const std::string& key) const { return gguf_get_string(bytes(), header_, key); }

 private:
  std::shared_ptr<MappedFile> file_;
  GgufHeader header_;
  std::map<std::string, size_t> tensor_index_;
};

bool is_gguf_path(const std::string& path);

}  // namespace mla
