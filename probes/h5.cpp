// HDF5 handles. Only calls whose signatures are the same in HDF5 1.10, 1.12 and 1.14 (no H5Literate,
// no H5Oget_info), so the GPU machine's 1.10 and newer libraries build the same code.
#include "probes/h5.h"

#include <sys/stat.h>

#include <algorithm>

#include "core/model/errors.h"

namespace mla::h5 {

namespace {

// HDF5's innermost message (the most specific: "truncated file: eof = ..."), then the stack is cleared.
herr_t walk_cb(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *out = err->desc;
  return 0;
}

std::string hdf5_message() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg;
}

[[noreturn]] void fail_at(const std::string& where, const std::string& what, const std::string& name) {
  const std::string detail = hdf5_message();
  std::string msg = where + ": " + what;
  if (!name.empty()) msg += " '" + name + "'";
  if (!detail.empty()) msg += " (HDF5: " + detail + ")";
  throw UsageError(msg);
}

hid_t mem_type(Type t) {
  switch (t) {
    case Type::Type_f32: return H5T_NATIVE_FLOAT;
    case Type::Type_f64: return H5T_NATIVE_DOUBLE;
    case Type::Type_i32: return H5T_NATIVE_INT32;
    case Type::Type_i64: return H5T_NATIVE_INT64;
    case Type::Type_u64: return H5T_NATIVE_UINT64;
  }
  return H5T_NATIVE_FLOAT;
}

// Little-endian file types: what h5py and numpy expect by default on every machine we target.
hid_t file_type(Type t) {
  switch (t) {
    case Type::Type_f32: return H5T_IEEE_F32LE;
    case Type::Type_f64: return H5T_IEEE_F64LE;
    case Type::Type_i32: return H5T_STD_I32LE;
    case Type::Type_i64: return H5T_STD_I64LE;
    case Type::Type_u64: return H5T_STD_U64LE;
  }
  return H5T_IEEE_F32LE;
}

Id vlen_string_type() {
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

Id make_space(const std::vector<int64_t>& shape) {
  if (shape.empty()) return Id(H5Screate(H5S_SCALAR), H5Sclose);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return Id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
}

int64_t space_points(hid_t space) { return static_cast<int64_t>(H5Sget_simple_extent_npoints(space)); }

bool numeric_class(hid_t type) {
  const H5T_class_t c = H5Tget_class(type);
  return c == H5T_INTEGER || c == H5T_FLOAT;
}

bool integer_type(Type t) { return t == Type::Type_i32 || t == Type::Type_i64 || t == Type::Type_u64; }

}  // namespace

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Id::reset() {
  if (id_ >= 0 && close_) {
    close_(id_);
    H5Eclear2(H5E_DEFAULT);
  }
  id_ = H5I_INVALID_HID;
}

herr_t Id::close() {
  herr_t r = 0;
  if (id_ >= 0 && close_) r = close_(id_);
  id_ = H5I_INVALID_HID;
  return r;
}

void init() {
  // Per thread in thread-safe builds of HDF5, so not std::call_once.
  thread_local bool done = false;
  if (done) return;
  H5open();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  done = true;
}

// ---------------------------------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------------------------------

void Object::fail(const std::string& what, const std::string& name) const { fail_at(where_, what, name); }

bool Object::has_attr(const std::string& name) const {
  init();
  const htri_t r = H5Aexists(id(), name.c_str());
  if (r < 0) fail("cannot look up attribute", name);
  return r > 0;
}

namespace {
// Creates (replacing) attribute `name` of `type` over `space` and writes `data` given in `mtype`.
void write_attr(hid_t obj, const std::string& name, hid_t type, hid_t space, hid_t mtype,
                const void* data, const std::string& where) {
  init();
  if (H5Aexists(obj, name.c_str()) > 0 && H5Adelete(obj, name.c_str()) < 0)
    fail_at(where, "cannot replace attribute", name);
  Id a(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a) fail_at(where, "cannot create attribute", name);
  if (H5Awrite(a.get(), mtype, data) < 0) fail_at(where, "cannot write attribute", name);
}
}  // namespace

void Object::set_attr(const std::string& name, const std::string& value) {
  Id t = vlen_string_type();
  Id s(H5Screate(H5S_SCALAR), H5Sclose);
  const char* p = value.c_str();
  write_attr(id(), name, t.get(), s.get(), t.get(), &p, where_);
}

void Object::set_attr(const std::string& name, int64_t value) {
  Id s(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr(id(), name, H5T_STD_I64LE, s.get(), H5T_NATIVE_INT64, &value, where_);
}

void Object::set_attr(const std::string& name, uint64_t value) {
  Id s(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr(id(), name, H5T_STD_U64LE, s.get(), H5T_NATIVE_UINT64, &value, where_);
}

void Object::set_attr(const std::string& name, double value) {
  Id s(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr(id(), name, H5T_IEEE_F64LE, s.get(), H5T_NATIVE_DOUBLE, &value, where_);
}

void Object::set_attr(const std::string& name, const std::vector<int64_t>& values) {
  Id s = make_space({static_cast<int64_t>(values.size())});
  write_attr(id(), name, H5T_STD_I64LE, s.get(), H5T_NATIVE_INT64, values.data(), where_);
}

namespace {
struct OpenAttr {
  Id attr, type, space;
};

OpenAttr open_attr(hid_t obj, const std::string& name, const std::string& where) {
  init();
  const htri_t e = H5Aexists(obj, name.c_str());
  if (e < 0) fail_at(where, "cannot look up attribute", name);
  if (e == 0) fail_at(where, "missing attribute", name);
  OpenAttr a;
  a.attr = Id(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!a.attr) fail_at(where, "cannot open attribute", name);
  a.type = Id(H5Aget_type(a.attr.get()), H5Tclose);
  a.space = Id(H5Aget_space(a.attr.get()), H5Sclose);
  if (!a.type || !a.space) fail_at(where, "cannot read the type of attribute", name);
  return a;
}

template <class T>
std::vector<T> read_numeric_attr(hid_t obj, const std::string& name, const std::string& where, Type t) {
  OpenAttr a = open_attr(obj, name, where);
  if (!numeric_class(a.type.get())) fail_at(where, "attribute is not a number:", name);
  // HDF5 would convert 2.7 to 2 without a word: a float where an integer belongs is an error instead.
  if (integer_type(t) && H5Tget_class(a.type.get()) != H5T_INTEGER)
    throw UsageError(where + ": attribute '" + name + "' holds floating-point values where integers belong");
  const int64_t n = space_points(a.space.get());
  if (n < 0) fail_at(where, "cannot read the size of attribute", name);
  std::vector<T> v(static_cast<size_t>(n));
  if (n > 0 && t == Type::Type_u64 && H5Tget_sign(a.type.get()) == H5T_SGN_2) {
    // A signed integer read as uint64 keeps its 64 bits (two's complement): checksums are defined mod 2^64,
    // and h5py writes a Python int as int64 unless told otherwise. HDF5's conversion would clamp negatives to 0.
    std::vector<int64_t> s(static_cast<size_t>(n));
    if (H5Aread(a.attr.get(), H5T_NATIVE_INT64, s.data()) < 0) fail_at(where, "cannot read attribute", name);
    for (size_t i = 0; i < s.size(); ++i) v[i] = static_cast<T>(static_cast<uint64_t>(s[i]));
    return v;
  }
  if (n > 0 && H5Aread(a.attr.get(), mem_type(t), v.data()) < 0) fail_at(where, "cannot read attribute", name);
  return v;
}

template <class T>
T read_scalar_attr(hid_t obj, const std::string& name, const std::string& where, Type t) {
  auto v = read_numeric_attr<T>(obj, name, where, t);
  if (v.size() != 1)
    throw UsageError(where + ": attribute '" + name + "' has " + std::to_string(v.size()) +
                     " values where one number belongs");
  return v[0];
}
}  // namespace

std::string Object::attr_string(const std::string& name) const {
  OpenAttr a = open_attr(id(), name, where_);
  if (H5Tget_class(a.type.get()) != H5T_STRING) fail("attribute is not a string:", name);
  if (space_points(a.space.get()) != 1) fail("string attribute does not hold exactly one string:", name);
  const htri_t vlen = H5Tis_variable_str(a.type.get());
  if (vlen < 0) fail("cannot read the type of attribute", name);
  if (vlen > 0) {
    Id mt = vlen_string_type();
    H5Tset_cset(mt.get(), H5Tget_cset(a.type.get()));
    char* p = nullptr;
    if (H5Aread(a.attr.get(), mt.get(), &p) < 0) fail("cannot read attribute", name);
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
  }
  const size_t size = H5Tget_size(a.type.get());
  if (size == 0) fail("cannot read the size of attribute", name);
  std::string buf(size, '\0');
  if (H5Aread(a.attr.get(), a.type.get(), buf.data()) < 0) fail("cannot read attribute", name);
  buf.resize(std::min(buf.find('\0'), buf.size()));
  return buf;
}

int64_t Object::attr_int(const std::string& name) const {
  return read_scalar_attr<int64_t>(id(), name, where_, Type::Type_i64);
}
uint64_t Object::attr_uint(const std::string& name) const {
  return read_scalar_attr<uint64_t>(id(), name, where_, Type::Type_u64);
}
double Object::attr_double(const std::string& name) const {
  return read_scalar_attr<double>(id(), name, where_, Type::Type_f64);
}
std::vector<int64_t> Object::attr_ints(const std::string& name) const {
  return read_numeric_attr<int64_t>(id(), name, where_, Type::Type_i64);
}
std::string Object::attr_string_or(const std::string& name, const std::string& fallback) const {
  return has_attr(name) ? attr_string(name) : fallback;
}
int64_t Object::attr_int_or(const std::string& name, int64_t fallback) const {
  return has_attr(name) ? attr_int(name) : fallback;
}

// ---------------------------------------------------------------------------------------------------
// Datasets
// ---------------------------------------------------------------------------------------------------

std::vector<int64_t> Dataset::shape() const {
  Id s(H5Dget_space(id()), H5Sclose);
  if (!s) fail("cannot read the shape of dataset", "");
  const int nd = H5Sget_simple_extent_ndims(s.get());
  if (nd < 0) fail("cannot read the shape of dataset", "");
  std::vector<hsize_t> dims(nd);
  if (nd > 0) H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr);
  for (hsize_t d : dims)
    if (d >= kMaxExtent)
      throw UsageError(where_ + ": an extent of " + std::to_string(d) + " (a dataset's extents are below 2^62)");
  return std::vector<int64_t>(dims.begin(), dims.end());
}

int64_t Dataset::elements(const std::vector<int64_t>& shape) const {
  // Extents below 2^62 each (shape()), their product formed only while it stays so.
  constexpr int64_t kMax = static_cast<int64_t>(kMaxExtent);
  int64_t n = 1;
  for (int64_t d : shape)
    if (d == 0) return 0;
  for (int64_t d : shape) {
    if (n > kMax / d) throw UsageError(where_ + ": its extents multiply past 2^62 elements");
    n *= d;
  }
  return n;
}

namespace {
// At most this many bytes are read back from one byte that a filter stores (deflate's limit is 1032:1): the bound
// where HDF5 is too old to count a dataset's chunks.
[[maybe_unused]] constexpr uint64_t kMaxFilterRatio = 1100;
}  // namespace

void Dataset::check_readable(Type t, int64_t n) const {
  Id type(H5Dget_type(id()), H5Tclose);
  if (!type) fail("cannot read the type of dataset", "");
  if (!numeric_class(type.get())) fail("dataset does not hold numbers", "");
  if (integer_type(t) && H5Tget_class(type.get()) != H5T_INTEGER)
    throw UsageError(where_ + ": dataset holds floating-point values where integers belong");
  Id s(H5Dget_space(id()), H5Sclose);
  const int64_t have = s ? space_points(s.get()) : -1;
  if (have != n)
    throw UsageError(where_ + ": dataset has " + std::to_string(have) + " elements, expected " + std::to_string(n));
  if (n == 0) return;
  // The values must be in the file: HDF5 would hand back fill values for storage never written (a file of kilobytes
  // declaring terabytes), and would read another file's bytes for external storage or a virtual dataset.
  Id dcpl(H5Dget_create_plist(id()), H5Pclose);
  if (!dcpl) fail("cannot read the storage of dataset", "");
  const int external = H5Pget_external_count(dcpl.get());
  if (external != 0)
    throw UsageError(where_ + ": its values are stored in another file (external storage), which is not read");
  const uint64_t bytes_each = H5Tget_size(type.get());
  const uint64_t stored = H5Dget_storage_size(id());
  const auto missing = [&](const std::string& what) {
    throw UsageError(where_ + ": declares " + std::to_string(n) + " elements, but " + what +
                     " (the file does not hold the dataset's values)");
  };
  switch (H5Pget_layout(dcpl.get())) {
    case H5D_COMPACT: return;  // in the object header itself
    case H5D_CONTIGUOUS:
      if (bytes_each == 0 || stored / bytes_each < static_cast<uint64_t>(n))
        missing("stores " + std::to_string(stored) + " bytes of them");
      return;
    case H5D_CHUNKED: {
      const int rank = H5Sget_simple_extent_ndims(s.get());
      std::vector<hsize_t> dims(std::max(rank, 0)), chunk(std::max(rank, 0));
      if (rank <= 0 || H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr) < 0 ||
          H5Pget_chunk(dcpl.get(), rank, chunk.data()) != rank)
        fail("cannot read the chunks of dataset", "");
#if H5_VERSION_GE(1, 10, 5)
      uint64_t chunks = 1;  // at most n: every chunk holds at least one element
      for (int i = 0; i < rank; ++i) {
        if (chunk[i] == 0) fail("cannot read the chunks of dataset", "");
        chunks *= (dims[i] + chunk[i] - 1) / chunk[i];
      }
      hsize_t written = 0;
      if (H5Dget_num_chunks(id(), s.get(), &written) < 0) fail("cannot count the chunks of dataset", "");
      if (written != chunks)
        missing("stores " + std::to_string(written) + " of its " + std::to_string(chunks) + " chunks");
#else
      if (stored == 0 || stored * kMaxFilterRatio / std::max<uint64_t>(bytes_each, 1) < static_cast<uint64_t>(n))
        missing("stores " + std::to_string(stored) + " bytes of them");
#endif
      return;
    }
    default:
      throw UsageError(where_ + ": a virtual dataset (its values mapped from other datasets or files), which is not "
                       "read");
  }
}

void Dataset::read_checked(Type t, void* out, int64_t n) const {
  if (n > 0 && H5Dread(id(), mem_type(t), H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    fail("cannot read dataset (file truncated or corrupt?)", "");
}

void Dataset::read_raw(Type t, void* out, int64_t n) const {
  check_readable(t, n);
  read_checked(t, out, n);
}

template <class T> void Dataset::read(T* out, int64_t n) const { read_raw(type_of<T>(), out, n); }

template void Dataset::read<float>(float*, int64_t) const;
template void Dataset::read<double>(double*, int64_t) const;
template void Dataset::read<int32_t>(int32_t*, int64_t) const;
template void Dataset::read<int64_t>(int64_t*, int64_t) const;
template void Dataset::read<uint64_t>(uint64_t*, int64_t) const;

// ---------------------------------------------------------------------------------------------------
// Groups
// ---------------------------------------------------------------------------------------------------

std::string Group::child_where(const std::string& name) const {
  return where_ + (where_.back() == '/' ? "" : "/") + name;
}

Group Group::create_group(const std::string& name) {
  init();
  Id g(H5Gcreate2(id(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g) fail("cannot create group", name);
  return Group(std::move(g), child_where(name));
}

namespace {
// Link traversal that never opens another file: every external link met on the way (a soft link's path may pass
// through one) fails it.
herr_t refuse_external(const char*, const char*, const char*, const char*, unsigned*, hid_t, void*) { return -1; }
hid_t in_file_access() {
  static const hid_t lapl = [] {
    const hid_t p = H5Pcreate(H5P_LINK_ACCESS);
    H5Pset_elink_cb(p, refuse_external, nullptr);
    return p;
  }();
  return lapl;
}
}  // namespace

bool Group::has(const std::string& name) const {
  init();
  const htri_t r = H5Lexists(id(), name.c_str(), in_file_access());
  if (r < 0) fail("cannot look up", name);
  if (r == 0) return false;
  // A dump holds its objects itself: a link to another file (external, or a soft link whose path leaves this one)
  // is refused, never followed.
  H5L_info_t info;
  if (H5Lget_info(id(), name.c_str(), &info, in_file_access()) < 0) fail("cannot look up", name);
  if (info.type == H5L_TYPE_HARD) return true;
  std::string target;
  if (info.u.val_size > 0 && info.u.val_size < (1u << 16)) {
    std::string val(info.u.val_size, '\0');
    if (H5Lget_val(id(), name.c_str(), val.data(), val.size(), in_file_access()) >= 0) {
      if (info.type == H5L_TYPE_EXTERNAL) {
        const char *file = nullptr, *obj = nullptr;
        unsigned flags = 0;
        if (H5Lunpack_elink_val(val.data(), val.size(), &flags, &file, &obj) >= 0 && file && obj)
          target = std::string(file) + ":" + obj;
      } else {
        target = std::string(val.c_str());
      }
    }
  }
  H5Eclear2(H5E_DEFAULT);
  if (info.type == H5L_TYPE_EXTERNAL)
    throw UsageError(child_where(name) + ": an external link" + (target.empty() ? "" : " to " + target) +
                     " (a dump holds its objects itself; links to other files are not followed)");
  if (info.type == H5L_TYPE_SOFT) {
    Id o(H5Oopen(id(), name.c_str(), in_file_access()), H5Oclose);
    H5Eclear2(H5E_DEFAULT);
    if (!o)
      throw UsageError(child_where(name) + ": a soft link to '" + target + "', which leads out of the file or to " +
                       "nothing (links to other files are not followed)");
    return true;
  }
  throw UsageError(child_where(name) + ": a user-defined link (class " + std::to_string(static_cast<int>(info.type)) +
                   "), not followed");
}

namespace {
H5I_type_t object_kind(hid_t loc, const std::string& name) {
  Id o(H5Oopen(loc, name.c_str(), in_file_access()), H5Oclose);
  if (!o) return H5I_BADID;
  return H5Iget_type(o.get());
}
}  // namespace

bool Group::has_group(const std::string& name) const { return has(name) && object_kind(id(), name) == H5I_GROUP; }
bool Group::has_dataset(const std::string& name) const {
  return has(name) && object_kind(id(), name) == H5I_DATASET;
}

Group Group::open_group(const std::string& name) const {
  if (!has(name)) throw UsageError(where_ + ": missing group '" + name + "'");
  if (object_kind(id(), name) != H5I_GROUP) throw UsageError(child_where(name) + ": is not a group");
  Id g(H5Gopen2(id(), name.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g) fail("cannot open group", name);
  return Group(std::move(g), child_where(name));
}

std::vector<std::string> Group::children() const {
  init();
  H5G_info_t info;
  if (H5Gget_info(id(), &info) < 0) fail("cannot list group", "");
  std::vector<std::string> out;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) fail("cannot list group", "");
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    out.push_back(std::move(name));
  }
  return out;
}

Dataset Group::write_raw(const std::string& name, const std::vector<int64_t>& shape, Type t, const void* data) {
  init();
  for (int64_t d : shape)
    if (d < 0) throw UsageError(child_where(name) + ": negative extent in shape");
  Id space = make_space(shape);
  if (!space) fail("cannot make the dataspace of", name);
  // Large datasets (>= 64 KiB: kv caches, full tensors of big models) are stored deflated (shuffle + gzip level 1,
  // one chunk along the first axis per row block), which h5py and h5dump read natively: caches are mostly
  // unfilled pages, and goldens are committed. Small ones stay contiguous.
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  constexpr int64_t kDeflateFrom = 64 * 1024;
  if (!shape.empty() && shape[0] > 0 && space_points(space.get()) * static_cast<int64_t>(H5Tget_size(file_type(t))) >= kDeflateFrom &&
      H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0) {
    std::vector<hsize_t> chunk(shape.begin(), shape.end());
    int64_t row = static_cast<int64_t>(H5Tget_size(file_type(t)));
    for (size_t i = 1; i < shape.size(); ++i) row *= std::max<int64_t>(shape[i], 1);
    chunk[0] = static_cast<hsize_t>(std::clamp<int64_t>((int64_t{1} << 20) / std::max<int64_t>(row, 1), 1, shape[0]));
    if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0 || H5Pset_shuffle(dcpl.get()) < 0 ||
        H5Pset_deflate(dcpl.get(), 1) < 0)
      fail("cannot set the storage of dataset", name);
  }
  Id d(H5Dcreate2(id(), name.c_str(), file_type(t), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!d) fail("cannot create dataset", name);
  if (space_points(space.get()) > 0 && H5Dwrite(d.get(), mem_type(t), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail("cannot write dataset", name);
  return Dataset(std::move(d), child_where(name));
}

Dataset Group::open_dataset(const std::string& name) const {
  if (!has(name)) throw UsageError(where_ + ": missing dataset '" + name + "'");
  if (object_kind(id(), name) != H5I_DATASET) throw UsageError(child_where(name) + ": is not a dataset");
  Id d(H5Dopen2(id(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d) fail("cannot open dataset", name);
  return Dataset(std::move(d), child_where(name));
}

template <class T>
std::vector<T> Group::read(const std::string& name, const std::vector<int64_t>& expect, std::vector<int64_t>* shape) const {
  Dataset d = open_dataset(name);
  const auto s = d.shape();
  if (!expect.empty()) {
    bool ok = s.size() == expect.size();
    for (size_t i = 0; ok && i < s.size(); ++i) ok = expect[i] < 0 || expect[i] == s[i];
    if (!ok) {
      std::string want = "[";
      for (size_t i = 0; i < expect.size(); ++i)
        want += (i ? "," : "") + (expect[i] < 0 ? std::string("*") : std::to_string(expect[i]));
      want += "]";
      std::string got = "[";
      for (size_t i = 0; i < s.size(); ++i) got += (i ? "," : "") + std::to_string(s[i]);
      got += "]";
      throw UsageError(d.where() + ": shape " + got + ", expected " + want);
    }
  }
  // Everything checked before the values are allocated: sizes come from the file.
  const int64_t n = d.elements(s);
  d.check_readable(type_of<T>(), n);
  std::vector<T> v(static_cast<size_t>(n));
  d.read_checked(type_of<T>(), v.data(), n);
  if (shape) *shape = s;
  return v;
}

template std::vector<float> Group::read<float>(const std::string&, const std::vector<int64_t>&,
                                               std::vector<int64_t>*) const;
template std::vector<double> Group::read<double>(const std::string&, const std::vector<int64_t>&,
                                                 std::vector<int64_t>*) const;
template std::vector<int32_t> Group::read<int32_t>(const std::string&, const std::vector<int64_t>&,
                                                   std::vector<int64_t>*) const;
template std::vector<int64_t> Group::read<int64_t>(const std::string&, const std::vector<int64_t>&,
                                                   std::vector<int64_t>*) const;
template std::vector<uint64_t> Group::read<uint64_t>(const std::string&, const std::vector<int64_t>&,
                                                     std::vector<int64_t>*) const;

// ---------------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------------

namespace {
Id file_access() {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // Closing the file closes every object still open in it: a file handle never outlives its close().
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  return fapl;
}
}  // namespace

File File::create(const std::string& path) {
  init();
  Id fapl = file_access();
  Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!f) fail_at(path, "cannot create HDF5 file", "");
  return File(std::move(f), path);
}

bool File::is_hdf5(const std::string& path) {
  init();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const htri_t r = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

File File::open_read(const std::string& path) {
  init();
  Id fapl = file_access();
  Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!f) fail_at(path, "cannot open HDF5 file", "");
  return File(std::move(f), path);
}

void File::flush() {
  if (H5Fflush(id(), H5F_SCOPE_GLOBAL) < 0) fail_at(path_, "cannot flush", "");
}

void File::close() {
  if (id_.close() < 0) fail_at(path_, "cannot close (write failed?)", "");
}

}  // namespace mla::h5
