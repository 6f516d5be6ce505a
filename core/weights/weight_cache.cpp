// Loaded weights shared by the processes of one bisect (see weight_cache.h).
#include "core/weights/weight_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/model/progress_hook.h"
#include "core/model/sha256.h"
#include "core/weights/formats.h"

namespace mla {

namespace fs = std::filesystem;

namespace {

constexpr char kEntryMagic[8] = {'M', 'L', 'A', 'W', 'C', '0', '0', '1'};
constexpr char kEntryEnd[8] = {'M', 'L', 'A', 'W', 'C', 'E', 'N', 'D'};

// What a checkpoint path is: its files' names, sizes and modification times (a directory's files, not recursing).
nlohmann::json checkpoint_stamp(const std::string& path) {
  nlohmann::json files = nlohmann::json::array();
  std::error_code ec;
  const auto stamp = [&](const fs::path& p) {
    const auto size = fs::file_size(p, ec);
    const auto time = fs::last_write_time(p, ec).time_since_epoch().count();
    files.push_back({p.filename().string(), ec ? -1 : static_cast<int64_t>(size), static_cast<int64_t>(time)});
  };
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> names;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec)) names.push_back(e.path());
    std::sort(names.begin(), names.end());
    for (const auto& p : names) stamp(p);
  } else {
    stamp(path);
  }
  return files;
}

std::string entry_key(const WeightSpec& ws, const MlaConfig& cfg, const RunSpec& spec, uint64_t weight_seed,
                      const std::vector<Injection>& injections) {
  const DequantBugs bugs = dequant_bugs(injections);
  nlohmann::json k = {
      {"config", cfg.to_json()},
      {"source", ws.source},
      {"format", ws.format},
      {"layer_range", ws.layer_range},
      {"seed", weight_seed},
      {"layers", spec.layers},
      {"input_norm", spec.graph_shape().input_norm},
      {"bugs", {bugs.fp8_scale_transpose, bugs.nvfp4_nibble_swap, bugs.nvfp4_global_recip}},
  };
  if (!ws.synthetic()) k["checkpoint"] = checkpoint_stamp(ws.source);
  const std::string text = k.dump();
  return sha256_hex(text.data(), text.size());
}

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<FILE, FileCloser>;

// A Fletcher-style sum of everything an entry holds, in 8-byte words (a call's last bytes a word of their own): a
// byte changed, lost or moved changes it. About as fast as memory is read.
struct EntrySum {
  uint64_t a = 1, b = 0;
  void add(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, c + i, 8);
      a += w;
      b += a;
    }
    if (i < n) {
      uint64_t w = 0;
      std::memcpy(&w, c + i, n - i);
      a += w ^ (uint64_t{n - i} << 56);
      b += a;
    }
  }
  uint64_t value() const { return a ^ (b * 0x9e3779b97f4a7c15ULL); }
};

class EntryWriter {
 public:
  explicit EntryWriter(FILE* f) : f_(f) {}
  void bytes(const void* p, size_t n) {
    sum_.add(p, n);
    ok_ = ok_ && (n == 0 || std::fwrite(p, 1, n, f_) == n);
  }
  // The sum of what was written so far, written last.
  void finish() {
    const uint64_t v = sum_.value();
    bytes(&v, sizeof v);
  }
  template <class T>
  void value(T v) {
    bytes(&v, sizeof v);
  }
  void text(const std::string& s) {
    value<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    value<uint64_t>(v.size());
    bytes(v.data(), v.size() * sizeof(T));
  }
  bool ok() const { return ok_; }

 private:
  FILE* f_;
  EntrySum sum_;
  bool ok_ = true;
};

// Reads what EntryWriter wrote, never past the file's end: a count larger than what is left fails the read.
class EntryReader {
 public:
  EntryReader(FILE* f, uint64_t size) : f_(f), left_(size) {}
  bool bytes(void* p, uint64_t n) {
    if (!ok_ || n > left_) return ok_ = false;
    if (n && std::fread(p, 1, n, f_) != n) return ok_ = false;
    sum_.add(p, n);
    left_ -= n;
    return true;
  }
  // Whether the sum written last equals the sum of what was read before it.
  bool finish() {
    const uint64_t want = sum_.value();
    uint64_t got = 0;
    return bytes(&got, sizeof got) && got == want;
  }
  template <class T>
  T value() {
    T v{};
    bytes(&v, sizeof v);
    return v;
  }
  std::string text() {
    const auto n = value<uint64_t>();
    if (!ok_ || n > left_) return ok_ = false, std::string();
    std::string s(n, '\0');
    bytes(s.data(), n);
    return s;
  }
  template <class T>
  std::vector<T> vec() {
    const auto n = value<uint64_t>();
    if (!ok_ || n > left_ / sizeof(T)) return ok_ = false, std::vector<T>();
    std::vector<T> v(n);
    bytes(v.data(), n * sizeof(T));
    return v;
  }
  bool ok() const { return ok_; }
  uint64_t left() const { return left_; }

 private:
  FILE* f_;
  uint64_t left_;
  EntrySum sum_;
  bool ok_ = true;
};

bool write_entry(const std::string& path, const LoadedWeights& w) {
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) return false;
  std::setvbuf(f.get(), nullptr, _IOFBF, 1 << 20);
  EntryWriter out(f.get());
  out.bytes(kEntryMagic, sizeof kEntryMagic);
  out.value<uint8_t>(w.packed.empty() ? 0 : 1);
  out.value<int32_t>(w.first_layer);
  out.text(w.description);
  out.value<uint64_t>(w.layers.size());
  for (const auto& layer : w.layers)
    for (const Tensor* t : layer.tensors()) {
      out.vec(t->shape);
      out.vec(t->data);
    }
  if (!w.packed.empty()) {
    out.value<uint64_t>(w.packed.size());
    for (const auto& layer : w.packed) {
      out.value<uint64_t>(layer.size());
      for (const auto& [name, pw] : layer) {
        out.text(name);
        out.value<int32_t>(static_cast<int32_t>(pw.format));
        out.value<int64_t>(pw.rows);
        out.value<int64_t>(pw.cols);
        out.vec(pw.data);
        out.vec(pw.scales);
        out.value<int64_t>(pw.block_rows);
        out.value<int64_t>(pw.block_cols);
        out.value<float>(pw.global_scale);
        out.text(pw.origin);
      }
    }
  }
  out.bytes(kEntryEnd, sizeof kEntryEnd);
  out.finish();
  return out.ok() && std::fflush(f.get()) == 0;
}

// The entry at `path`, or false when there is none or it does not read back whole (or lacks the packed projections
// `packed` asks for).
bool read_entry(const std::string& path, bool packed, LoadedWeights& w) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return false;
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return false;
  EntryReader in(f.get(), size);
  char magic[8];
  if (!in.bytes(magic, sizeof magic) || std::memcmp(magic, kEntryMagic, sizeof magic) != 0) return false;
  const bool has_packed = in.value<uint8_t>() != 0;
  if (packed && !has_packed) return false;
  LoadedWeights got;
  got.first_layer = in.value<int32_t>();
  got.description = in.text();
  const auto layers = in.value<uint64_t>();
  if (!in.ok() || layers > 100000) return false;
  got.layers.resize(layers);
  for (auto& layer : got.layers)
    for (Tensor* t : layer.tensors()) {
      t->shape = in.vec<int64_t>();
      t->data = in.vec<float>();
      if (!in.ok() || (t->shape.empty() ? !t->data.empty() : shape_numel(t->shape) != t->numel())) return false;
    }
  if (has_packed) {
    const auto n = in.value<uint64_t>();
    if (!in.ok() || n != layers) return false;
    got.packed.resize(n);
    for (auto& layer : got.packed) {
      const auto count = in.value<uint64_t>();
      if (!in.ok() || count > 64) return false;
      for (uint64_t i = 0; i < count && in.ok(); ++i) {
        const std::string name = in.text();
        PackedWeight pw;
        pw.format = static_cast<WeightFormat>(in.value<int32_t>());
        pw.rows = in.value<int64_t>();
        pw.cols = in.value<int64_t>();
        pw.data = in.vec<uint8_t>();
        pw.scales = in.vec<uint8_t>();
        pw.block_rows = in.value<int64_t>();
        pw.block_cols = in.value<int64_t>();
        pw.global_scale = in.value<float>();
        pw.origin = in.text();
        layer[name] = std::move(pw);
      }
    }
  }
  char end[8];
  if (!in.bytes(end, sizeof end) || std::memcmp(end, kEntryEnd, sizeof end) != 0 || !in.finish() || in.left() != 0)
    return false;
  if (!packed) got.packed.clear();
  w = std::move(got);
  return true;
}

}  // namespace

std::string weight_cache_dir_from_env() {
  const char* v = std::getenv(kWeightCacheEnv);
  return v ? std::string(v) : std::string();
}

bool redequantize(const LoadedWeights& from, const std::vector<Injection>& injections, bool keep_packed,
                  LoadedWeights& out) {
  if (from.packed.size() != from.layers.size() || from.layers.empty()) return false;
  const DequantBugs bugs = dequant_bugs(injections);
  bool touched = false;
  for (const auto& layer : from.packed)
    for (const auto& [name, pw] : layer) {
      bool known = false;
      for (const auto& f : kPackedProjections) known = known || name == f.field;
      if (!known) return false;  // attn_k_b / attn_v_b: kv_b is made from them, as load_weights does
      touched = touched || bugs.touches(pw.format);
    }
  if (bugs.any() && !touched) return false;
  LoadedWeights w;
  w.first_layer = from.first_layer;
  w.description = from.description;
  if (keep_packed) w.packed = from.packed;
  // Every tensor but the packed projections copied (norms, the indexer); those are dequantized again below.
  w.layers.resize(from.layers.size());
  for (size_t l = 0; l < from.layers.size(); ++l) {
    const auto src = from.layers[l].tensors();
    const auto dst = w.layers[l].tensors();
    for (size_t i = 0; i < src.size(); ++i) {
      bool packed = false;
      for (const auto& f : kPackedProjections)
        packed = packed || (src[i] == &(from.layers[l].*(f.member)) && from.packed[l].count(f.field));
      if (!packed) *dst[i] = *src[i];
    }
  }
  double done = 0, total = 0;
  for (const auto& layer : from.packed)
    for (const auto& [name, pw] : layer) total += static_cast<double>(pw.rows) * pw.cols;
  for (size_t l = 0; l < from.layers.size(); ++l)
    for (const auto& f : kPackedProjections) {
      const auto it = from.packed[l].find(f.field);
      if (it == from.packed[l].end()) continue;
      if (progress_wanted())
        progress_tick("dequantize", "weights: layer " + std::to_string(l + 1) + "/" +
                                        std::to_string(from.layers.size()) + " " + f.field + ": dequantizing",
                      done, total);
      w.layers[l].*(f.member) = dequantize(it->second, bugs);
      done += static_cast<double>(it->second.rows) * it->second.cols;
    }
  for (size_t l = 0; l < w.layers.size(); ++l)
    for (const auto& line : nonfinite_weights(w.layers[l], w.first_layer + static_cast<int>(l)))
      std::cerr << "warning: " << line << "\n";
  out = std::move(w);
  return true;
}

static std::string weight_entry_path(const std::string& dir, const WeightSpec& ws, const MlaConfig& cfg,
                                     const RunSpec& spec, uint64_t weight_seed,
                                     const std::vector<Injection>& injections) {
  return (fs::path(dir) / (entry_key(ws, cfg, spec, weight_seed, injections) + ".weights")).string();
}

void share_weights(const std::string& dir, const WeightSpec& ws, const MlaConfig& cfg, const RunSpec& spec,
                   uint64_t weight_seed, const std::vector<Injection>& injections, const LoadedWeights& w) {
  const std::string path = weight_entry_path(dir, ws, cfg, spec, weight_seed, injections);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !write_entry(tmp, w)) {
    fs::remove(tmp, ec);
    std::cerr << "note: the loaded weights could not be written to " << dir
              << " (the runs that follow load them again)\n";
    return;
  }
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
}

LoadedWeights load_weights_shared(const std::string& dir, const WeightSpec& ws, const MlaConfig& cfg,
                                  const RunSpec& spec, uint64_t weight_seed, const std::vector<Injection>& injections,
                                  bool keep_packed, bool* hit) {
  if (hit) *hit = false;
  if (dir.empty()) return load_weights(ws, cfg, spec, weight_seed, injections, keep_packed);
  LoadedWeights w;
  if (read_entry(weight_entry_path(dir, ws, cfg, spec, weight_seed, injections), keep_packed, w)) {
    if (hit) *hit = true;
    return w;
  }
  w = load_weights(ws, cfg, spec, weight_seed, injections, keep_packed);
  share_weights(dir, ws, cfg, spec, weight_seed, injections, w);
  return w;
}

}  // namespace mla
