// GGUF parsing. Every count is checked against the bytes left before anything is reserved; every size and
// offset is computed with overflow checks (by division); errors name the file, the entry and the offset.
#include "core/weights/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <unordered_set>

#include "core/model/errors.h"
#include "core/weights/formats.h"

namespace mla {

namespace {

constexpr uint64_t kMaxTensorName = 63;  // GGML_MAX_NAME (64) including the terminating NUL
constexpr uint32_t kMaxDims = 4;

std::string at_text(uint64_t off) { return " at offset " + std::to_string(off); }

[[noreturn]] void fail(const Bytes& b, const std::string& what) { throw UsageError(b.origin() + ": " + what); }

bool known_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::GgufType_f64); }

// Bytes of a fixed-size element; 0 for string and array.
uint64_t fixed_size(GgufType t) {
  switch (t) {
    case GgufType::GgufType_u8: case GgufType::GgufType_i8: case GgufType::GgufType_bool: return 1;
    case GgufType::GgufType_u16: case GgufType::GgufType_i16: return 2;
    case GgufType::GgufType_u32: case GgufType::GgufType_i32: case GgufType::GgufType_f32: return 4;
    case GgufType::GgufType_u64: case GgufType::GgufType_i64: case GgufType::GgufType_f64: return 8;
    default: return 0;
  }
}
// The least bytes one element can take: a string is at least its u64 length, an array its u32 type + u64 count.
uint64_t min_size(GgufType t) {
  if (t == GgufType::GgufType_string) return 8;
  if (t == GgufType::GgufType_array) return 12;
  return fixed_size(t);
}

// Reads a scalar of type t at the reader into v.
void read_scalar(ByteReader& r, GgufType t, GgufValue& v, const std::string& what) {
  v.offset = r.pos();
  switch (t) {
    case GgufType::GgufType_u8: v.u = r.read<uint8_t>(what); break;
    case GgufType::GgufType_i8: v.i = r.read<int8_t>(what); break;
    case GgufType::GgufType_u16: v.u = r.read<uint16_t>(what); break;
    case GgufType::GgufType_i16: v.i = r.read<int16_t>(what); break;
    case GgufType::GgufType_u32: v.u = r.read<uint32_t>(what); break;
    case GgufType::GgufType_i32: v.i = r.read<int32_t>(what); break;
    case GgufType::GgufType_u64: v.u = r.read<uint64_t>(what); break;
    case GgufType::GgufType_i64: v.i = r.read<int64_t>(what); break;
    case GgufType::GgufType_f32: v.f = r.read<float>(what); break;
    case GgufType::GgufType_f64: v.f = r.read<double>(what); break;
    case GgufType::GgufType_bool: {
      const uint8_t b = r.read<uint8_t>(what);
      if (b > 1) fail(r.bytes(), what + at_text(v.offset) + ": bool must be 0 or 1, got " + std::to_string(b));
      v.u = b;
      break;
    }
    default: break;
  }
}

// Validates an array's elements (nested arrays included) and skips them. O(bytes) in time, O(1) in memory.
void walk_array(ByteReader& r, GgufValue& v, int depth, const std::string& what) {
  if (depth > kGgufMaxArrayDepth)
    fail(r.bytes(), what + at_text(r.pos()) + ": arrays nested deeper than " + std::to_string(kGgufMaxArrayDepth));
  const uint64_t type_at = r.pos();
  const uint32_t et = r.read<uint32_t>(what + " element type");
  if (!known_type(et)) fail(r.bytes(), what + at_text(type_at) + ": unknown array element type " + std::to_string(et));
  v.elem = static_cast<GgufType>(et);
  const uint64_t count_at = r.pos();
  v.count = r.read<uint64_t>(what + " element count");
  v.elems_offset = r.pos();
  const uint64_t least = min_size(v.elem);
  if (v.count > r.remaining() / least)
    fail(r.bytes(), what + at_text(count_at) + ": " + std::to_string(v.count) + " elements of type " +
                        gguf_type_name(v.elem) + " cannot fit in the " + std::to_string(r.remaining()) + " bytes left");
  if (v.elem == GgufType::GgufType_string) {
    for (uint64_t k = 0; k < v.count; ++k) {
      const uint64_t at = r.pos();
      const uint64_t n = r.read<uint64_t>(what + " string length");
      if (n > r.remaining())
        fail(r.bytes(), what + "[" + std::to_string(k) + "]" + at_text(at) + ": string length " + std::to_string(n) +
                            " exceeds the " + std::to_string(r.remaining()) + " bytes left");
      r.skip(n, what);
    }
  } else if (v.elem == GgufType::GgufType_array) {
    for (uint64_t k = 0; k < v.count; ++k) {
      GgufValue inner;
      walk_array(r, inner, depth + 1, what + "[" + std::to_string(k) + "]");
    }
  } else if (v.elem == GgufType::GgufType_bool) {
    const uint8_t* p = r.bytes().at(r.pos(), v.count, what);
    for (uint64_t k = 0; k < v.count; ++k)
      if (p[k] > 1)
        fail(r.bytes(), what + "[" + std::to_string(k) + "]" + at_text(r.pos() + k) + ": bool must be 0 or 1, got " +
                            std::to_string(p[k]));
    r.skip(v.count, what);
  } else {
    r.skip(v.count * least, what);  // count <= remaining / least: no overflow
  }
}

void read_value(ByteReader& r, GgufType t, GgufValue& v, const std::string& what) {
  v.type = t;
  v.offset = r.pos();
  if (t == GgufType::GgufType_string) {
    const uint64_t n = r.read<uint64_t>(what + " string length");
    if (n > r.remaining())
      fail(r.bytes(), what + at_text(v.offset) + ": string length " + std::to_string(n) + " exceeds the " +
                          std::to_string(r.remaining()) + " bytes left");
    v.str_len = n;
    r.skip(n, what);
  } else if (t == GgufType::GgufType_array) {
    walk_array(r, v, 1, what);
  } else {
    read_scalar(r, t, v, what);
  }
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t limit) { return a != 0 && b > limit / a; }

std::string printable(const std::string& s, size_t max = 80) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') { out += '\\'; out += static_cast<char>(c); }
    else if (c == '\n') out += "\\n";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  if (s.size() > max) out += "...";
  return out;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "?";
}

bool GgufValue::is_int() const {
  switch (type) {
    case GgufType::GgufType_u8: case GgufType::GgufType_i8: case GgufType::GgufType_u16: case GgufType::GgufType_i16:
    case GgufType::GgufType_u32: case GgufType::GgufType_i32: case GgufType::GgufType_u64: case GgufType::GgufType_i64:
      return true;
    default: return false;
  }
}

GgufHeader parse_gguf(const Bytes& file) {
  GgufHeader h;
  ByteReader r(file);
  const uint8_t* magic = file.at(0, 4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    std::string got;
    for (int k = 0; k < 4; ++k) got += (magic[k] >= 0x20 && magic[k] < 0x7f) ? static_cast<char>(magic[k]) : '?';
    fail(file, "not a GGUF file (magic '" + got + "', expected 'GGUF')");
  }
  r.skip(4, "magic");
  h.version = r.read<uint32_t>("version");
  if (h.version == 1) fail(file, "GGUF version 1 is not supported (version 2 or 3 expected)");
  if (h.version == 0x03000000u || h.version == 0x02000000u)
    fail(file, "big-endian GGUF (version bytes byte-swapped) is not supported");
  if (h.version == 0 || h.version > 3) fail(file, "unsupported GGUF version " + std::to_string(h.version) + " (expected 2 or 3)");
  const uint64_t tc_at = r.pos();
  const uint64_t tensor_count = r.read<uint64_t>("tensor count");
  const uint64_t kc_at = r.pos();
  const uint64_t kv_count = r.read<uint64_t>("metadata count");
  // Bound the counts by the bytes left: a KV takes at least 13 bytes, a tensor info at least 24.
  if (kv_count > r.remaining() / 13)
    fail(file, "metadata count " + std::to_string(kv_count) + at_text(kc_at) + " cannot fit in the " +
                   std::to_string(r.remaining()) + " bytes left");
  if (tensor_count > r.remaining() / 24)
    fail(file, "tensor count " + std::to_string(tensor_count) + at_text(tc_at) + " cannot fit in the " +
                   std::to_string(r.remaining()) + " bytes left");

  h.kvs.reserve(kv_count);
  std::unordered_set<std::string> keys;
  const GgufKV* alignment_kv = nullptr;
  for (uint64_t k = 0; k < kv_count; ++k) {
    const uint64_t at = r.pos();
    const std::string which = "metadata entry " + std::to_string(k);
    GgufKV kv;
    kv.key = r.string(kGgufMaxKeyLength, which + " key");
    if (!keys.insert(kv.key).second) fail(file, "duplicate metadata key '" + printable(kv.key) + "'" + at_text(at));
    const uint64_t type_at = r.pos();
    const uint32_t t = r.read<uint32_t>("type of metadata '" + printable(kv.key) + "'");
    if (!known_type(t))
      fail(file, "metadata '" + printable(kv.key) + "'" + at_text(type_at) + ": unknown value type " + std::to_string(t));
    read_value(r, static_cast<GgufType>(t), kv.value, "metadata '" + printable(kv.key) + "'");
    h.kvs.push_back(std::move(kv));
  }
  for (const auto& kv : h.kvs)
    if (kv.key == "general.alignment") alignment_kv = &kv;
  if (alignment_kv) {
    const auto& v = alignment_kv->value;
    if (v.type != GgufType::GgufType_u32)
      fail(file, std::string("general.alignment must be u32, got ") + gguf_type_name(v.type) + at_text(v.offset));
    if (v.u == 0 || (v.u & (v.u - 1)) != 0 || v.u > kGgufMaxAlignment)
      fail(file, "general.alignment " + std::to_string(v.u) + at_text(v.offset) +
                     " must be a power of two between 1 and " + std::to_string(kGgufMaxAlignment));
    h.alignment = v.u;
  }

  h.tensors.reserve(tensor_count);
  std::unordered_set<std::string> names;
  for (uint64_t k = 0; k < tensor_count; ++k) {
    GgufTensorInfo t;
    t.info_offset = r.pos();
    const std::string which = "tensor info " + std::to_string(k);
    {
      const uint64_t n = r.read<uint64_t>(which + " name length");
      if (n > kMaxTensorName)
        fail(file, which + at_text(t.info_offset) + ": name of " + std::to_string(n) + " bytes exceeds " +
                       std::to_string(kMaxTensorName) + " (GGML_MAX_NAME)");
      t.name.assign(reinterpret_cast<const char*>(file.at(r.pos(), n, which + " name")), n);
      r.skip(n, which + " name");
    }
    const std::string who = "tensor '" + printable(t.name) + "'";
    if (!names.insert(t.name).second) fail(file, "duplicate " + who + at_text(t.info_offset));
    const uint64_t nd_at = r.pos();
    const uint32_t n_dims = r.read<uint32_t>(who + " n_dims");
    if (n_dims > kMaxDims)
      fail(file, who + at_text(nd_at) + ": n_dims " + std::to_string(n_dims) + " exceeds " + std::to_string(kMaxDims));
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne_at = r.pos();
      const int64_t ne = r.read<int64_t>(who + " ne[" + std::to_string(d) + "]");
      if (ne < 0) fail(file, who + at_text(ne_at) + ": ne[" + std::to_string(d) + "] = " + std::to_string(ne) + " is negative");
      t.ne.push_back(ne);
    }
    const uint64_t type_at = r.pos();
    t.type = r.read<uint32_t>(who + " type");
    const GgmlTypeInfo* ti = ggml_type_info(t.type);
    if (!ti) fail(file, who + at_text(type_at) + ": unknown ggml type " + std::to_string(t.type));
    t.offset = r.read<uint64_t>(who + " offset");
    // Element count and byte size, checked by division (the CVEs were multiplications that wrapped).
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    uint64_t numel = 1;
    for (int64_t ne : t.ne) {
      if (mul_overflows(numel, static_cast<uint64_t>(ne), kMax))
        fail(file, who + at_text(t.info_offset) + ": element count overflows int64");
      numel *= static_cast<uint64_t>(ne);
    }
    if (t.ne.empty()) numel = 1;
    t.numel = static_cast<int64_t>(numel);
    const uint64_t ne0 = t.ne.empty() ? 1 : static_cast<uint64_t>(t.ne[0]);
    if (ne0 % static_cast<uint64_t>(ti->block) != 0)
      fail(file, who + ": ne[0] = " + std::to_string(ne0) + " is not a multiple of the " + ti->name + " block size " +
                     std::to_string(ti->block) + at_text(t.info_offset));
    const uint64_t blocks = ne0 / static_cast<uint64_t>(ti->block);
    if (mul_overflows(blocks, static_cast<uint64_t>(ti->type_size), kMax))
      fail(file, who + at_text(t.info_offset) + ": byte size overflows");
    const uint64_t row_bytes = blocks * static_cast<uint64_t>(ti->type_size);
    const uint64_t rows = ne0 == 0 ? 0 : numel / ne0;
    if (mul_overflows(row_bytes, rows, kMax)) fail(file, who + at_text(t.info_offset) + ": byte size overflows");
    t.nbytes = row_bytes * rows;
    h.tensors.push_back(std::move(t));
  }

  // Data section: the first multiple of the alignment after the infos; tensors follow in file order,
  // each at the running sum of the previous sizes padded to the alignment.
  const uint64_t a = h.alignment;
  const uint64_t end_of_infos = r.pos();
  h.data_start = (end_of_infos + a - 1) / a * a;  // end_of_infos <= file size < 2^63: no overflow
  if (!h.tensors.empty() && h.data_start > file.size())
    fail(file, "the data section would start at offset " + std::to_string(h.data_start) + ", past the end of the file (" +
                   std::to_string(file.size()) + " bytes; truncated?)");
  uint64_t expected = 0;
  for (const auto& t : h.tensors) {
    const std::string who = "tensor '" + printable(t.name) + "'";
    if (t.offset != expected)
      fail(file, who + ": offset " + std::to_string(t.offset) + " (info" + at_text(t.info_offset) + ") should be " +
                     std::to_string(expected) + ", the padded sizes of the tensors before it");
    const uint64_t data_size = file.size() - h.data_start;
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail(file, who + ": its " + std::to_string(t.nbytes) + " bytes at file offset " +
                     std::to_string(h.data_start + t.offset) + " run past the end of the file (" +
                     std::to_string(file.size()) + " bytes; truncated?)");
    const uint64_t padded = (t.nbytes + a - 1) / a * a;  // nbytes <= file size: no overflow
    expected += padded;
  }
  return h;
}

namespace {
const GgufKV* find_kv_in(const GgufHeader& h, const std::string& key) {
  for (const auto& kv : h.kvs)
    if (kv.key == key) return &kv;
  return nullptr;
}
}  // namespace

std::optional<int64_t> gguf_get_int(const Bytes& file, const GgufHeader& h, const std::string& key) {
  const GgufKV* kv = find_kv_in(h, key);
  if (!kv) return std::nullopt;
  const auto& v = kv->value;
  if (!v.is_int())
    throw UsageError(file.origin() + ": metadata '" + key + "' must be an integer, got " + gguf_type_name(v.type) +
                     (v.type == GgufType::GgufType_array ? std::string(" of ") + gguf_type_name(v.elem) : std::string()));
  const bool is_unsigned = v.type == GgufType::GgufType_u8 || v.type == GgufType::GgufType_u16 ||
                           v.type == GgufType::GgufType_u32 || v.type == GgufType::GgufType_u64;
  if (is_unsigned) {
    if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw UsageError(file.origin() + ": metadata '" + key + "' = " + std::to_string(v.u) + " is out of range");
    return static_cast<int64_t>(v.u);
  }
  return v.i;
}

std::optional<double> gguf_get_float(const Bytes& file, const GgufHeader& h, const std::string& key) {
  const GgufKV* kv = find_kv_in(h, key);
  if (!kv) return std::nullopt;
  if (!kv->value.is_float())
    throw UsageError(file.origin() + ": metadata '" + key + "' must be f32 or f64, got " + gguf_type_name(kv->value.type) +
                     (kv->value.type == GgufType::GgufType_array ? std::string(" of ") + gguf_type_name(kv->value.elem)
                                                                  : std::string()));
  return kv->value.f;
}

std::string gguf_string(const Bytes& file, const GgufValue& v) {
  const uint8_t* p = file.at(v.offset + 8, v.str_len, "string");
  return std::string(reinterpret_cast<const char*>(p), v.str_len);
}

std::optional<std::string> gguf_get_string(const Bytes& file, const GgufHeader& h, const std::string& key) {
  const GgufKV* kv = find_kv_in(h, key);
  if (!kv) return std::nullopt;
  if (kv->value.type != GgufType::GgufType_string)
    throw UsageError(file.origin() + ": metadata '" + key + "' must be a string, got " + gguf_type_name(kv->value.type));
  return gguf_string(file, kv->value);
}

std::vector<GgufValue> gguf_array_elements(const Bytes& file, const GgufValue& v, size_t max_items) {
  std::vector<GgufValue> out;
  if (v.type != GgufType::GgufType_array) return out;
  ByteReader r(file, v.elems_offset);
  const size_t n = static_cast<size_t>(std::min<uint64_t>(v.count, max_items));
  out.reserve(n);  // max_items is the caller's bound, count is bounded by the file
  for (size_t k = 0; k < n; ++k) {
    GgufValue e;
    if (v.elem == GgufType::GgufType_array) {
      e.type = GgufType::GgufType_array;
      e.offset = r.pos();
      walk_array(r, e, 1, "array element");
    } else {
      read_value(r, v.elem, e, "array element");
    }
    out.push_back(e);
  }
  return out;
}

std::string gguf_value_text(const Bytes& file, const GgufValue& v, size_t max_items) {
  switch (v.type) {
    case GgufType::GgufType_u8: case GgufType::GgufType_u16: case GgufType::GgufType_u32: case GgufType::GgufType_u64:
      return std::to_string(v.u);
    case GgufType::GgufType_i8: case GgufType::GgufType_i16: case GgufType::GgufType_i32: case GgufType::GgufType_i64:
      return std::to_string(v.i);
    case GgufType::GgufType_f32: case GgufType::GgufType_f64: return number_text(v.f);
    case GgufType::GgufType_bool: return v.u ? "true" : "false";
    case GgufType::GgufType_string: return "\"" + printable(gguf_string(file, v)) + "\"";
    case GgufType::GgufType_array: {
      std::string s = std::string("[") + gguf_type_name(v.elem) + " x " + std::to_string(v.count) + "]";
      const auto elems = gguf_array_elements(file, v, max_items);
      for (size_t k = 0; k < elems.size(); ++k)
        s += (k ? ", " : " ") + gguf_value_text(file, elems[k], v.elem == GgufType::GgufType_array ? 2 : max_items);
      if (v.count > elems.size()) s += ", ...";
      return s;
    }
  }
  return "?";
}

GgufFile::GgufFile(const std::string& path)
    : file_(std::make_shared<MappedFile>(path)), header_(parse_gguf(file_->bytes())) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) tensor_index_[header_.tensors[i].name] = i;
}

const GgufKV* GgufFile::find_kv(const std::string& key) const { return find_kv_in(header_, key); }

const GgufTensorInfo* GgufFile::find(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &header_.tensors[it->second];
}

Bytes GgufFile::data(const GgufTensorInfo& t) const {
  return file_->bytes().sub(header_.data_start + t.offset, t.nbytes, "tensor '" + t.name + "' data");
}

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return std::filesystem::path(path).extension() == ".gguf" && !std::filesystem::is_directory(path, ec);
}

}  // namespace mla
