// safetensors: header parsing with a SAX handler (no JSON tree: memory stays proportional to the tensors
// declared, nesting is bounded, duplicate keys are seen), the offset checks, and sharded checkpoints.
#include "core/weights/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "core/model/config.h"
#include "core/model/errors.h"

namespace mla {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit

// Builds StTensorInfo entries straight from the parser's events.
class HeaderSax {
 public:
  explicit HeaderSax(std::string origin) : origin_(std::move(origin)) {}
  StHeader header;

  bool null() { return scalar("null", [&] {
      if (state_ == State::State_top_value && key_ == "__metadata__") return;  // "__metadata__": null is allowed
      fail_value("null");
    }); }
  bool boolean(bool) { return scalar("a boolean", [&] { fail_value("a boolean"); }); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<uint64_t>(v));
    return scalar("a negative number", [&] { fail_value("the negative number " + std::to_string(v)); });
  }
  bool number_unsigned(json::number_unsigned_t v) {
    return scalar("a number", [&] {
      if (state_ == State::State_shape) {
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          err("tensor '" + tensor_ + "': shape dimension " + std::to_string(v) + " is too large");
        cur_.shape.push_back(static_cast<int64_t>(v));
      } else if (state_ == State::State_offsets) {
        if (offsets_.size() >= 2) err("tensor '" + tensor_ + "': data_offsets must have exactly 2 entries");
        offsets_.push_back(v);
      } else {
        fail_value("a number");
      }
    });
  }
  bool number_float(json::number_float_t, const json::string_t& s) {
    return scalar("a number", [&] { fail_value("the non-integer number " + s); });
  }
  bool string(json::string_t& s) {
    return scalar("a string", [&] {
      if (state_ == State::State_metadata_value) {
        header.metadata[key_] = s;
        state_ = State::State_metadata;
      } else if (state_ == State::State_field_value && field_ == "dtype") {
        const auto t = st_dtype_from_name(s);
        if (!t) err("tensor '" + tensor_ + "': unknown dtype '" + s + "' (known: " + st_dtype_names() + ")");
        cur_.dtype = *t;
        has_dtype_ = true;
        state_ = State::State_tensor;
      } else {
        fail_value("a string");
      }
    });
  }
  bool binary(json::binary_t&) { err("unexpected binary value"); }

  bool start_object(std::size_t) {
    enter();
    switch (state_) {
      case State::State_start: state_ = State::State_top; seen_.emplace_back(); return true;
      case State::State_top_value:
        if (key_ == "__metadata__") {
          state_ = State::State_metadata;
        } else {
          state_ = State::State_tensor;
          tensor_ = key_;
          cur_ = StTensorInfo{};
          cur_.name = key_;
          has_dtype_ = has_shape_ = has_offsets_ = false;
          offsets_.clear();
        }
        seen_.emplace_back();
        return true;
      case State::State_skip: ++skip_depth_; return true;
      case State::State_field_value:
        if (known_field()) err("tensor '" + tensor_ + "': field '" + field_ + "' must not be an object");
        state_ = State::State_skip;
        skip_depth_ = 1;
        return true;
      case State::State_metadata_value: err("__metadata__['" + key_ + "'] must be a string, got an object");
      default: fail_value("an object");
    }
    return true;
  }
  bool key(json::string_t& k) {
    if (state_ == State::State_skip) return true;
    if (!seen_.back().insert(k).second)
      err(state_ == State::State_top ? "duplicate tensor name '" + k + "'"
                                     : "duplicate key '" + k + "' in '" +
                                           (state_ == State::State_tensor ? tensor_ : std::string("__metadata__")) + "'");
    if (state_ == State::State_top) {
      key_ = k;
      state_ = State::State_top_value;
    } else if (state_ == State::State_metadata) {
      key_ = k;
      state_ = State::State_metadata_value;
    } else if (state_ == State::State_tensor) {
      field_ = k;
      state_ = State::State_field_value;
    }
    return true;
  }
  bool end_object() {
    --depth_;
    switch (state_) {
      case State::State_skip:
        if (--skip_depth_ == 0) state_ = State::State_tensor;
        return true;
      case State::State_metadata: state_ = State::State_top; seen_.pop_back(); return true;
      case State::State_tensor: finish_tensor(); state_ = State::State_top; seen_.pop_back(); return true;
      case State::State_top: state_ = State::State_done; seen_.pop_back(); return true;
      default: err("unexpected end of object");
    }
    return true;
  }
  bool start_array(std::size_t) {
    enter();
    if (state_ == State::State_skip) { ++skip_depth_; return true; }
    if (state_ == State::State_field_value && field_ == "shape") {
      state_ = State::State_shape;
      has_shape_ = true;
      return true;
    }
    if (state_ == State::State_field_value && field_ == "data_offsets") {
      state_ = State::State_offsets;
      has_offsets_ = true;
      return true;
    }
    if (state_ == State::State_field_value && !known_field()) {
      state_ = State::State_skip;
      skip_depth_ = 1;
      return true;
    }
    fail_value("an array");
    return true;
  }
  bool end_array() {
    --depth_;
    if (state_ == State::State_skip) {
      if (--skip_depth_ == 0) state_ = State::State_tensor;
      return true;
    }
    if (state_ == State::State_shape || state_ == State::State_offsets) {
      state_ = State::State_tensor;
      return true;
    }
    err("unexpected end of array");
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) {
    throw UsageError(origin_ + ": header is not valid JSON (at byte " + std::to_string(8 + pos) + " of the file): " +
                     e.what());
  }

 private:
  enum class State {
    State_start, State_top, State_top_value, State_metadata, State_metadata_value, State_tensor,
    State_field_value, State_shape, State_offsets, State_skip, State_done,
  };

  [[noreturn]] void err(const std::string& what) const { throw UsageError(origin_ + ": header: " + what); }
  void enter() {
    // kMaxJsonDepth (config.h): valid headers nest 3 deep; unknown fields may nest more.
    if (++depth_ > kMaxJsonDepth) err("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  bool known_field() const { return field_ == "dtype" || field_ == "shape" || field_ == "data_offsets"; }
  template <class F>
  bool scalar(const char*, F&& f) {
    if (state_ == State::State_skip) return true;
    if (state_ == State::State_field_value && !known_field()) {  // an unknown field's scalar value: ignored
      state_ = State::State_tensor;
      return true;
    }
    f();
    if (state_ == State::State_top_value) state_ = State::State_top;  // "__metadata__": null
    return true;
  }
  void fail_value(const std::string& got) const {
    switch (state_) {
      case State::State_start: err("expected a JSON object at the top level, got " + got);
      case State::State_top_value: err("entry '" + key_ + "' must be an object, got " + got);
      case State::State_metadata_value: err("__metadata__['" + key_ + "'] must be a string, got " + got);
      case State::State_field_value:
        err("tensor '" + tensor_ + "': field '" + field_ + "' has the wrong type (" + got + ")");
      case State::State_shape: err("tensor '" + tensor_ + "': shape entries must be non-negative integers, got " + got);
      case State::State_offsets:
        err("tensor '" + tensor_ + "': data_offsets entries must be non-negative integers, got " + got);
      default: err("unexpected " + got);
    }
  }
  void finish_tensor() {
    if (!has_dtype_) err("tensor '" + tensor_ + "': missing field 'dtype'");
    if (!has_shape_) err("tensor '" + tensor_ + "': missing field 'shape'");
    if (!has_offsets_) err("tensor '" + tensor_ + "': missing field 'data_offsets'");
    if (offsets_.size() != 2) err("tensor '" + tensor_ + "': data_offsets must have exactly 2 entries");
    cur_.begin = offsets_[0];
    cur_.end = offsets_[1];
    header.tensors.push_back(std::move(cur_));
  }

  std::string origin_;
  State state_ = State::State_start;
  int depth_ = 0, skip_depth_ = 0;
  std::string key_, field_, tensor_;
  std::vector<std::set<std::string>> seen_;  // keys per open object (duplicates are errors)
  StTensorInfo cur_;
  std::vector<uint64_t> offsets_;
  bool has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
};

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) t += ',';
    t += std::to_string(s[i]);
  }
  t += ']';
  return t;
}

bool is_plain_file_name(const std::string& n) {
  if (n.empty() || n == "." || n == "..") return false;
  for (char c : n)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

}  // namespace

StHeader parse_safetensors(const Bytes& file) {
  const std::string& origin = file.origin();
  if (file.size() < 8)
    throw UsageError(origin + ": " + std::to_string(file.size()) +
                     " bytes, too small for a safetensors file (the header length alone is 8 bytes)");
  const uint64_t n = file.le<uint64_t>(0, "header length");
  if (n > kMaxHeader)
    throw UsageError(origin + ": header length " + std::to_string(n) + " (bytes 0..7) exceeds the limit of " +
                     std::to_string(kMaxHeader) + " bytes; not a safetensors file, or corrupt");
  if (n > file.size() - 8)
    throw UsageError(origin + ": header length " + std::to_string(n) + ": the header (bytes 8.." + std::to_string(8 + n) +
                     ") runs past the end of the file (" + std::to_string(file.size()) + " bytes; truncated?)");
  const char* text = reinterpret_cast<const char*>(file.at(8, n, "header"));
  HeaderSax sax(origin);
  json::sax_parse(text, text + n, &sax, json::input_format_t::json, /*strict=*/true);
  StHeader h = std::move(sax.header);
  h.header_len = n;
  h.data_start = 8 + n;

  const uint64_t data_size = file.size() - h.data_start;
  for (auto& t : h.tensors) {
    const std::string who = "tensor '" + t.name + "' (" + st_dtype_name(t.dtype) + " " + shape_text(t.shape) + ")";
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d != 0 && numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(d))
        throw UsageError(origin + ": " + who + ": element count overflows");
      numel *= static_cast<uint64_t>(d);
    }
    t.numel = static_cast<int64_t>(numel);
    const uint64_t bits = static_cast<uint64_t>(st_dtype_bits(t.dtype));
    if (numel > std::numeric_limits<uint64_t>::max() / bits)
      throw UsageError(origin + ": " + who + ": byte size overflows");
    if ((numel * bits) % 8 != 0)
      throw UsageError(origin + ": " + who + ": " + std::to_string(numel) + " elements of " + std::to_string(bits) +
                       " bits are not a whole number of bytes");
    const uint64_t nbytes = numel * bits / 8;
    if (t.end < t.begin)
      throw UsageError(origin + ": " + who + ": data_offsets [" + std::to_string(t.begin) + ", " +
                       std::to_string(t.end) + ") end before they begin");
    if (t.end - t.begin != nbytes)
      throw UsageError(origin + ": " + who + " needs " + std::to_string(nbytes) + " bytes but its data_offsets [" +
                       std::to_string(t.begin) + ", " + std::to_string(t.end) + ") span " +
                       std::to_string(t.end - t.begin));
  }
  std::vector<size_t> order(h.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = h.tensors[a], &y = h.tensors[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t expected = 0;
  for (size_t i : order) {
    const auto& t = h.tensors[i];
    if (t.begin != expected)
      throw UsageError(origin + ": tensor '" + t.name + "': data_offsets [" + std::to_string(t.begin) + ", " +
                       std::to_string(t.end) + ") do not start where the previous tensor ends (" +
                       std::to_string(expected) + "): " + (t.begin > expected ? "a gap" : "an overlap") +
                       " in the data section");
    expected = t.end;
  }
  if (expected != data_size)
    throw UsageError(origin + ": the tensors end at data offset " + std::to_string(expected) + " (file offset " +
                     (expected <= std::numeric_limits<uint64_t>::max() - h.data_start
                          ? std::to_string(h.data_start + expected)
                          : std::string("beyond 2^64")) +
                     ") but the file has " + std::to_string(file.size()) + " bytes" +
                     (expected > data_size ? " (truncated)" : " (trailing bytes after the last tensor)"));
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_shared<MappedFile>(path)), header_(parse_safetensors(file_->bytes())) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

const StTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

Bytes SafetensorsFile::data(const StTensorInfo& t) const {
  return file_->bytes().sub(header_.data_start + t.begin, t.end - t.begin, "tensor '" + t.name + "' data");
}

bool is_safetensors_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "model.safetensors.index.json", ec)) return true;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".safetensors") return true;
    return false;
  }
  return fs::path(path).extension() == ".safetensors" || fs::path(path).filename() == "model.safetensors.index.json";
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) : path_(path) {
  std::error_code ec;
  fs::path index;
  if (fs::is_directory(path, ec)) {
    dir_ = path;
    if (fs::exists(fs::path(path) / "model.safetensors.index.json", ec)) index = fs::path(path) / "model.safetensors.index.json";
  } else if (fs::path(path).filename() == "model.safetensors.index.json") {
    index = path;
    dir_ = fs::path(path).parent_path().string();
  } else {
    dir_ = fs::path(path).parent_path().string();
    if (dir_.empty()) dir_ = ".";
  }
  if (!index.empty()) {
    const MappedFile f(index.string());
    const std::string origin = index.string();
    if (f.size() > kMaxHeader) throw UsageError(origin + ": " + std::to_string(f.size()) + " bytes is too large for an index");
    const Bytes b = f.bytes();
    const std::string text(reinterpret_cast<const char*>(b.at(0, b.size(), "index")), b.size());
    check_json_nesting(text, origin);
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw UsageError(origin + ": malformed JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw UsageError(origin + ": expected an object with a \"weight_map\" object");
    std::map<std::string, size_t> shard_of_file;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw UsageError(origin + ": weight_map['" + name + "'] must be a file name string");
      const std::string fn = file.get<std::string>();
      if (!is_plain_file_name(fn))
        throw UsageError(origin + ": weight_map['" + name + "'] = '" + fn +
                         "' is not a plain file name in the checkpoint's directory");
      auto [it, added] = shard_of_file.emplace(fn, shard_paths_.size());
      if (added) shard_paths_.push_back((fs::path(dir_) / fn).string());
      where_[name] = it->second;
    }
  } else {
    std::vector<std::string> files;
    if (fs::is_directory(path, ec)) {
      for (const auto& e : fs::directory_iterator(path, ec))
        if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
      if (files.empty()) throw UsageError(path + ": no .safetensors files and no model.safetensors.index.json");
    } else {
      files.push_back(path);
    }
    for (const auto& f : files) {
      const size_t i = shard_paths_.size();
      shard_paths_.push_back(f);
      const auto& s = shard(i);
      for (const auto& t : s.header().tensors) {
        auto [it, added] = where_.emplace(t.name, i);
        if (!added)
          throw UsageError("tensor '" + t.name + "' is in both " + shard_paths_[it->second] + " and " + f);
      }
    }
  }
  shards_.resize(shard_paths_.size());
}

const SafetensorsFile& SafetensorsCheckpoint::shard(size_t i) const {
  if (shards_.size() < shard_paths_.size()) shards_.resize(shard_paths_.size());
  if (!shards_[i]) shards_[i] = std::make_unique<SafetensorsFile>(shard_paths_[i]);
  return *shards_[i];
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> v;
  for (auto& [n, _] : where_) v.push_back(n);
  return v;
}

const StTensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw UsageError(path_ + ": no tensor '" + name + "'");
  const auto& s = shard(it->second);
  const StTensorInfo* t = s.find(name);
  if (!t)
    throw UsageError(path_ + ": the index places tensor '" + name + "' in " + shard_paths_[it->second] +
                     ", which does not hold it");
  return *t;
}

Bytes SafetensorsCheckpoint::data(const std::string& name) const {
  const auto& t = info(name);
  return shard(where_.at(name)).data(t);
}

std::string SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : shard_paths_[it->second];
}

}  // namespace mla
