// Shared by tests/test_weights_*.cpp: the fixture files written by tests/py/make_weight_fixtures.py (gguf,
// safetensors and ml_dtypes as independent producers), byte builders for small valid GGUF and safetensors
// files (the truncation sweep and the known-bad corpus mutate them), and float comparison by bits.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/batch.h"
#include "core/model/weights.h"

namespace mla::test {

// A run of `layers` layers and 4 tokens: what the loader tests load weights for.
inline RunSpec spec_of(int layers, bool input_norm = true) {
  RunSpec s;
  s.layers = layers;
  s.input_norm = input_norm;
  s.tokens = 4;
  return s;
}

// A layer's weight by its LayerWeights field name (input_norm, q_a_proj, ..., o_proj), as the fixtures name them.
inline const Tensor& field(const LayerWeights& w, const std::string& f) {
  if (f == "input_norm") return w.input_norm;
  if (f == "q_a_proj") return w.q_a_proj;
  if (f == "q_a_norm") return w.q_a_norm;
  if (f == "q_b_proj") return w.q_b_proj;
  if (f == "kv_a_proj") return w.kv_a_proj;
  if (f == "kv_a_norm") return w.kv_a_norm;
  if (f == "kv_b_proj") return w.kv_b_proj;
  if (f == "o_proj") return w.o_proj;
  throw std::invalid_argument("no LayerWeights field named " + f);
}

inline std::string slurp_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<float> read_f32(const std::filesystem::path& p) {
  const std::string s = slurp_file(p);
  std::vector<float> v(s.size() / 4);
  std::memcpy(v.data(), s.data(), v.size() * 4);
  return v;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Bit-identical, except that any NaN equals any NaN (numpy and C++ may differ in NaN payloads).
inline bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b); }

// First index where two arrays differ by bits, or -1; the message says where and what.
inline ::testing::AssertionResult bit_equal(const std::vector<float>& got, const std::vector<float>& want,
                                            const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, expected " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (!same_float(got[i], want[i]))
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << got[i] << " (0x" << std::hex
                                           << float_bits(got[i]) << "), expected " << want[i] << " (0x"
                                           << float_bits(want[i]) << std::dec << ")";
  return ::testing::AssertionSuccess();
}

inline std::filesystem::path scratch(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("mla_test_weights_" + std::to_string(getpid())) / name;
  std::filesystem::create_directories(d);
  return d;
}

// The Python fixtures, made once per process. skip is non-empty (and says why) when they cannot be made.
struct Fixtures {
  std::filesystem::path dir;
  std::string skip;
  nlohmann::json manifest;
  std::filesystem::path at(const std::string& rel) const { return dir / rel; }
  std::vector<float> expected(const nlohmann::json& entry) const { return read_f32(dir / entry.at("file").get<std::string>()); }
};

// Runs tests/py/SCRIPT into a scratch folder once and reads its manifest; a missing Python module (exit 3) skips,
// any other failure fails the tests that need the fixtures. `what`: the packages the fixtures stand for.
inline Fixtures make_fixtures(const std::string& script, const std::string& scratch_name, const std::string& what) {
  Fixtures f;
  const std::string py = MLA_PYTHON_EXE;
  if (py.empty()) {
    f.skip = "MLA_PYTHON is not set at configure time: tests against " + what + " skipped";
    return f;
  }
  f.dir = scratch(scratch_name);
  const auto log = f.dir / "make.log";
  const std::string cmd = "'" + py + "' '" MLA_SOURCE_DIR "/tests/py/" + script + "' '" + f.dir.string() + "' >'" +
                          log.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    const std::string msg = slurp_file(log);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3)
      f.skip = py + ": " + msg + " (run scripts/setup.sh): tests against " + what + " skipped";
    else
      f.skip = "FIXTURE SCRIPT FAILED (" + cmd + "):\n" + msg;
    return f;
  }
  f.manifest = nlohmann::json::parse(slurp_file(f.dir / "manifest.json"));
  return f;
}

inline const Fixtures& weight_fixtures() {
  static const Fixtures fx = make_fixtures("make_weight_fixtures.py", "fixtures", "gguf/safetensors/ml_dtypes");
  return fx;
}

// A script failure (as opposed to a missing module) fails the test instead of skipping it.
#define MLA_REQUIRE_WEIGHT_FIXTURES()                                              \
  const auto& fx = ::mla::test::weight_fixtures();                                 \
  if (fx.skip.rfind("FIXTURE SCRIPT FAILED", 0) == 0) FAIL() << fx.skip;           \
  if (!fx.skip.empty()) GTEST_SKIP() << fx.skip

// ---- byte builders ----

struct ByteWriter {
  std::vector<uint8_t> b;
  std::map<std::string, size_t> mark;  // named offsets, for mutations
  size_t pos() const { return b.size(); }
  void at(const std::string& name) { mark[name] = b.size(); }
  template <class T>
  void put(T v) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void raw(const std::string& s) { b.insert(b.end(), s.begin(), s.end()); }
  void pad_to(size_t align) {
    while (b.size() % align) b.push_back(0);
  }
  template <class T>
  void set(size_t offset, T v) {
    std::memcpy(b.data() + offset, &v, sizeof(T));
  }
};

// A small valid GGUF v3: metadata of several types (a nested array included), an F32 [4] vector and a
// Q8_0 [2, 32] matrix. Marks: version, tensor_count, kv_count, kv_key_len (first key's length),
// align_type, align_value, arr_count (the u8 array's count), nested_count, flag_key, bool_value, t0_name_len, t0_ndims,
// t0_ne0, t0_type, t0_offset, t1_ne0, t1_offset, t1_type, data.
inline ByteWriter small_gguf(uint32_t alignment = 32) {
  ByteWriter w;
  w.raw("GGUF");
  w.at("version");
  w.put<uint32_t>(3);
  w.at("tensor_count");
  w.put<uint64_t>(2);
  w.at("kv_count");
  w.put<uint64_t>(6);
  w.at("kv_key_len");
  w.str("general.architecture");
  w.put<uint32_t>(8);
  w.str("deepseek2");
  w.str("general.alignment");
  w.at("align_type");
  w.put<uint32_t>(4);
  w.at("align_value");
  w.put<uint32_t>(alignment);
  w.str("test.u8_array");
  w.put<uint32_t>(9);
  w.put<uint32_t>(0);
  w.at("arr_count");
  w.put<uint64_t>(3);
  w.put<uint8_t>(1), w.put<uint8_t>(2), w.put<uint8_t>(3);
  w.str("test.nested");
  w.put<uint32_t>(9);
  w.put<uint32_t>(9);  // array of arrays
  w.at("nested_count");
  w.put<uint64_t>(2);
  w.put<uint32_t>(8), w.put<uint64_t>(1), w.str("x");  // ["x"]
  w.put<uint32_t>(5), w.put<uint64_t>(2), w.put<int32_t>(-1), w.put<int32_t>(7);  // [-1, 7]
  w.at("flag_key");
  w.str("test.flg");
  w.put<uint32_t>(7);
  w.at("bool_value");
  w.put<uint8_t>(1);
  w.str("test.f32");
  w.put<uint32_t>(6);
  w.put<float>(0.5f);
  // tensor 0: "vec" F32 ne [4]
  w.at("t0_name_len");
  w.str("vec");
  w.at("t0_ndims");
  w.put<uint32_t>(1);
  w.at("t0_ne0");
  w.put<int64_t>(4);
  w.at("t0_type");
  w.put<uint32_t>(0);
  w.at("t0_offset");
  w.put<uint64_t>(0);
  // tensor 1: "mat" Q8_0 ne [32, 2] at the padded end of tensor 0
  w.str("mat");
  w.put<uint32_t>(2);
  w.at("t1_ne0");
  w.put<int64_t>(32);
  w.put<int64_t>(2);
  w.at("t1_type");
  w.put<uint32_t>(8);
  w.at("t1_offset");
  w.put<uint64_t>((16 + alignment - 1) / alignment * alignment);
  w.pad_to(alignment);
  w.at("data");
  for (float v : {1.0f, -2.0f, 0.25f, 8.0f}) w.put<float>(v);
  w.pad_to(alignment);
  for (int row = 0; row < 2; ++row) {
    w.put<uint16_t>(0x3c00);  // d = 1.0 (fp16)
    for (int j = 0; j < 32; ++j) w.put<int8_t>(static_cast<int8_t>(j - 16 + row));
  }
  return w;
}

// A small valid safetensors file: header {"a": F32 [2,2], "b": BF16 [3], "__metadata__": {...}}, padded
// with spaces to a multiple of 8 like the reference writer.
inline std::vector<uint8_t> small_safetensors(const std::string& header_json, const std::vector<uint8_t>& data) {
  std::string h = header_json;
  while ((8 + h.size()) % 8) h += ' ';
  ByteWriter w;
  w.put<uint64_t>(h.size());
  w.raw(h);
  w.b.insert(w.b.end(), data.begin(), data.end());
  return w.b;
}
inline std::vector<uint8_t> small_safetensors() {
  std::vector<uint8_t> data(16 + 6);
  const float a[4] = {1.0f, -2.0f, 3.5f, 0.0f};
  std::memcpy(data.data(), a, 16);
  const uint16_t b[3] = {0x3f80, 0xc000, 0x0000};  // bf16 1, -2, 0
  std::memcpy(data.data() + 16, b, 6);
  return small_safetensors(
      R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"__metadata__":{"format":"pt"}})",
      data);
}

}  // namespace mla::test
