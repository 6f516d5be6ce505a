// libFuzzer target: the GGUF parser (core/weights/gguf.cpp), every metadata value printed and read as each
// type, the MLA config from the metadata, and every tensor of a supported type dequantized. A UsageError is
// the expected answer to a bad file; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/model/errors.h"
#include "core/weights/checkpoint_config.h"
#include "core/weights/dequant.h"
#include "core/weights/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const mla::Bytes file(data, size, "fuzz.gguf");
  mla::GgufHeader h;
  try {
    h = mla::parse_gguf(file);
  } catch (const mla::UsageError&) {
    return 0;
  }
  for (const auto& kv : h.kvs) {
    (void)mla::gguf_value_text(file, kv.value);
    try { (void)mla::gguf_get_int(file, h, kv.key); } catch (const mla::UsageError&) {}
    try { (void)mla::gguf_get_float(file, h, kv.key); } catch (const mla::UsageError&) {}
    try { (void)mla::gguf_get_string(file, h, kv.key); } catch (const mla::UsageError&) {}
  }
  try {
    (void)mla::config_from_gguf(file, h);
  } catch (const mla::UsageError&) {
  }
  std::vector<float> row;
  for (const auto& t : h.tensors) {
    if (!mla::ggml_type_supported(t.type) || t.numel == 0 || t.numel > (1 << 20)) continue;
    const mla::Bytes b = file.sub(h.data_start + t.offset, t.nbytes, t.name);
    const int64_t cols = t.ne.empty() ? 1 : t.ne[0];
    const int64_t rows = t.numel / cols;
    const int64_t row_bytes = static_cast<int64_t>(t.nbytes) / rows;
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) mla::dequantize_ggml_row(t.type, b.data() + r * row_bytes, row.data(), cols);
  }
  return 0;
}
