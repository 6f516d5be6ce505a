// fuzz_dump's attribute edits: set with any type, width, byte order and dataspace, or deleted.
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

// The attribute names that belong on the object at `path`, judged by its depth.
std::string Builder::attr_name(const std::string& path) {
  if (byte() % 8 == 7) return pick_or_random(kRootAttrs, count_of(kRootAttrs));
  const auto depth = std::count(path.begin(), path.end(), '/');
  const bool weights = path.rfind("/weights", 0) == 0;
  if (path == "/") return pick_or_random(kRootAttrs, count_of(kRootAttrs));
  if (path == "/inputs")
    return byte() % 2 ? std::string("num_blocks") : pick_or_random(kRankAttrs, count_of(kRankAttrs));
  if (depth - weights == 2) return pick_or_random(kProbeAttrs, count_of(kProbeAttrs));
  return pick_or_random(kRankAttrs, count_of(kRankAttrs));
}

void Builder::put_attr(hid_t obj, const std::string& name, hid_t type, hid_t space, hid_t mtype, const void* buf) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  const hid_t a = H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    if (buf) H5Awrite(a, mtype, buf);
    H5Aclose(a);
  }
  H5Eclear2(H5E_DEFAULT);
}

hid_t Builder::int_type(uint8_t c) {
  static const hid_t* const kTypes[] = {&H5T_STD_I8LE_g,  &H5T_STD_U8LE_g,  &H5T_STD_I16BE_g, &H5T_STD_U16LE_g,
                                        &H5T_STD_I32LE_g, &H5T_STD_U32BE_g, &H5T_STD_I64BE_g, &H5T_STD_U64LE_g,
                                        &H5T_STD_I64LE_g, &H5T_STD_I32BE_g};
  H5open();
  return *kTypes[c % count_of(kTypes)];
}

void Builder::set_attr() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  const std::string path = pick_path(im);
  const hid_t obj = H5Oopen(file, path.c_str(), H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  if (obj < 0) return;
  const std::string name = attr_name(path);
  trace("  attribute " + path + " " + name);
  // Mostly a value of the attribute's own kind, else any kind.
  int kind = byte() % 24;
  const auto is = [&](const char* const* list, size_t n) {
    return std::any_of(list, list + n, [&](const char* s) { return name == s; });
  };
  if (kind < 12) {
    if (is(kJsonAttrs, count_of(kJsonAttrs))) kind = 100;
    else if (is(kShapeAttrs, 1)) kind = 5;
    else if (is(kStringAttrs, count_of(kStringAttrs))) kind = 7;
    else kind = kind % 4 == 0 ? 3 : 0;
  }
  const hid_t scalar = H5Screate(H5S_SCALAR);
  switch (kind) {
    case 0: {
      const int64_t v = int_value();
      put_attr(obj, name, H5T_STD_I64LE, scalar, H5T_NATIVE_INT64, &v);
      break;
    }
    case 1: {
      const uint64_t v = static_cast<uint64_t>(int_value());
      put_attr(obj, name, H5T_STD_U64LE, scalar, H5T_NATIVE_UINT64, &v);
      break;
    }
    case 2: {  // other widths and byte orders (HDF5 converts, clamping)
      const int64_t v = int_value();
      put_attr(obj, name, int_type(byte()), scalar, H5T_NATIVE_INT64, &v);
      break;
    }
    case 3: {
      const double v = double_value();
      put_attr(obj, name, byte() % 2 ? H5T_IEEE_F64LE : H5T_IEEE_F64BE, scalar, H5T_NATIVE_DOUBLE, &v);
      break;
    }
    case 4: {
      const double v = double_value();  // HDF5 converts (out of range: inf)
      put_attr(obj, name, H5T_IEEE_F32LE, scalar, H5T_NATIVE_DOUBLE, &v);
      break;
    }
    case 5:
    case 6: {  // 1-D arrays, of any length: the attribute's own values with one changed, or others
      std::vector<int64_t> s;
      const uint8_t how = byte();
      if (how % 2 == 0 && H5Aexists(obj, name.c_str()) > 0) {
        const hid_t a = H5Aopen(obj, name.c_str(), H5P_DEFAULT);
        const hid_t sp = H5Aget_space(a);
        const hssize_t n = H5Sget_simple_extent_npoints(sp);
        if (n > 0 && n < 64) {
          s.resize(static_cast<size_t>(n));
          if (H5Aread(a, H5T_NATIVE_INT64, s.data()) < 0) s.clear();
        }
        H5Sclose(sp);
        H5Aclose(a);
        H5Eclear2(H5E_DEFAULT);
        if (!s.empty()) {
          const int64_t v = how % 4 == 0 ? sc_.dims[f_.ConsumeIntegral<uint16_t>() % sc_.dims.size()] : int_value();
          s[byte() % s.size()] = v;
        }
      }
      if (s.empty()) s = shape_value();
      if (byte() % 16 == 0) s.resize(f_.ConsumeIntegralInRange<size_t>(0, 5000), 1);
      std::vector<double> dv(s.begin(), s.end());
      const hsize_t n = s.size();
      const hid_t sp = H5Screate_simple(1, &n, nullptr);
      if (kind == 5) put_attr(obj, name, int_type(byte() % 4 ? 8 : byte()), sp, H5T_NATIVE_INT64, s.data());
      else put_attr(obj, name, H5T_IEEE_F64LE, sp, H5T_NATIVE_DOUBLE, dv.data());
      H5Sclose(sp);
      break;
    }
    case 7:
    case 100: {  // a variable-length string
      const std::string s = kind == 100 ? json_text(name) : string_value();
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      H5Tset_cset(t, byte() % 2 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
      const char* p = s.c_str();
      put_attr(obj, name, t, scalar, t, &p);
      H5Tclose(t);
      break;
    }
    case 8: {  // a fixed-length string, its size any, terminated or not
      std::string s = string_value();
      const size_t size = byte() % 4 ? std::max<size_t>(s.size(), 1) : f_.ConsumeIntegralInRange<size_t>(1, 300);
      s.resize(size, byte() % 2 ? '\0' : 'x');
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, size);
      H5Tset_strpad(t, static_cast<H5T_str_t>(byte() % 3));
      put_attr(obj, name, t, scalar, t, s.data());
      H5Tclose(t);
      break;
    }
    case 9: {  // strings: two, or none
      const hsize_t n = byte() % 3;
      const hid_t sp = H5Screate_simple(1, &n, nullptr);
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      const std::string a = string_value(), b = string_value();
      const char* p[2] = {a.c_str(), b.c_str()};
      put_attr(obj, name, t, sp, t, p);
      H5Tclose(t);
      H5Sclose(sp);
      break;
    }
    case 10: {  // a null dataspace: no value at all
      const hid_t sp = H5Screate(H5S_NULL);
      if (byte() % 2) {
        put_attr(obj, name, H5T_STD_I64LE, sp, H5T_NATIVE_INT64, nullptr);
      } else {
        const hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, H5T_VARIABLE);
        put_attr(obj, name, t, sp, t, nullptr);
        H5Tclose(t);
      }
      H5Sclose(sp);
      break;
    }
    case 11: {  // 2-D
      const hsize_t dims[2] = {static_cast<hsize_t>(byte() % 3), static_cast<hsize_t>(byte() % 3)};
      const int64_t v[4] = {int_value(), int_value(), int_value(), int_value()};
      const hid_t sp = H5Screate_simple(2, dims, nullptr);
      put_attr(obj, name, H5T_STD_I64LE, sp, H5T_NATIVE_INT64, v);
      H5Sclose(sp);
      break;
    }
    case 12: {  // compound
      const hid_t t = H5Tcreate(H5T_COMPOUND, 8);
      H5Tinsert(t, "a", 0, H5T_NATIVE_INT64);
      const int64_t v = int_value();
      put_attr(obj, name, t, scalar, t, &v);
      H5Tclose(t);
      break;
    }
    case 13: {  // enum
      const hid_t t = H5Tenum_create(H5T_NATIVE_INT);
      int a = 0, b = 1;
      H5Tenum_insert(t, "FALSE", &a);
      H5Tenum_insert(t, "TRUE", &b);
      const int v = byte() % 2;
      put_attr(obj, name, t, scalar, t, &v);
      H5Tclose(t);
      break;
    }
    case 14: {  // an array type: one element holding three numbers
      const hsize_t n = 3;
      const hid_t t = H5Tarray_create2(H5T_NATIVE_INT64, 1, &n);
      const int64_t v[3] = {int_value(), int_value(), int_value()};
      put_attr(obj, name, t, scalar, t, v);
      H5Tclose(t);
      break;
    }
    case 15: {  // opaque
      const hid_t t = H5Tcreate(H5T_OPAQUE, 4);
      H5Tset_tag(t, "fuzz");
      const uint32_t v = f_.ConsumeIntegral<uint32_t>();
      put_attr(obj, name, t, scalar, t, &v);
      H5Tclose(t);
      break;
    }
    case 16: {  // bitfield
      const uint64_t v = f_.ConsumeIntegral<uint64_t>();
      put_attr(obj, name, H5T_STD_B64LE, scalar, H5T_NATIVE_B64, &v);
      break;
    }
    case 17: {  // a variable-length sequence of ints
      const hid_t t = H5Tvlen_create(H5T_NATIVE_INT64);
      int64_t v[2] = {int_value(), int_value()};
      hvl_t h{static_cast<size_t>(byte() % 3), v};
      put_attr(obj, name, t, scalar, t, &h);
      H5Tclose(t);
      break;
    }
    case 18: {  // a variable-length string holding no string (a null pointer)
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      const char* p = nullptr;
      put_attr(obj, name, t, scalar, t, &p);
      H5Tclose(t);
      break;
    }
    case 19: {  // an empty 1-D array
      const hsize_t n = 0;
      const hid_t sp = H5Screate_simple(1, &n, nullptr);
      put_attr(obj, name, byte() % 2 ? H5T_STD_I64LE : H5T_IEEE_F64LE, sp, H5T_NATIVE_INT64, nullptr);
      H5Sclose(sp);
      break;
    }
    case 20: {  // a half-width float type (HDF5 converts to and from it)
      const hid_t t = H5Tcopy(H5T_IEEE_F32LE);
      H5Tset_fields(t, 15, 10, 5, 0, 10);
      H5Tset_size(t, 2);
      H5Tset_ebias(t, 15);
      const double v = double_value();
      put_attr(obj, name, t, scalar, H5T_NATIVE_DOUBLE, &v);
      H5Tclose(t);
      break;
    }
    default: {  // JSON text under any name
      const std::string s = json_text(pick(kJsonAttrs));
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      const char* p = s.c_str();
      put_attr(obj, name, t, scalar, t, &p);
      H5Tclose(t);
    }
  }
  H5Sclose(scalar);
  H5Oclose(obj);
  H5Eclear2(H5E_DEFAULT);
}

void Builder::delete_attr() {
  Image& im = cur();
  const hid_t file = open(im);
  if (file < 0) return;
  const std::string path = pick_path(im);
  const std::string name = attr_name(path);
  H5Adelete_by_name(file, path.c_str(), name.c_str(), H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
}

}  // namespace fuzz_dump
