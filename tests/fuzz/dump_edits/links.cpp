// fuzz_dump's edits of a dump's tree: groups, links (hard, soft, external), moves, copies, files cloned.
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

void Builder::create_group() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  const std::string at = child(pick_path(im), object_name());
  const hid_t g = H5Gcreate2(file, at.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g >= 0) {
    H5Gclose(g);
    im.paths.push_back(at);
  }
  H5Eclear2(H5E_DEFAULT);
}

void Builder::delete_link() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  const std::string at = pick_path(im);
  trace("  delete " + at);
  H5Ldelete(file, at.c_str(), H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
}

void Builder::move_link() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  const std::string from = pick_path(im);
  const std::string to = child(byte() % 2 ? pick_path(im) : from.substr(0, std::max<size_t>(from.rfind('/'), 1)),
                               object_name());
  trace("  move " + from + " to " + to);
  if (H5Lmove(file, from.c_str(), file, to.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0) im.paths.push_back(to);
  H5Eclear2(H5E_DEFAULT);
}

void Builder::copy_object() {
  Image& im = cur();
  hid_t file = open(im);
  if (file < 0) return;
  const std::string from = pick_path(im);
  const std::string parent = byte() % 2 ? from.substr(0, std::max<size_t>(from.rfind('/'), 1)) : pick_path(im);
  const std::string to = child(parent, object_name());
  trace("  copy " + from + " to " + to);
  // Copied from a freshly opened image: libhdf5 1.10.8's H5Ocopy after other edits in the same open file can fail
  // retagging its cached metadata ("can't insert duplicate key") and then loses B-tree nodes (a leak of its own).
  close(im, true);
  file = open(im);
  if (file < 0) return;
  if (H5Ocopy(file, from.c_str(), file, to.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0) list(file, to, im.paths, 3);
  else if (g_trace) H5Eprint2(H5E_DEFAULT, stderr);
  H5Eclear2(H5E_DEFAULT);
}

void Builder::soft_link() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  const std::string at = child(pick_path(im), object_name());
  std::string target;
  switch (byte() % 5) {
    case 0: target = at; break;  // itself
    case 1: target = f_.ConsumeRandomLengthString(32); break;
    case 2: target = "/elsewhere/" + object_name(); break;  // through an external link, when there is one
    default: target = pick_path(im);
  }
  trace("  soft link " + at + " to " + target);
  if (byte() % 2) H5Ldelete(file, at.c_str(), H5P_DEFAULT);
  if (H5Lcreate_soft(target.c_str(), file, at.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0) im.paths.push_back(at);
  H5Eclear2(H5E_DEFAULT);
}

void Builder::external_link() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  const std::string at = byte() % 4 ? child(pick_path(im), object_name()) : std::string("/elsewhere");
  static const char* const kFiles[] = {"other.h5", "d.h5", "d.rank1.h5", "/nonexistent/x.h5", "", "/etc/hostname"};
  const std::string target_file = byte() % 8 == 7 ? f_.ConsumeRandomLengthString(32) : pick(kFiles);
  const std::string target_obj = byte() % 2 ? std::string("/") : pick_path(im);
  trace("  external link " + at + " to " + target_file + ":" + target_obj);
  if (byte() % 2) H5Ldelete(file, at.c_str(), H5P_DEFAULT);
  if (H5Lcreate_external(target_file.c_str(), target_obj.c_str(), file, at.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0)
    im.paths.push_back(at);
  H5Eclear2(H5E_DEFAULT);
}

void Builder::hard_link() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  const std::string from = pick_path(im);
  const std::string at = child(pick_path(im), object_name());
  trace("  hard link " + at + " to " + from);
  if (H5Lcreate_hard(file, from.c_str(), file, at.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0) im.paths.push_back(at);
  H5Eclear2(H5E_DEFAULT);
}

void Builder::clone_file() {
  static const char* const kNames[] = {"d.h5", "other.h5", "d.rank0.h5", "d.rank1.h5", "d.rank2.h5", "d.rank01.h5"};
  Image& src = cur();
  close(src, true);
  if (src.bytes.empty() || images_.size() >= 6) return;
  Image copy{pick(kNames), src.bytes, H5I_INVALID_HID, src.paths};
  for (auto& im : images_)
    if (im.name == copy.name) {
      close(im, false);
      im.name.clear();
    }
  images_.push_back(std::move(copy));
  cur_ = images_.size() - 1;
}

}  // namespace fuzz_dump
