// libFuzzer target: the safetensors header parser and offset checks (core/weights/safetensors.cpp), then
// the dtype conversions over every tensor it accepted. A UsageError is the expected answer to a bad file;
// anything else (a crash, a sanitizer report, another exception, a huge allocation) is a finding.
#include <cstddef>
#include <cstdint>

#include "core/model/errors.h"
#include "core/weights/dequant.h"
#include "core/weights/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const mla::Bytes file(data, size, "fuzz.safetensors");
  try {
    const mla::StHeader h = mla::parse_safetensors(file);
    for (const auto& t : h.tensors) {
      const mla::Bytes b = file.sub(h.data_start + t.begin, t.end - t.begin, t.name);
      if (t.numel <= (1 << 20)) (void)mla::st_to_float(t.dtype, b.data(), t.numel);
    }
  } catch (const mla::UsageError&) {
  }
  return 0;
}
