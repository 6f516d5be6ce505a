// The edits fuzz_dump (tests/fuzz/fuzz_dump.cpp) applies to its scenarios' valid dumps: a Builder reads an edit
// script from the input and applies it through HDF5 to the files' images in memory, and writes journal sidecars.
// Its edits by kind, one file each:
//   builder.cpp     the files (HDF5 images), the script's loop and which edit each step is
//   values.cpp      the values edits draw from: numbers, strings, names, shapes, JSON
//   attributes.cpp  attributes set (any type, width, byte order, dataspace) or deleted
//   links.cpp       groups created; links deleted, moved, copied, hard, soft and external; files cloned
//   datasets.cpp    datasets of any type and extents, chunked, filled or compressed
//   journal.cpp     journal records (header, probe, weight, stage, finish) with fields overridden and bytes edited
#pragma once
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/tensor.h"
#include "probes/dump.h"

namespace fuzz_dump {

using namespace mla;
using nlohmann::json;
namespace fs = std::filesystem;

struct Scenario {
  std::vector<std::pair<std::string, std::string>> files;  // file name in the work dir -> HDF5 image
  Dump dump;               // what the files hold (journal records are made from it)
  std::vector<int64_t> dims;  // extents that mean something in this dump (T, H, B, pages, heads, ...)
};

// MLA_FUZZ_DUMP_TRACE=1: every edit printed to stderr (reproducing a finding: which file made it).
extern bool g_trace;
void trace(const std::string& s);

extern std::string g_dir;  // the work dir: a fresh set of files per input
extern std::vector<std::string> g_probe_names, g_stage_names;

void spit(const std::string& p, const std::string& bytes);

struct Image {
  std::string name;   // in the work dir
  std::string bytes;  // the HDF5 file image
  hid_t file = H5I_INVALID_HID;
  std::vector<std::string> paths;  // objects known in it ("/" first)
};

class Builder {
 public:
  Builder(FuzzedDataProvider& fdp, const Scenario& sc);
  ~Builder();
  void run(int max_ops);
  // Writes every file into the work dir.
  void write_files();

 private:
  // ------------------------------------------------------------------ choices (values.cpp)
  uint8_t byte() { return f_.ConsumeIntegral<uint8_t>(); }
  bool chance(int in256) { return byte() < in256; }
  template <class T, size_t N> T pick(const T (&a)[N]) { return a[f_.ConsumeIntegral<uint16_t>() % N]; }
  std::string pick_or_random(const char* const* dict, size_t n, size_t len = 24);
  int64_t int_value();
  double double_value();
  std::string string_value();
  std::string probe_name();
  std::string object_name();
  std::vector<int64_t> shape_value();
  json json_value(int depth = 0);
  // JSON text; strings that are not UTF-8 (input bytes) are written with U+FFFD in their place.
  static std::string text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
  // The scenario's model, run options or last_stage with a few keys changed, or other JSON text.
  std::string json_text(const std::string& attr);

  // ------------------------------------------------------------------ HDF5 images (builder.cpp)
  Image& cur() { return images_[cur_ % images_.size()]; }
  hid_t open(Image& im);
  void close(Image& im, bool keep);
  // Every object under `path` by hard links (the scenarios are trees).
  static void list(hid_t file, const std::string& path, std::vector<std::string>& out, int depth);
  std::string pick_path(Image& im);
  static std::string child(const std::string& parent, const std::string& name);
  void op();  // one edit, of the kind the input's next byte picks


  // ------------------------------------------------------------------ attributes (attributes.cpp)
  // The attribute names that belong on the object at `path`, judged by its depth.
  std::string attr_name(const std::string& path);
  static void put_attr(hid_t obj, const std::string& name, hid_t type, hid_t space, hid_t mtype, const void* buf);
  static hid_t int_type(uint8_t c);
  void set_attr();
  void delete_attr();

  // ------------------------------------------------------------------ groups, links and files (links.cpp)
  void create_group();
  void delete_link();
  void move_link();
  void copy_object();  // a whole subtree under another name (a second rank, layer or probe)
  void soft_link();
  void external_link();
  void hard_link();  // one object under two names, or a group inside itself
  void clone_file();

  // ------------------------------------------------------------------ datasets (datasets.cpp)
  // A dataset of any type and extents at a path the reader looks at (or anywhere).
  void write_dataset();

  // ------------------------------------------------------------------ journal records (journal.cpp)
  class Out;  // a journal record's bytes (journal.cpp)
  // Which of `nbits` fields an edit changes: mostly none or one, at times two.
  uint32_t sparse_mask(int nbits);
  template <class T> void maybe_resize(std::vector<T>& v);
  void maybe_tensor(Tensor& t);
  std::string header_payload();
  std::string probe_payload(bool weight);
  void journal_record();

  FuzzedDataProvider& f_;
  const Scenario& sc_;
  std::vector<Image> images_;
  size_t cur_ = 0;
  std::map<std::string, std::string> journals_;
};

}  // namespace fuzz_dump
