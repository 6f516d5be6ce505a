// fuzz_dump's Builder: the files it edits (HDF5 images in memory) and its edit script's loop.
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

Builder::Builder(FuzzedDataProvider& fdp, const Scenario& sc) : f_(fdp), sc_(sc) {
  for (const auto& [name, bytes] : sc.files) images_.push_back(Image{name, bytes, H5I_INVALID_HID, {}});
}

Builder::~Builder() {
  for (auto& im : images_) close(im, false);
}

void Builder::run(int max_ops) {
  if (const char* e = std::getenv("MLA_FUZZ_DUMP_OPS")) max_ops = std::atoi(e);  // bisecting a finding
  for (int i = 0; i < max_ops && f_.remaining_bytes() > 0; ++i) op();
}

// Writes every file into the work dir.
void Builder::write_files() {
  for (auto& im : images_) {
    close(im, true);
    if (!im.name.empty()) spit(g_dir + "/" + im.name, im.bytes);
  }
  for (const auto& [name, bytes] : journals_) spit(g_dir + "/" + name, bytes);
}

hid_t Builder::open(Image& im) {
  if (im.file >= 0) return im.file;
  if (im.bytes.empty()) return H5I_INVALID_HID;
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, 1 << 16, 0);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  H5Pset_file_image(fapl, im.bytes.data(), im.bytes.size());
  im.file = H5Fopen(("mem-" + std::to_string(&im - images_.data())).c_str(), H5F_ACC_RDWR, fapl);
  H5Pclose(fapl);
  H5Eclear2(H5E_DEFAULT);
  if (im.file >= 0 && im.paths.empty()) list(im.file, "/", im.paths, 0);
  return im.file;
}

void Builder::close(Image& im, bool keep) {
  if (im.file < 0) return;
  if (keep) {
    H5Fflush(im.file, H5F_SCOPE_LOCAL);
    const ssize_t n = H5Fget_file_image(im.file, nullptr, 0);
    if (n > 0) {
      std::string b(static_cast<size_t>(n), '\0');
      if (H5Fget_file_image(im.file, b.data(), b.size()) == n) im.bytes = std::move(b);
    }
  }
  H5Fclose(im.file);
  H5Eclear2(H5E_DEFAULT);
  im.file = H5I_INVALID_HID;
}

// Every object under `path` by hard links (the scenarios are trees).
void Builder::list(hid_t file, const std::string& path, std::vector<std::string>& out, int depth) {
  out.push_back(path);
  if (depth > 5) return;
  const hid_t g = H5Gopen2(file, path.c_str(), H5P_DEFAULT);
  if (g < 0) {
    H5Eclear2(H5E_DEFAULT);
    return;
  }
  H5G_info_t info;
  if (H5Gget_info(g, &info) >= 0) {
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      char name[256];
      if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0) continue;
      list(file, path + (path == "/" ? "" : "/") + name, out, depth + 1);
    }
  }
  H5Gclose(g);
  H5Eclear2(H5E_DEFAULT);
}

std::string Builder::pick_path(Image& im) {
  if (im.paths.empty()) return "/";
  return im.paths[f_.ConsumeIntegral<uint16_t>() % im.paths.size()];
}

std::string Builder::child(const std::string& parent, const std::string& name) {
  return parent + (parent == "/" ? "" : "/") + name;
}

void Builder::op() {
  const uint8_t k = byte();
  trace("op " + std::to_string(k) + " on " + cur().name);
  if (k < 100) return set_attr();
  if (k < 110) return delete_attr();
  if (k < 164) return write_dataset();
  if (k < 172) return create_group();
  if (k < 182) return delete_link();
  if (k < 188) return move_link();
  if (k < 200) return copy_object();
  if (k < 206) return soft_link();
  if (k < 210) return external_link();
  if (k < 214) return hard_link();
  if (k < 218) {
    cur_ = byte();  // switch file
    return;
  }
  if (k < 222) return clone_file();
  if (k < 224) {
    close(cur(), false);
    cur().name.clear();  // the file is not written
    return;
  }
  return journal_record();
}

}  // namespace fuzz_dump
