// safetensors reader: one file, or a sharded checkpoint through model.safetensors.index.json.
// The header is parsed with every check of the reference implementation; tensor bytes stay in the mapping
// and are only touched when a tensor is asked for.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/weights/formats.h"
#include "core/weights/mapped_file.h"

namespace mla {

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::StDtype_F32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section (8 + N)
};

struct StHeader {
  uint64_t header_len = 0;   // N
  uint64_t data_start = 0;   // 8 + N
  std::vector<StTensorInfo> tensors;  // in header order
  std::map<std::string, std::string> metadata;
};

// Parses and checks a whole file's bytes (the header and the consistency of the offsets with the size).
// Throws UsageError naming the origin, the tensor and the offset.
StHeader parse_safetensors(const Bytes& file);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and parses
  const std::string& path() const { return file_->path(); }
  const StHeader& header() const { return header_; }
  const StTensorInfo* find(const std::string& name) const;
  // The tensor's bytes, bounds-checked against the file.
  Bytes data(const StTensorInfo& t) const;

 private:
  std::shared_ptr<MappedFile> file_;
  StHeader header_;
  std::map<std::string, size_t> index_;
};

// A checkpoint: a single .safetensors file, or a directory with model.safetensors.index.json (sharded) or
// a single model.safetensors / *.safetensors files. Shards are opened (mapped, header parsed) on first use.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& path);
  const std::string& path() const { return path_; }
  std::string dir() const { return dir_; }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  std::vector<std::string> names() const;  // every tensor name, sorted
  // Throws UsageError when the tensor is missing (naming the checkpoint) or its shard is bad.
  const StTensorInfo& info(const std::string& name) const;
  Bytes data(const std::string& name) const;
  std::string file_of(const std::string& name) const;  // the shard path holding it
  size_t shard_count() const { return shard_paths_.size(); }

 private:
  const SafetensorsFile& shard(size_t i) const;
  std::string path_, dir_;
  std::vector<std::string> shard_paths_;
  mutable std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, size_t> where_;  // name -> shard
};

// Decides whether a path is a safetensors checkpoint (a .safetensors file, or a directory holding an
// index or .safetensors files).
bool is_safetensors_path(const std::string& path);

}  // namespace mla
