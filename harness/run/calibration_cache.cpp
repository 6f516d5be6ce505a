// Calibrated tolerances cached on disk (see calibration_cache.h).
#include "harness/run/calibration_cache.h"

#include <unistd.h>

#include <Eigen/Core>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/model/sha256.h"
#include "reference/cpu_threads.h"

namespace mla {

namespace {

// 64-bit hash of raw bytes (multiply-xorshift over 8-byte words): fast enough for a layer's weights (hundreds of
// MB) next to a calibration that runs the layer twice; sha256 over the per-tensor hashes makes the key.
uint64_t hash_bytes(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  const auto mix = [](uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix(h ^ w) + 0x9e3779b97f4a7c15ULL;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return mix(h ^ tail ^ (static_cast<uint64_t>(n) << 3));
}

void add_tensor(std::ostream& os, const char* what, const Tensor& t) {
  os << what << " [";
  for (auto d : t.shape) os << d << ",";
  os << "] " << std::hex << hash_bytes(t.data.data(), t.data.size() * sizeof(float), 0x6d6c612d63616c31ULL)
     << std::dec << "\n";
}

template <class T>
void add_ints(std::ostream& os, const char* what, const std::vector<T>& v) {
  os << what << " " << std::hex << hash_bytes(v.data(), v.size() * sizeof(T), v.size()) << std::dec << "\n";
}

// The running binary's size and modification time: a rebuild with uncommitted changes to the reference (the git
// commit unchanged) must not reuse tolerances the old code calibrated.
std::string binary_identity() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "unknown";
  const auto size = std::filesystem::file_size(exe, ec);
  if (ec) return "unknown";
  const auto mtime = std::filesystem::last_write_time(exe, ec).time_since_epoch().count();
  return exe.string() + " " + std::to_string(size) + " " + std::to_string(mtime);
}

nlohmann::json to_json(const ToleranceModel& tm) {
  nlohmann::json per = nlohmann::json::object();
  for (const auto& [name, t] : tm.per_probe)
    per[name] = {{"rel_l2", t.rel_l2}, {"token_rel", t.token_rel}, {"origin", t.origin}};
  return per;
}

bool from_json(const nlohmann::json& j, ToleranceModel& tm) {
  if (!j.is_object()) return false;
  for (const auto& [name, t] : j.items()) {
    if (!t.is_object() || !t.contains("rel_l2") || !t.contains("token_rel")) return false;
    tm.per_probe[name] = {t.at("rel_l2").get<double>(), t.at("token_rel").get<double>(),
                          t.value("origin", std::string())};
  }
  return true;
}

}  // namespace

std::string calibration_cache_dir() {
  if (const char* v = std::getenv("MLA_CALIBRATION_CACHE"); v && *v)
    return std::string(v) == "off" ? std::string() : std::string(v);
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (std::filesystem::path(x) / "mla-bisect" / "calibration").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (std::filesystem::path(h) / ".cache" / "mla-bisect" / "calibration").string();
  return {};
}

namespace {

// The key over everything but the weights, which `add_weights` writes (their bytes, or an id that names them).
std::string cache_key(const MlaConfig& cfg, const RunSpec& spec, const std::function<void(std::ostream&)>& add_weights,
                      const Inputs& inputs, Precision precision, double k) {
  std::ostringstream os;
  os << "mla-bisect calibration v1\n"
     << "tool " << MLA_VERSION << " " << MLA_GIT_SHA << "\n"
#ifdef __VERSION__
     << "compiler " << __VERSION__ << "\n"
#endif
     << "simd " << Eigen::SimdInstructionSetsInUse() << "\n"
     // Eigen's GEMM blocking follows its thread count, and with it the rounding of the reference's sums.
     << "threads " << ref::set_eigen_threads() << "\n"
     << "binary " << binary_identity() << "\n"
     << "config " << cfg.to_json().dump() << "\n"
     << "spec " << run_spec_to_json(spec).dump() << "\n";
  char kbuf[40];
  std::snprintf(kbuf, sizeof kbuf, "%.17g", k);
  os << "precision " << precision_name(precision) << " k " << kbuf << "\n";
  add_weights(os);
  add_tensor(os, "x", inputs.x);
  const Batch& b = inputs.batch;
  add_ints(os, "new_lens", b.new_lens);
  add_ints(os, "context_lens", b.context_lens);
  add_ints(os, "positions", b.positions);
  add_ints(os, "token_seq", b.token_seq);
  add_ints(os, "block_table", b.block_table);
  os << "blocks " << b.max_blocks << " " << b.num_blocks << "\n";
  for (const auto& c : inputs.kv_cache) add_tensor(os, "kv_cache", c);
  const std::string s = os.str();
  return sha256_hex(s.data(), s.size());
}

// A stored calibration for `key`, if the cache holds one.
bool read_cached(const std::filesystem::path& path, const std::string& key, ToleranceModel& tm) {
  try {
    std::ifstream in(path);
    if (!in) return false;
    const nlohmann::json j = nlohmann::json::parse(in);
    return j.value("format", std::string()) == "mla-bisect-calibration" && j.value("key", std::string()) == key &&
           from_json(j.at("per_probe"), tm);
  } catch (const std::exception&) {
    return false;  // an unreadable or foreign file: computed again, and replaced
  }
}

// Stores a calibration atomically (temp + rename): concurrent runs (a zoo's, a test suite's) never read a half-written
// file. A read-only or full cache folder costs only the next recomputation.
void store(const std::string& dir, const std::filesystem::path& path, const std::string& key, const MlaConfig& cfg,
           Precision precision, double k, const ToleranceModel& tm) {
  std::error_code ec;
  // One temporary name per process and thread: a whole-model replay calibrates several layers at once.
  const std::filesystem::path tmp = path.string() + ".tmp" + std::to_string(getpid()) + "." +
                                    std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  try {
    std::filesystem::create_directories(dir, ec);
    const nlohmann::json j = {{"format", "mla-bisect-calibration"}, {"version", 1}, {"key", key},
                              {"model", cfg.name}, {"precision", precision_name(precision)}, {"k", k},
                              {"per_probe", to_json(tm)}};
    {
      std::ofstream out(tmp);
      out << j.dump() << "\n";
      if (!out) throw std::runtime_error("write");
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) std::filesystem::remove(tmp, ec);
  } catch (const std::exception&) {
    std::filesystem::remove(tmp, ec);
  }
}

}  // namespace

std::string calibration_cache_key(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                                  const Inputs& inputs, Precision precision, double k) {
  const auto add_weights = [&](std::ostream& os) {
    for (size_t l = 0; l < weights.size(); ++l) {
      const LayerWeights& w = weights[l];
      os << "layer " << l << "\n";
      add_tensor(os, "input_norm", w.input_norm);
      add_tensor(os, "q_a_proj", w.q_a_proj);
      add_tensor(os, "q_a_norm", w.q_a_norm);
      add_tensor(os, "q_b_proj", w.q_b_proj);
      add_tensor(os, "kv_a_proj", w.kv_a_proj);
      add_tensor(os, "kv_a_norm", w.kv_a_norm);
      add_tensor(os, "kv_b_proj", w.kv_b_proj);
      add_tensor(os, "o_proj", w.o_proj);
    }
  };
  return cache_key(cfg, spec, add_weights, inputs, precision, k);
}

ToleranceModel calibrate_cached(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                                const Inputs& inputs, Precision precision, double k,
                                const std::function<const Dump*()>& fp32_full, bool* from_cache) {
  if (from_cache) *from_cache = false;
  const auto compute = [&] {
    return calibrate(cfg, spec, weights, inputs, precision, k,
                     precision != Precision::Precision_fp32 && fp32_full ? fp32_full() : nullptr);
  };
  const std::string dir = precision == Precision::Precision_fp32 ? std::string() : calibration_cache_dir();
  if (dir.empty()) return compute();
  const std::string key = calibration_cache_key(cfg, spec, weights, inputs, precision, k);
  const std::filesystem::path path = std::filesystem::path(dir) / (key + ".json");
  ToleranceModel tm;
  if (read_cached(path, key, tm)) {
    if (from_cache) *from_cache = true;
    return tm;
  }
  tm = compute();
  store(dir, path, key, cfg, precision, k, tm);
  return tm;
}

ToleranceModel calibrate_cached(const MlaConfig& cfg, const RunSpec& spec, const CalibrationWeights& weights,
                                const Inputs& inputs, Precision precision, double k, bool* from_cache) {
  if (weights.id.empty()) return calibrate_cached(cfg, spec, weights.make(), inputs, precision, k, {}, from_cache);
  if (from_cache) *from_cache = false;
  const std::string dir = precision == Precision::Precision_fp32 ? std::string() : calibration_cache_dir();
  if (dir.empty()) return calibrate(cfg, spec, weights.make(), inputs, precision, k);
  const std::string key =
      cache_key(cfg, spec, [&](std::ostream& os) { os << "weights " << weights.id << "\n"; }, inputs, precision, k);
  const std::filesystem::path path = std::filesystem::path(dir) / (key + ".json");
  ToleranceModel tm;
  if (read_cached(path, key, tm)) {
    if (from_cache) *from_cache = true;
    return tm;
  }
  tm = calibrate(cfg, spec, weights.make(), inputs, precision, k);
  store(dir, path, key, cfg, precision, k, tm);
  return tm;
}

}  // namespace mla
