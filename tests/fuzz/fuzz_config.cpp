// libFuzzer target: HF config.json parsing (core/model/config.cpp parse_hf_config): JSON nesting guard,
// field types, rope scaling, validation and the derived constants. A UsageError is the expected answer to a
// bad config; anything else (a nlohmann exception escaping, a crash) is a finding.
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <streambuf>
#include <string>

#include <nlohmann/json.hpp>

#include "core/model/config.h"
#include "core/model/errors.h"

namespace {
struct NullBuf : std::streambuf {
  int overflow(int c) override { return c; }
};
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static NullBuf null;  // parse_hf_config prints notices (unknown model types, DSA): keep them quiet
  std::cerr.rdbuf(&null);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mla::MlaConfig c = mla::parse_hf_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    (void)c.to_json().dump();
  } catch (const mla::UsageError&) {
  }
  return 0;
}
