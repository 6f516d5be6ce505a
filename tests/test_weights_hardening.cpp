// Weight files are untrusted. A known-bad corpus (every check the readers make has a file that trips it, and
// its message is tested), truncation at every byte offset (a clear error, never a crash), and allocation
// bounded by the file's size: counted by a replacement operator new, active only inside these tests.
//
// MLA_WRITE_FUZZ_CORPUS=DIR writes the valid and bad files as seed corpora for tests/fuzz/.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <new>

#include "core/model/config.h"
#include "core/model/errors.h"
#include "core/weights/checkpoint_config.h"
#include "core/weights/dequant.h"
#include "core/weights/gguf.h"
#include "core/weights/safetensors.h"
#include "tests/test_weights_util.h"

// ---- allocation accounting (the whole test binary uses these; they count only while armed) ----
namespace {
std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_bytes{0}, g_largest{0};
void* counted_alloc(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_bytes.fetch_add(n, std::memory_order_relaxed);
    uint64_t prev = g_largest.load(std::memory_order_relaxed);
    while (n > prev && !g_largest.compare_exchange_weak(prev, n)) {
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
}  // namespace
void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using namespace mla;
using namespace mla::test;

// Every byte allocated while parsing, in total (an upper bound on the peak). Linear in the file: a tensor
// info or KV entry costs a bounded multiple of its bytes on disk; the constant covers error messages.
constexpr uint64_t kAllocPerFileByte = 16;
constexpr uint64_t kAllocConstant = 64 * 1024;

struct ParseOutcome {
  bool ok = false;
  std::string error;
  uint64_t allocated = 0, largest = 0;
};

ParseOutcome parse_counted(const std::function<void()>& parse) {
  ParseOutcome o;
  g_bytes = 0;
  g_largest = 0;
  g_counting = true;
  try {
    parse();
    o.ok = true;
  } catch (const UsageError& e) {
    g_counting = false;
    o.error = e.what();
  } catch (...) {
    g_counting = false;
    o.error = "NOT A UsageError";
  }
  g_counting = false;
  o.allocated = g_bytes;
  o.largest = g_largest;
  return o;
}

ParseOutcome parse_gguf_bytes(const std::vector<uint8_t>& b, const std::string& name = "bad.gguf") {
  return parse_counted([&] { parse_gguf(Bytes(b.data(), b.size(), name)); });
}
ParseOutcome parse_st_bytes(const std::vector<uint8_t>& b, const std::string& name = "bad.safetensors") {
  return parse_counted([&] { parse_safetensors(Bytes(b.data(), b.size(), name)); });
}

void expect_bounded(const ParseOutcome& o, size_t file_size, const std::string& what) {
  EXPECT_LE(o.allocated, kAllocPerFileByte * file_size + kAllocConstant)
      << what << ": allocated " << o.allocated << " bytes for a " << file_size << "-byte file";
}

const char* corpus_dir() { return std::getenv("MLA_WRITE_FUZZ_CORPUS"); }
void to_corpus(const std::string& sub, const std::string& name, const std::vector<uint8_t>& b) {
  if (const char* d = corpus_dir()) write_file(std::filesystem::path(d) / sub / name, b);
}

// ---------------------------------------------------------------- GGUF corpus

struct GgufCase {
  const char* name;
  std::function<void(ByteWriter&)> mutate;  // applied to small_gguf()
  const char* message;                      // a substring the error must contain
};

// An array nested `depth` levels deep, as a whole file with one KV and no tensors.
std::vector<uint8_t> nested_gguf(int depth) {
  ByteWriter w;
  w.raw("GGUF");
  w.put<uint32_t>(3);
  w.put<uint64_t>(0);
  w.put<uint64_t>(1);
  w.str("deep");
  w.put<uint32_t>(9);
  for (int d = 1; d < depth; ++d) {
    w.put<uint32_t>(9);
    w.put<uint64_t>(1);
  }
  w.put<uint32_t>(0);
  w.put<uint64_t>(1);
  w.put<uint8_t>(7);
  return w.b;
}

const std::vector<GgufCase>& gguf_cases() {
  static const std::vector<GgufCase> cases = {
      {"magic", [](ByteWriter& w) { w.b[0] = 'X'; }, "not a GGUF file (magic 'XGUF'"},
      {"version1", [](ByteWriter& w) { w.set<uint32_t>(w.mark["version"], 1); }, "GGUF version 1 is not supported"},
      {"version4", [](ByteWriter& w) { w.set<uint32_t>(w.mark["version"], 4); }, "unsupported GGUF version 4"},
      {"big_endian", [](ByteWriter& w) { w.set<uint32_t>(w.mark["version"], 0x03000000u); }, "big-endian GGUF"},
      {"tensor_count_huge", [](ByteWriter& w) { w.set<uint64_t>(w.mark["tensor_count"], uint64_t{1} << 60); },
       "tensor count 1152921504606846976 at offset 8 cannot fit"},
      {"kv_count_huge", [](ByteWriter& w) { w.set<uint64_t>(w.mark["kv_count"], ~uint64_t{0}); },
       "metadata count 18446744073709551615 at offset 16 cannot fit"},
      {"key_length_huge", [](ByteWriter& w) { w.set<uint64_t>(w.mark["kv_key_len"], uint64_t{1} << 40); },
       "metadata entry 0 key at offset 24: length 1099511627776 exceeds the limit of 65535"},
      {"key_past_end", [](ByteWriter& w) { w.set<uint64_t>(w.mark["kv_key_len"], 60000); }, "metadata entry 0 key (60000 bytes)"},
      {"value_type_unknown", [](ByteWriter& w) { w.set<uint32_t>(w.mark["align_type"], 13); }, "unknown value type 13"},
      {"array_count_huge", [](ByteWriter& w) { w.set<uint64_t>(w.mark["arr_count"], uint64_t{1} << 62); },
       "elements of type u8 cannot fit in the"},
      {"nested_count_huge", [](ByteWriter& w) { w.set<uint64_t>(w.mark["nested_count"], uint64_t{1} << 40); },
       "elements of type array cannot fit"},
      {"bool_not_0_1", [](ByteWriter& w) { w.b[w.mark["bool_value"]] = 2; }, "bool must be 0 or 1, got 2"},
      {"duplicate_key", [](ByteWriter& w) { std::memcpy(w.b.data() + w.mark["flag_key"] + 8, "test.f32", 8); },
       "duplicate metadata key 'test.f32'"},
      {"alignment_type", [](ByteWriter& w) { w.set<uint32_t>(w.mark["align_type"], 6); }, "general.alignment must be u32, got f32"},
      {"alignment_not_pow2", [](ByteWriter& w) { w.set<uint32_t>(w.mark["align_value"], 48); },
       "general.alignment 48 at offset"},
      {"alignment_zero", [](ByteWriter& w) { w.set<uint32_t>(w.mark["align_value"], 0); }, "must be a power of two"},
      {"alignment_huge", [](ByteWriter& w) { w.set<uint32_t>(w.mark["align_value"], 1u << 30); }, "must be a power of two between 1 and 1048576"},
      {"tensor_name_long", [](ByteWriter& w) { w.set<uint64_t>(w.mark["t0_name_len"], 64); }, "name of 64 bytes exceeds 63"},
      {"duplicate_tensor", [](ByteWriter& w) { std::memcpy(w.b.data() + w.mark["t0_name_len"] + 8, "mat", 3); },
       "duplicate tensor 'mat'"},
      {"n_dims", [](ByteWriter& w) { w.set<uint32_t>(w.mark["t0_ndims"], 5); }, "n_dims 5 exceeds 4"},
      {"ne_negative", [](ByteWriter& w) { w.set<int64_t>(w.mark["t0_ne0"], -4); }, "ne[0] = -4 is negative"},
      {"type_unknown", [](ByteWriter& w) { w.set<uint32_t>(w.mark["t0_type"], 99); }, "unknown ggml type 99"},
      {"ne0_not_block_multiple", [](ByteWriter& w) { w.set<int64_t>(w.mark["t1_ne0"], 33); },
       "ne[0] = 33 is not a multiple of the Q8_0 block size 32"},
      {"element_count_overflow", [](ByteWriter& w) {
         w.set<int64_t>(w.mark["t1_ne0"], int64_t{1} << 40);
         w.set<int64_t>(w.mark["t1_ne0"] + 8, int64_t{1} << 30);
       }, "element count overflows int64"},
      {"byte_size_overflow", [](ByteWriter& w) { w.set<int64_t>(w.mark["t0_ne0"], int64_t{1} << 62); }, "byte size overflows"},
      {"offset_mismatch", [](ByteWriter& w) { w.set<uint64_t>(w.mark["t1_offset"], 16); }, "tensor 'mat': offset 16"},
      {"offset_not_first", [](ByteWriter& w) { w.set<uint64_t>(w.mark["t0_offset"], 32); }, "should be 0, the padded sizes"},
      {"data_past_end", [](ByteWriter& w) { w.b.resize(w.b.size() - 1); }, "tensor 'mat': its 68 bytes at file offset"},
      {"tensor_too_large", [](ByteWriter& w) { w.set<int64_t>(w.mark["t0_ne0"], int64_t{1} << 40); }, "run past the end of the file"},
      {"data_start_past_end", [](ByteWriter& w) { w.b.resize(w.mark["data"] - 1); }, "the data section would start at offset"},
  };
  return cases;
}

TEST(WeightsHardening, GgufKnownBadCorpus) {
  const auto good = small_gguf();
  to_corpus("gguf", "valid_small.gguf", good.b);
  ASSERT_TRUE(parse_gguf_bytes(good.b).ok) << parse_gguf_bytes(good.b).error;
  for (const auto& c : gguf_cases()) {
    SCOPED_TRACE(c.name);
    ByteWriter w = small_gguf();
    c.mutate(w);
    to_corpus("gguf", std::string("bad_") + c.name + ".gguf", w.b);
    const auto o = parse_gguf_bytes(w.b, "bad.gguf");
    ASSERT_FALSE(o.ok) << "parsed without error";
    EXPECT_NE(o.error.find(c.message), std::string::npos) << "message: " << o.error;
    EXPECT_EQ(o.error.rfind("bad.gguf: ", 0), 0u) << "the error must name the file: " << o.error;
    expect_bounded(o, w.b.size(), c.name);
  }
  // Nesting: 8 levels are fine, 9 are not.
  EXPECT_TRUE(parse_gguf_bytes(nested_gguf(8)).ok) << parse_gguf_bytes(nested_gguf(8)).error;
  const auto deep = parse_gguf_bytes(nested_gguf(9));
  to_corpus("gguf", "bad_nested9.gguf", nested_gguf(9));
  EXPECT_NE(deep.error.find("arrays nested deeper than 8"), std::string::npos) << deep.error;
  // A string array whose strings claim more than is left.
  ByteWriter s;
  s.raw("GGUF"), s.put<uint32_t>(3), s.put<uint64_t>(0), s.put<uint64_t>(1), s.str("strs"), s.put<uint32_t>(9);
  s.put<uint32_t>(8), s.put<uint64_t>(2), s.str("ok"), s.put<uint64_t>(1000), s.raw("short");
  const auto so = parse_gguf_bytes(s.b);
  EXPECT_NE(so.error.find("metadata 'strs'[1] at offset"), std::string::npos) << so.error;
  EXPECT_NE(so.error.find("string length 1000 exceeds the 5 bytes left"), std::string::npos) << so.error;
}

TEST(WeightsHardening, GgufAlignmentsAndEmptyFilesAreHandled) {
  for (uint32_t a : {1u, 8u, 64u, 4096u}) {
    const auto w = small_gguf(a);
    const auto o = parse_gguf_bytes(w.b);
    EXPECT_TRUE(o.ok) << "alignment " << a << ": " << o.error;
  }
  ByteWriter w;
  w.raw("GGUF"), w.put<uint32_t>(3), w.put<uint64_t>(0), w.put<uint64_t>(0);
  EXPECT_TRUE(parse_gguf_bytes(w.b).ok);  // no metadata, no tensors: valid
}

TEST(WeightsHardening, GgufTruncatedAtEveryOffset) {
  const auto good = small_gguf();
  size_t errors = 0;
  for (size_t n = 0; n < good.b.size(); ++n) {
    const std::vector<uint8_t> cut(good.b.begin(), good.b.begin() + static_cast<std::ptrdiff_t>(n));
    const auto o = parse_gguf_bytes(cut, "cut.gguf");
    ASSERT_FALSE(o.ok) << "a " << n << "-byte prefix parsed";  // the last tensor ends the file: every cut is bad
    ASSERT_NE(o.error, "NOT A UsageError") << "at " << n;
    ASSERT_EQ(o.error.rfind("cut.gguf: ", 0), 0u) << o.error;
    expect_bounded(o, n, "cut at " + std::to_string(n));
    ++errors;
  }
  EXPECT_EQ(errors, good.b.size());
}

TEST(WeightsHardening, GgufWrittenByGgufPyTruncatedAtEveryOffset) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  // The metadata-heavy file, cut everywhere in its header and at a stride through its data.
  const std::string s = slurp_file(fx.at("gguf_quants.gguf"));
  const std::vector<uint8_t> bytes(s.begin(), s.end());
  const GgufHeader h = parse_gguf(Bytes(bytes.data(), bytes.size(), "full"));
  size_t tried = 0;
  for (size_t n = 0; n < bytes.size(); n += n < h.data_start + 64 ? 1 : 97) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    const auto o = parse_gguf_bytes(cut, "cut.gguf");
    ASSERT_NE(o.error, "NOT A UsageError") << "at " << n;
    if (!o.ok) ASSERT_EQ(o.error.rfind("cut.gguf: ", 0), 0u) << o.error;
    expect_bounded(o, n, "cut at " + std::to_string(n));
    ++tried;
  }
  EXPECT_GT(tried, h.data_start);
}

// ---------------------------------------------------------------- safetensors corpus

struct StCase {
  const char* name;
  std::vector<uint8_t> bytes;
  const char* message;
};

std::vector<uint8_t> st_with(const std::string& header, size_t data_bytes) {
  return small_safetensors(header, std::vector<uint8_t>(data_bytes, 0));
}

std::vector<StCase> st_cases() {
  const auto good = small_safetensors();
  std::vector<StCase> c;
  c.push_back({"too_small", {1, 2, 3}, "3 bytes, too small for a safetensors file"});
  {
    auto b = good;
    const uint64_t n = 100'000'001;
    std::memcpy(b.data(), &n, 8);
    c.push_back({"header_len_limit", b, "header length 100000001 (bytes 0..7) exceeds the limit"});
  }
  {
    auto b = good;
    const uint64_t n = b.size();
    std::memcpy(b.data(), &n, 8);
    c.push_back({"header_past_end", b, "runs past the end of the file"});
  }
  c.push_back({"not_json", st_with("{\"a\":", 0), "header is not valid JSON"});
  c.push_back({"bad_utf8", st_with("{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0),
               "header is not valid JSON"});
  c.push_back({"trailing_garbage", st_with("{} x", 0), "header is not valid JSON"});
  c.push_back({"not_object", st_with("[1,2]", 0), "expected a JSON object at the top level"});
  c.push_back({"duplicate_name",
               st_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               "duplicate tensor name 'a'"});
  c.push_back({"duplicate_field", st_with(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", 4),
               "duplicate key 'dtype' in 'a'"});
  c.push_back({"unknown_dtype", st_with(R"({"a":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})", 4), "unknown dtype 'F12'"});
  c.push_back({"shape_negative", st_with(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
               "shape entries must be non-negative integers, got the negative number -1"});
  c.push_back({"shape_float", st_with(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
               "shape entries must be non-negative integers, got the non-integer number 1.5"});
  c.push_back({"shape_huge", st_with(R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4),
               "shape dimension 18446744073709551615 is too large"});
  c.push_back({"offsets_three", st_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4),
               "data_offsets must have exactly 2 entries"});
  c.push_back({"offsets_reversed", st_with(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4),
               "end before they begin"});
  c.push_back({"size_mismatch", st_with(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
               "tensor 'a' (F32 [2,2]) needs 16 bytes but its data_offsets [0, 12) span 12"});
  c.push_back({"gap", st_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
               "tensor 'b': data_offsets [8, 12) do not start where the previous tensor ends (4): a gap"});
  c.push_back({"overlap", st_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               "an overlap"});
  c.push_back({"not_from_zero", st_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "a gap"});
  {
    auto b = good;
    b.push_back(0);
    c.push_back({"trailing_bytes", b, "trailing bytes after the last tensor"});
  }
  {
    auto b = good;
    b.pop_back();
    c.push_back({"truncated_data", b, "(truncated)"});
  }
  c.push_back({"f4_odd", st_with(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
               "3 elements of 4 bits are not a whole number of bytes"});
  c.push_back({"numel_overflow", st_with(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4),
               "element count overflows"});
  c.push_back({"bytes_overflow", st_with(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4]}})", 4),
               "byte size overflows"});
  c.push_back({"too_deep", st_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":)" + std::string(70, '[') +
                                       std::string(70, ']') + "}}", 4),
               "JSON nested deeper than 64 levels"});
  c.push_back({"missing_dtype", st_with(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "missing field 'dtype'"});
  c.push_back({"missing_offsets", st_with(R"({"a":{"dtype":"F32","shape":[1]}})", 4), "missing field 'data_offsets'"});
  c.push_back({"dtype_not_string", st_with(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4),
               "field 'dtype' has the wrong type"});
  c.push_back({"metadata_not_string", st_with(R"({"__metadata__":{"k":1}})", 0), "__metadata__['k'] must be a string"});
  c.push_back({"entry_not_object", st_with(R"({"a":3})", 0), "entry 'a' must be an object"});
  return c;
}

TEST(WeightsHardening, SafetensorsKnownBadCorpus) {
  const auto good = small_safetensors();
  to_corpus("safetensors", "valid_small.safetensors", good);
  ASSERT_TRUE(parse_st_bytes(good).ok) << parse_st_bytes(good).error;
  // Unknown fields are ignored (as the reference implementation does), whatever their nesting.
  EXPECT_TRUE(parse_st_bytes(st_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":{"x":[1,{"y":null}]}},"__metadata__":null})", 4)).ok);
  EXPECT_TRUE(parse_st_bytes(st_with("  {}  ", 0)).ok);  // whitespace around the object
  for (const auto& c : st_cases()) {
    SCOPED_TRACE(c.name);
    to_corpus("safetensors", std::string("bad_") + c.name + ".safetensors", c.bytes);
    const auto o = parse_st_bytes(c.bytes);
    ASSERT_FALSE(o.ok) << "parsed without error";
    EXPECT_NE(o.error.find(c.message), std::string::npos) << "message: " << o.error;
    EXPECT_EQ(o.error.rfind("bad.safetensors: ", 0), 0u) << o.error;
    expect_bounded(o, c.bytes.size(), c.name);
  }
}

TEST(WeightsHardening, SafetensorsTruncatedAtEveryOffset) {
  std::vector<std::vector<uint8_t>> files = {small_safetensors()};
  const auto& fx = weight_fixtures();
  if (fx.skip.empty()) {
    const std::string s = slurp_file(fx.at("st_dtypes.safetensors"));
    files.emplace_back(s.begin(), s.end());
  }
  for (const auto& good : files) {
    for (size_t n = 0; n < good.size(); ++n) {
      const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
      const auto o = parse_st_bytes(cut, "cut.safetensors");
      ASSERT_FALSE(o.ok) << "a " << n << "-byte prefix of a " << good.size() << "-byte file parsed";
      ASSERT_EQ(o.error.rfind("cut.safetensors: ", 0), 0u) << o.error;
      expect_bounded(o, n, "cut at " + std::to_string(n));
    }
  }
}

TEST(WeightsHardening, CountsAreCheckedBeforeAnythingIsReserved) {
  // 2^40 tensor infos claimed in a 40-byte file: the error comes before any allocation of that order.
  ByteWriter w;
  w.raw("GGUF"), w.put<uint32_t>(3), w.put<uint64_t>(uint64_t{1} << 40), w.put<uint64_t>(0);
  w.put<uint64_t>(0), w.put<uint64_t>(0);
  const auto o = parse_gguf_bytes(w.b);
  EXPECT_FALSE(o.ok);
  EXPECT_LT(o.largest, 4096u) << "largest single allocation";
}

// The fuzzers' seed corpora (tests/fuzz/corpus: valid files, the known-bad corpus, and every input a fuzzer
// once found) replayed in the ordinary build: each parses or fails with a UsageError, nothing else.
TEST(WeightsHardening, FuzzSeedCorporaReplay) {
  const std::filesystem::path root = MLA_SOURCE_DIR "/tests/fuzz/corpus";
  ASSERT_TRUE(std::filesystem::is_directory(root)) << root;
  std::map<std::string, int> seen, ok;
  for (const auto& sub : {"safetensors", "gguf", "config"}) {
    for (const auto& e : std::filesystem::directory_iterator(root / sub)) {
      const std::string s = slurp_file(e.path());
      const std::vector<uint8_t> b(s.begin(), s.end());
      ParseOutcome o;
      if (std::string(sub) == "safetensors") {
        o = parse_st_bytes(b, e.path().filename().string());
      } else if (std::string(sub) == "gguf") {
        o = parse_counted([&] {
          const Bytes file(b.data(), b.size(), "seed");
          const GgufHeader h = parse_gguf(file);
          for (const auto& kv : h.kvs) (void)gguf_value_text(file, kv.value);
          try {
            (void)config_from_gguf(file, h);  // the seed may well not be an MLA model: a UsageError is fine
          } catch (const UsageError&) {
          }
        });
      } else {
        o = parse_counted([&] { (void)parse_hf_config(s, e.path().filename().string()); });
      }
      ++seen[sub];
      ok[sub] += o.ok;
      EXPECT_NE(o.error, "NOT A UsageError") << e.path();
      if (e.path().filename().string().rfind("valid", 0) == 0) EXPECT_TRUE(o.ok) << e.path() << ": " << o.error;
      if (e.path().filename().string().rfind("bad_", 0) == 0) EXPECT_FALSE(o.ok) << e.path();
    }
  }
  EXPECT_GE(seen["gguf"], 30);
  EXPECT_GE(seen["safetensors"], 30);
  EXPECT_GE(ok["config"], 6);  // the real configs of tests/testdata parse
}

TEST(WeightsHardening, ConfigJsonWithANumberTooLargeIsAUsageError) {
  // fuzz_config's first finding: nlohmann throws out_of_range (not parse_error) for 15E4829.
  try {
    parse_hf_config(R"({"model_type": "deepseek_v3", "hidden_size": 15E4829})", "big.json");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("big.json: malformed JSON"), std::string::npos) << e.what();
  }
}

TEST(WeightsHardening, EmptyTensorsConvertWithoutTouchingMemory) {
  // fuzz_safetensors' first finding: memcpy of zero bytes to a null vector buffer (UB even when empty).
  EXPECT_TRUE(st_to_float(StDtype::StDtype_F32, nullptr, 0).empty());
  std::vector<float> none;
  dequantize_ggml_row(ggml::F32, nullptr, none.data(), 0);
}

}  // namespace
