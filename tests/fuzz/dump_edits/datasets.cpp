// fuzz_dump's dataset edits: any type, rank and extents, chunked, filled or compressed, where a reader looks.
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

// A dataset of any type and extents at a path the reader looks at (or anywhere).
void Builder::write_dataset() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  std::string at;
  const uint8_t where = byte() % 4;
  std::vector<hsize_t> old_dims;  // of the dataset replaced, where one is
  hid_t old_type = H5I_INVALID_HID;
  if (where < 2) {  // a dataset of the dump, its extents changed
    std::vector<std::string> datasets;
    for (const auto& p : im.paths) {
      const hid_t o = H5Oopen(file, p.c_str(), H5P_DEFAULT);
      if (o >= 0 && H5Iget_type(o) == H5I_DATASET) {
        datasets.push_back(p);
      }
      if (o >= 0) H5Oclose(o);
    }
    H5Eclear2(H5E_DEFAULT);
    if (datasets.empty()) return;
    at = datasets[f_.ConsumeIntegral<uint16_t>() % datasets.size()];
    const hid_t d = H5Dopen2(file, at.c_str(), H5P_DEFAULT);
    if (d >= 0) {
      const hid_t sp = H5Dget_space(d);
      const int nd = H5Sget_simple_extent_ndims(sp);
      if (nd > 0) {
        old_dims.resize(nd);
        H5Sget_simple_extent_dims(sp, old_dims.data(), nullptr);
      }
      if (byte() % 4) old_type = H5Dget_type(d);
      H5Sclose(sp);
      H5Dclose(d);
    }
    H5Eclear2(H5E_DEFAULT);
  } else if (where == 2 && im.paths.size() > 1) {
    at = pick_path(im);  // any object replaced
  } else {
    at = child(pick_path(im), object_name());
  }
  if (at == "/") return;
  trace("dataset " + im.name + ":" + at);
  H5Ldelete(file, at.c_str(), H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);

  // The file type.
  static const hid_t* const kTypes[] = {&H5T_IEEE_F32LE_g, &H5T_IEEE_F32LE_g, &H5T_IEEE_F64LE_g, &H5T_IEEE_F32BE_g,
                                        &H5T_STD_I32LE_g,  &H5T_STD_I32LE_g,  &H5T_STD_I64LE_g,  &H5T_STD_U64LE_g,
                                        &H5T_STD_I8LE_g,   &H5T_STD_U8LE_g,   &H5T_STD_I16BE_g,  &H5T_STD_U32LE_g,
                                        &H5T_STD_I64BE_g};
  const uint8_t tc = byte() % 20;
  hid_t type;
  bool numeric = true;
  if (old_type >= 0) {
    type = old_type;
    numeric = H5Tget_class(type) == H5T_INTEGER || H5Tget_class(type) == H5T_FLOAT;
  } else if (tc < count_of(kTypes)) {
    type = H5Tcopy(*kTypes[tc]);
  } else {
    numeric = false;
    switch (tc) {
      case 13:
        type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, 8);
        break;
      case 14:
        type = H5Tcreate(H5T_COMPOUND, 8);
        H5Tinsert(type, "v", 0, H5T_NATIVE_FLOAT);
        H5Tinsert(type, "w", 4, H5T_NATIVE_FLOAT);
        break;
      case 15: {
        const hsize_t n = 2;
        type = H5Tarray_create2(H5T_NATIVE_FLOAT, 1, &n);
        break;
      }
      case 16:
        type = H5Tcopy(H5T_STD_B32LE);
        break;
      case 17:
        type = H5Tenum_create(H5T_NATIVE_INT);
        {
          int a = 0;
          H5Tenum_insert(type, "A", &a);
        }
        break;
      case 18:
        type = H5Tcreate(H5T_OPAQUE, 4);
        H5Tset_tag(type, "o");
        break;
      default:  // half floats: HDF5 converts them
        type = H5Tcopy(H5T_IEEE_F32LE);
        H5Tset_fields(type, 15, 10, 5, 0, 10);
        H5Tset_size(type, 2);
        H5Tset_ebias(type, 15);
        numeric = true;
    }
  }
  const size_t esize = H5Tget_size(type);

  // The dataspace: scalar, null, or rank 1 to 4 of meaningful or extreme extents.
  const uint8_t rc = byte() % 16;
  std::vector<hsize_t> dims;
  hid_t space;
  if (!old_dims.empty() && rc < 12) {
    // One or two axes changed (or one more or one fewer).
    dims = old_dims;
    if (rc == 10) dims.push_back(static_cast<hsize_t>(sc_.dims[byte() % sc_.dims.size()]));
    if (rc == 11 && dims.size() > 1) dims.pop_back();
    for (int k = rc % 2 + 1; k > 0 && rc < 10; --k) {
      const int64_t v = byte() % 8 ? sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()] : int_value();
      dims[byte() % dims.size()] = static_cast<hsize_t>(std::clamp<int64_t>(v, 0, int64_t{1} << 62));
    }
    space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  } else if (rc == 14) {
    space = H5Screate(H5S_SCALAR);
  } else if (rc == 15) {
    space = H5Screate(H5S_NULL);
  } else {
    dims.resize(rc % 4 + 1);
    for (auto& d : dims) {
      const int64_t v = byte() % 8 ? sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()] : int_value();
      d = static_cast<hsize_t>(std::clamp<int64_t>(v, 0, int64_t{1} << 62));
    }
    space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  }
  // The element count, saturating.
  uint64_t n = 1;
  bool huge = false;
  for (auto d : dims) {
    if (d != 0 && n > (uint64_t{1} << 62) / d) huge = true;
    n = huge ? 0 : n * d;
  }
  if (huge) n = std::numeric_limits<uint64_t>::max();
  if (rc == 15) n = 0;

  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const uint8_t fill = byte();
  if (fill % 4 == 1 && numeric) {
    const double fv = double_value();
    H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &fv);
  }
  constexpr uint64_t kWriteMax = 256 * 1024;  // bytes of data this edit writes at most
  const bool small = esize > 0 && n <= kWriteMax / esize;
  // Chunks of at most 64 KiB: small datasets sometimes chunked (and deflated), large ones always unless left
  // contiguous and unwritten.
  const uint8_t layout = byte() % 8;
  std::vector<hsize_t> chunk;
  if (!dims.empty() && (!small || layout < 2) && !(layout == 7 && !small)) {
    chunk.resize(dims.size());
    uint64_t cbytes = esize;
    for (size_t i = dims.size(); i-- > 0;) {
      const uint64_t room = std::max<uint64_t>(1, (64 * 1024) / cbytes);
      chunk[i] = std::max<hsize_t>(1, std::min<uint64_t>({dims[i], room, byte() % 2 ? 64u : 4096u}));
      cbytes *= chunk[i];
    }
    std::vector<hsize_t> maxdims(dims);
    bool unlimited = false;
    for (size_t i = 0; i < dims.size(); ++i)
      if (dims[i] == 0 || byte() % 8 == 0) maxdims[i] = H5S_UNLIMITED, unlimited = true;
    if (unlimited) {
      H5Sclose(space);
      space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data());
    }
    H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
    if (layout == 1) {
      H5Pset_shuffle(dcpl);
      H5Pset_deflate(dcpl, 1);
    }
  }
  if (g_trace) {
    std::string t = "  type class " + std::to_string(H5Tget_class(type)) + " size " + std::to_string(esize) + " dims";
    for (auto x : dims) t += " " + std::to_string(x);
    t += rc == 14 ? " scalar" : rc == 15 ? " null" : "";
    t += " chunk";
    for (auto x : chunk) t += " " + std::to_string(x);
    trace(t + " layout " + std::to_string(layout) + " fill " + std::to_string(fill % 4));
  }
  // Values kept elsewhere: external storage (raw bytes of another file) or a virtual dataset (another file's or
  // this one's dataset). Never written here: a write would go to that file.
  bool elsewhere = false;
  if (chunk.empty() && !dims.empty() && layout >= 5 && fill % 8 >= 6) {
    static const char* const kFiles[] = {"other.h5", "d.h5", "/etc/hostname", "/nonexistent"};
    const char* target = kFiles[byte() % count_of(kFiles)];
    elsewhere = true;
    if (fill % 8 == 6) {
      H5Pset_external(dcpl, target, 0, H5F_UNLIMITED);
    } else {
      const std::string src = pick_path(im);
      H5Pset_virtual(dcpl, space, byte() % 2 ? "." : target, src.c_str(), space);
    }
    trace(std::string("  stored in ") + target);
  }
  const hid_t d = H5Dcreate2(file, at.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  if (d >= 0) {
    im.paths.push_back(at);
    const uint8_t pattern = elsewhere ? 7 : byte();
    trace("  written with pattern " + std::to_string(pattern % 8));
    if (small && n > 0 && pattern % 8 != 7) {
      // The whole dataset: zeros, 0xff bytes (NaN, -1), input bytes repeated, or counting 0, 1, 2, ...
      std::string buf(n * esize, '\0');
      if (pattern % 8 == 1) {
        std::fill(buf.begin(), buf.end(), '\xff');
      } else if (pattern % 8 == 2) {
        const std::string src = f_.ConsumeBytesAsString(std::min<size_t>(f_.ConsumeIntegral<uint16_t>(), 4096));
        if (!src.empty())
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = src[i % src.size()];
      }
      if (numeric && pattern % 8 >= 3) {
        std::vector<double> v(n);
        const int64_t mod = std::max<int64_t>(1, pattern % 8 == 3 ? int_value() % 4096 : 1 << 30);
        for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<double>(static_cast<int64_t>(i) % mod);
        if (pattern % 8 == 4 && n > 0) v[f_.ConsumeIntegral<uint32_t>() % n] = double_value();
        H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      } else {
        H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
      }
    } else if (!chunk.empty() && !huge && !elsewhere && pattern % 2 == 0) {
      // Only the first chunk: the rest of a large dataset stored nowhere. (Not where the element count passes
      // 2^62: libhdf5 1.10 itself crashes writing a chunk of a dataset of 4 x 2^62 x 64 x 3.)
      uint64_t cn = 1;
      for (auto c : chunk) cn *= c;
      const hid_t fs_ = H5Dget_space(d);
      std::vector<hsize_t> start(chunk.size(), 0);
      H5Sselect_hyperslab(fs_, H5S_SELECT_SET, start.data(), nullptr, chunk.data(), nullptr);
      const hid_t ms = H5Screate_simple(static_cast<int>(chunk.size()), chunk.data(), nullptr);
      std::string buf(cn * esize, '\0');
      H5Dwrite(d, type, ms, fs_, H5P_DEFAULT, buf.data());
      H5Sclose(ms);
      H5Sclose(fs_);
    }
    H5Dclose(d);
  }
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Tclose(type);
  H5Eclear2(H5E_DEFAULT);
}

}  // namespace fuzz_dump
