// The values fuzz_dump's edits draw from the input: numbers, strings, names, shapes, JSON.
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/model/errors.h"
#include "core/model/stage_graph.h"
#include "probes/dump_internal.h"
#include "probes/journal.h"
#include "tests/fuzz/dump_edits/builder.h"
#include "tests/fuzz/dump_edits/values.h"

namespace fuzz_dump {

std::string Builder::pick_or_random(const char* const* dict, size_t n, size_t len) {
  const uint16_t c = f_.ConsumeIntegral<uint16_t>();
  if (c % 16 == 15) return f_.ConsumeRandomLengthString(len);
  return dict[(c / 16) % n];
}

int64_t Builder::int_value() {
  switch (byte() % 4) {
    case 0: return pick(kInts);
    case 1: return sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()];
    case 2:  // next to an extreme value, wrapping around
      return static_cast<int64_t>(static_cast<uint64_t>(pick(kInts)) +
                                  static_cast<uint64_t>(f_.ConsumeIntegralInRange<int64_t>(-2, 2)));
    default: return f_.ConsumeIntegral<int64_t>();
  }
}

double Builder::double_value() {
  switch (byte() % 3) {
    case 0: return pick(kDoubles);
    case 1: return static_cast<double>(int_value());
    default: {
      const uint64_t bits = f_.ConsumeIntegral<uint64_t>();
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
  }
}

std::string Builder::string_value() {
  switch (byte() % 4) {
    case 0: return f_.ConsumeRandomLengthString(64);
    case 1: return g_stage_names[f_.ConsumeIntegral<uint16_t>() % g_stage_names.size()];
    default: return pick(kStrings);
  }
}

std::string Builder::probe_name() {
  if (byte() % 8 == 7) return f_.ConsumeRandomLengthString(16);
  return g_probe_names[f_.ConsumeIntegral<uint16_t>() % g_probe_names.size()];
}

std::string Builder::object_name() {
  switch (byte() % 3) {
    case 0: return probe_name();
    default: return pick_or_random(kObjectNames, count_of(kObjectNames));
  }
}

std::vector<int64_t> Builder::shape_value() {
  std::vector<int64_t> s(byte() % 5);
  for (auto& d : s) d = byte() % 4 ? sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()] : int_value();
  return s;
}

json Builder::json_value(int depth) {
  switch (byte() % 12) {
    case 0: return int_value();
    case 1: return double_value();  // NaN and inf dump as null
    case 2: return string_value();
    case 3: return byte() % 2 == 0;
    case 4: return nullptr;
    case 5: {
      json a = json::array();
      for (int n = byte() % 4; n > 0; --n) a.push_back(depth < 3 ? json_value(depth + 1) : json(int_value()));
      return a;
    }
    case 6: {
      json o = json::object();
      for (int n = byte() % 3; n > 0; --n)
        o[pick_or_random(kModelKeys, count_of(kModelKeys))] = depth < 3 ? json_value(depth + 1) : json(1);
      return o;
    }
    case 7: return static_cast<uint64_t>(f_.ConsumeIntegral<uint64_t>());
    case 8: return json::array({int_value()});
    default: return int_value() % 4096;
  }
}

// The scenario's model, run options or last_stage with a few keys changed, or other JSON text.
std::string Builder::json_text(const std::string& attr) {
  const auto& m = sc_.dump.meta;
  json j = attr == "model" ? m.model : attr == "run_options" ? m.run_options : json(sc_.dump.last_stage);
  if (byte() % 16 == 15) return f_.ConsumeRandomLengthString(256);
  const bool model = attr == "model";
  for (int n = byte() % 4 + 1; n > 0; --n) {
    switch (byte() % 8) {
      case 0:
        if (j.is_object() && !j.empty()) {
          auto it = j.begin();
          std::advance(it, f_.ConsumeIntegral<uint16_t>() % j.size());
          j.erase(it);
        }
        break;
      case 1: j = json_value(); break;
      case 2:
        if (model) j = json{{"text_config", j}};
        else if (j.is_array()) j.push_back(json_value());
        break;
      default: {
        if (!j.is_object()) j = json::object();
        const std::string key = model ? pick_or_random(kModelKeys, count_of(kModelKeys))
                                      : pick_or_random(kRunKeys, count_of(kRunKeys));
        j[key] = json_value();
      }
    }
  }
  return text(j);
}

}  // namespace fuzz_dump
