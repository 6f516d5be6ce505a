// The weight readers: MappedFile bounds, safetensors and GGUF parsing, against files written by the
// safetensors and gguf packages (tests/py/make_weight_fixtures.py) and against small hand-built files.
#include <gtest/gtest.h>

#include "core/model/errors.h"
#include "core/weights/dequant.h"
#include "core/weights/gguf.h"
#include "core/weights/mapped_file.h"
#include "core/weights/safetensors.h"
#include "tests/test_weights_util.h"

namespace {

using namespace mla;
using namespace mla::test;
using nlohmann::json;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

// ---------------------------------------------------------------- MappedFile and Bytes

TEST(MappedFile, ViewsAreBoundsCheckedAndNameFileAndOffset) {
  const auto p = scratch("mapped") / "ten.bin";
  write_file(p, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  const MappedFile f(p.string());
  EXPECT_EQ(f.size(), 10u);
  const Bytes b = f.bytes();
  EXPECT_EQ(b.at(2, 8, "x")[0], 2);
  EXPECT_EQ(b.le<uint16_t>(8, "x"), 0x0908);
  EXPECT_NO_THROW(b.check(10, 0, "empty at the end"));
  const std::string e = error_of([&] { b.at(7, 4, "the widget"); });
  EXPECT_NE(e.find(p.string()), std::string::npos) << e;
  EXPECT_NE(e.find("the widget at offset 7"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 4 bytes, only 3 left"), std::string::npos) << e;
  // offset + len overflowing 64 bits is out of range, not a wrap to a small number
  EXPECT_THROW(b.at(5, UINT64_MAX, "x"), UsageError);
  EXPECT_THROW(b.at(UINT64_MAX, 1, "x"), UsageError);
  ByteReader r(b, 6);
  EXPECT_EQ(r.read<uint32_t>("u32"), 0x09080706u);
  EXPECT_THROW(r.read<uint8_t>("past the end"), UsageError);
}

TEST(MappedFile, MissingEmptyAndDirectoryFiles) {
  EXPECT_NE(error_of([] { MappedFile("/nonexistent/x.gguf"); }).find("cannot open /nonexistent/x.gguf"), std::string::npos);
  const auto d = scratch("mapped");
  EXPECT_NE(error_of([&] { MappedFile(d.string()); }).find("is not a regular file"), std::string::npos);
  write_file(d / "empty.bin", {});
  const MappedFile f((d / "empty.bin").string());
  EXPECT_EQ(f.size(), 0u);
  EXPECT_THROW(f.bytes().at(0, 1, "x"), UsageError);
  MappedFile moved = std::move(const_cast<MappedFile&>(f));
  EXPECT_EQ(moved.size(), 0u);
}

// ---------------------------------------------------------------- safetensors

TEST(Safetensors, HandBuiltFileParses) {
  const auto bytes = small_safetensors();
  const Bytes b(bytes.data(), bytes.size(), "small.safetensors");
  const StHeader h = parse_safetensors(b);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(h.tensors[1].dtype, StDtype::StDtype_BF16);
  EXPECT_EQ(h.tensors[1].begin, 16u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_start % 8, 0u);
  const auto v = st_to_float(StDtype::StDtype_BF16, bytes.data() + h.data_start + 16, 3);
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.0f, 0.0f}));
}

TEST(Safetensors, AgreesWithSafetensorsNumpyAndMlDtypes) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const SafetensorsFile f(fx.at("st_dtypes.safetensors").string());
  EXPECT_EQ(f.header().metadata.at("format"), "np");
  EXPECT_EQ(f.header().metadata.at("k"), "v");
  const std::map<std::string, std::string> dtypes = {
      {"bf16", "BF16"}, {"f16", "F16"}, {"f32", "F32"}, {"f64", "F64"}, {"e4m3", "F8_E4M3"}, {"e5m2", "F8_E5M2"},
      {"e8m0", "F8_E8M0"}, {"i8", "I8"}, {"u8", "U8"}, {"i16", "I16"}, {"i32", "I32"}, {"i64", "I64"},
      {"bool", "BOOL"}, {"empty", "F32"}};
  ASSERT_EQ(f.header().tensors.size(), dtypes.size());
  for (const auto& [name, entry] : fx.manifest.at("st_dtypes").items()) {
    SCOPED_TRACE(name);
    const StTensorInfo* t = f.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_STREQ(st_dtype_name(t->dtype), dtypes.at(name).c_str());
    EXPECT_EQ(t->shape, entry.at("shape").get<std::vector<int64_t>>());
    const Bytes d = f.data(*t);
    EXPECT_TRUE(bit_equal(st_to_float(t->dtype, d.data(), t->numel), fx.expected(entry), name));
  }
}

TEST(Safetensors, ShardedCheckpointThroughTheIndex) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const SafetensorsCheckpoint ck(fx.at("models/hf_fp8").string());
  EXPECT_EQ(ck.shard_count(), 2u);
  EXPECT_TRUE(ck.has("model.layers.1.self_attn.o_proj.weight_scale_inv"));
  EXPECT_NE(ck.file_of("model.layers.1.self_attn.o_proj.weight").find("model-00002-of-00002.safetensors"), std::string::npos);
  EXPECT_EQ(ck.info("model.layers.0.self_attn.kv_b_proj.weight").shape, (std::vector<int64_t>{4 * (32 + 64), 256}));
  EXPECT_EQ(ck.info("model.layers.0.self_attn.kv_b_proj.weight").dtype, StDtype::StDtype_F8_E4M3);
  EXPECT_NE(error_of([&] { ck.info("model.layers.9.self_attn.o_proj.weight"); }).find("no tensor 'model.layers.9"),
            std::string::npos);
}

TEST(Safetensors, IndexNamingABadShardIsRefused) {
  const auto d = scratch("st_index");
  write_file(d / "model.safetensors", small_safetensors());
  const auto put_index = [&](const std::string& text) {
    std::ofstream(d / "model.safetensors.index.json") << text;
  };
  put_index(R"({"weight_map": {"a": "../../etc/passwd"}})");
  EXPECT_NE(error_of([&] { SafetensorsCheckpoint c(d.string()); }).find("is not a plain file name"), std::string::npos);
  put_index(R"({"weight_map": {"zzz": "model.safetensors"}})");
  const SafetensorsCheckpoint c(d.string());
  EXPECT_NE(error_of([&] { c.info("zzz"); }).find("which does not hold it"), std::string::npos);
  put_index(std::string(100, '[') + std::string(100, ']'));
  EXPECT_NE(error_of([&] { SafetensorsCheckpoint c2(d.string()); }).find("nested deeper than 64"), std::string::npos);
  put_index(R"({"weight_map": {"a": 5}})");
  EXPECT_NE(error_of([&] { SafetensorsCheckpoint c3(d.string()); }).find("must be a file name string"), std::string::npos);
}

// ---------------------------------------------------------------- GGUF

TEST(Gguf, HandBuiltFileParses) {
  const auto w = small_gguf();
  const Bytes b(w.b.data(), w.b.size(), "small.gguf");
  const GgufHeader h = parse_gguf(b);
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(h.alignment, 32u);
  ASSERT_EQ(h.kvs.size(), 6u);
  EXPECT_EQ(gguf_get_string(b, h, "general.architecture").value(), "deepseek2");
  EXPECT_EQ(gguf_get_int(b, h, "general.alignment").value(), 32);
  EXPECT_EQ(gguf_get_float(b, h, "test.f32").value(), 0.5);
  EXPECT_FALSE(gguf_get_int(b, h, "absent").has_value());
  EXPECT_EQ(gguf_value_text(b, h.kvs[3].value), "[array x 2] [string x 1] \"x\", [i32 x 2] -1, 7");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[1].shape(), (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(h.tensors[1].nbytes, 68u);
  EXPECT_EQ(h.data_start, w.mark.at("data"));
  std::vector<float> row(32);
  dequantize_ggml_row(ggml::Q8_0, b.at(h.data_start + h.tensors[1].offset + 34, 34, "row"), row.data(), 32);
  EXPECT_EQ(row[0], -15.0f);
  EXPECT_EQ(row[31], 16.0f);
}

TEST(Gguf, MetadataOfTheWrongTypeIsAnErrorNotACast) {
  const auto w = small_gguf();
  const Bytes b(w.b.data(), w.b.size(), "small.gguf");
  const GgufHeader h = parse_gguf(b);
  EXPECT_NE(error_of([&] { gguf_get_float(b, h, "test.u8_array"); }).find("'test.u8_array' must be f32 or f64, got array of u8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gguf_get_int(b, h, "test.f32"); }).find("must be an integer, got f32"), std::string::npos);
  EXPECT_NE(error_of([&] { gguf_get_string(b, h, "test.flg"); }).find("must be a string, got bool"), std::string::npos);
}

// Every key, value and tensor that gguf.GGUFWriter wrote, read back.
void expect_value(const Bytes& b, const GgufValue& v, const json& want, const std::string& type, const std::string& key) {
  SCOPED_TRACE(key);
  if (type == "array") {
    ASSERT_EQ(v.type, GgufType::GgufType_array);
    ASSERT_EQ(v.count, want.size());
    const auto elems = gguf_array_elements(b, v, want.size());
    for (size_t i = 0; i < elems.size(); ++i) {
      const auto& e = elems[i];
      const std::string et = gguf_type_name(e.type);
      expect_value(b, e, want[i], et == "array" ? "array" : et, key + "[" + std::to_string(i) + "]");
    }
    return;
  }
  EXPECT_EQ(gguf_type_name(v.type), type == "uint8" ? std::string("u8") : type == "int8" ? std::string("i8") : type == "uint16" ? std::string("u16")
            : type == "int16" ? std::string("i16") : type == "uint32" ? std::string("u32") : type == "int32" ? std::string("i32")
            : type == "uint64" ? std::string("u64") : type == "int64" ? std::string("i64") : type == "float32" ? std::string("f32")
            : type == "float64" ? std::string("f64") : type);
  if (v.type == GgufType::GgufType_string) EXPECT_EQ(gguf_string(b, v), want.get<std::string>());
  else if (v.type == GgufType::GgufType_bool) EXPECT_EQ(v.u != 0, want.get<bool>());
  else if (v.is_float()) EXPECT_EQ(v.f, want.get<double>());
  else if (v.type == GgufType::GgufType_u64 || v.type == GgufType::GgufType_u32 || v.type == GgufType::GgufType_u16 ||
           v.type == GgufType::GgufType_u8)
    EXPECT_EQ(v.u, want.get<uint64_t>());
  else EXPECT_EQ(v.i, want.get<int64_t>());
}

TEST(Gguf, AgreesWithGgufWriterOnEveryKeyAndTensor) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const GgufFile g(fx.at("gguf_quants.gguf").string());
  const Bytes b = g.bytes();
  const auto& meta = fx.manifest.at("gguf_quants_meta");
  for (const auto& [key, entry] : meta.items()) {
    const GgufKV* kv = g.find_kv(key);
    ASSERT_NE(kv, nullptr) << key;
    const std::string type = entry.at("type").get<std::string>();
    expect_value(b, kv->value, entry.at("value"), type == "array" ? "array" : type == "bool" ? "bool" : type == "string" ? "string" : type, key);
  }
  EXPECT_EQ(g.get_string("general.architecture").value(), "testarch");
  EXPECT_EQ(g.header().alignment, 32u);
  const auto& tensors = fx.manifest.at("gguf_quants");
  EXPECT_EQ(g.header().tensors.size(), tensors.size());
  for (const auto& [name, entry] : tensors.items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* t = g.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, entry.at("type").get<uint32_t>());
    const auto& exp = entry.at("expected");
    EXPECT_EQ(t->shape(), exp.at("shape").get<std::vector<int64_t>>());  // ne reversed = numpy's shape
  }
}

}  // namespace
