// A small RAII layer over the HDF5 C API for dumps: files, groups, datasets and attributes of plain types only
// (variable-length UTF-8 strings, int32/int64/uint64/float32/float64, 1-D and N-D), so h5py and h5dump read
// them. HDF5's automatic error printing is off; every failure is a UsageError naming the file, the object and
// HDF5's own innermost message ("truncated file: eof = ...").
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mla::h5 {

// Owns one hid_t and closes it with the matching H5*close.
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer close) : id_(id), close_(close) {}
  ~Id() { reset(); }
  Id(Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Id& operator=(Id&& o) noexcept;
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  void reset();
  herr_t close();  // closes now and reports the result (files: flushes)

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// Turns off HDF5's error printing (once per process). Every entry point below calls it.
void init();

// The element types datasets and attributes are written with (and read back into, converting).
enum class Type { Type_f32, Type_f64, Type_i32, Type_i64, Type_u64 };
template <class T> constexpr Type type_of();
template <> constexpr Type type_of<float>() { return Type::Type_f32; }
template <> constexpr Type type_of<double>() { return Type::Type_f64; }
template <> constexpr Type type_of<int32_t>() { return Type::Type_i32; }
template <> constexpr Type type_of<int64_t>() { return Type::Type_i64; }
template <> constexpr Type type_of<uint64_t>() { return Type::Type_u64; }

// Anything that carries attributes: a group (the file's root too) or a dataset. `where()` is
// "file.h5:/layer0/x" for messages.
class Object {
 public:
  const std::string& where() const { return where_; }
  hid_t id() const { return id_.get(); }

  bool has_attr(const std::string& name) const;
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, const char* value) { set_attr(name, std::string(value)); }
  void set_attr(const std::string& name, int64_t value);
  void set_attr(const std::string& name, int value) { set_attr(name, static_cast<int64_t>(value)); }
  void set_attr(const std::string& name, uint64_t value);
  void set_attr(const std::string& name, double value);
  void set_attr(const std::string& name, const std::vector<int64_t>& values);  // 1-D int64

  // Readers convert from any integer/float the file holds, except that the integer readers refuse floats (HDF5
  // would truncate 2.7 to 2) and attr_uint keeps a signed integer's 64 bits; a missing attribute or a wrong class
  // (a string where a number belongs) is a UsageError.
  std::string attr_string(const std::string& name) const;  // variable- or fixed-length
  int64_t attr_int(const std::string& name) const;
  uint64_t attr_uint(const std::string& name) const;
  double attr_double(const std::string& name) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;  // scalar or 1-D
  // With a fallback when absent (provenance written by other producers may lack some).
  std::string attr_string_or(const std::string& name, const std::string& fallback) const;
  int64_t attr_int_or(const std::string& name, int64_t fallback) const;

 protected:
  Object() = default;
  Object(Id id, std::string where) : id_(std::move(id)), where_(std::move(where)) {}
  [[noreturn]] void fail(const std::string& what, const std::string& name) const;

  Id id_;
  std::string where_;
};

// Extents of a dataset (and their product) are below this; larger ones are refused.
inline constexpr uint64_t kMaxExtent = uint64_t{1} << 62;

class Dataset : public Object {
 public:
  std::vector<int64_t> shape() const;  // UsageError for an extent of 2^62 or more
  // Reads the whole dataset converted to T (an integer T refuses a float dataset); n must equal the element count.
  // Refused before anything is read: values the file does not hold (contiguous storage never written, chunks
  // missing: HDF5 would make up fill values), external storage and virtual datasets (values from other files).
  template <class T> void read(T* out, int64_t n) const;

 private:
  friend class Group;
  Dataset(Id id, std::string where) : Object(std::move(id), std::move(where)) {}
  int64_t elements(const std::vector<int64_t>& shape) const;  // UsageError past 2^62
  void check_readable(Type t, int64_t n) const;
  void read_checked(Type t, void* out, int64_t n) const;
  void read_raw(Type t, void* out, int64_t n) const;
};

class Group : public Object {
 public:
  Group create_group(const std::string& name);
  Group open_group(const std::string& name) const;  // UsageError if absent or not a group
  bool has(const std::string& name) const;           // a link of that name exists
  bool has_group(const std::string& name) const;
  bool has_dataset(const std::string& name) const;
  std::vector<std::string> children() const;         // link names, in name order

  // Contiguous datasets of `shape` (row-major) from `data` (numel(shape) elements).
  template <class T> Dataset write(const std::string& name, const std::vector<int64_t>& shape, const T* data) {
    return write_raw(name, shape, type_of<T>(), data);
  }
  template <class T> Dataset write(const std::string& name, const std::vector<int64_t>& shape, const std::vector<T>& v) {
    return write_raw(name, shape, type_of<T>(), v.data());
  }
  Dataset open_dataset(const std::string& name) const;  // UsageError if absent or not a dataset
  // Reads a dataset converted to T; its shape must be `expect` (-1 = any extent on that axis) unless
  // `expect` is empty; the actual shape goes to *shape.
  template <class T>
  std::vector<T> read(const std::string& name, const std::vector<int64_t>& expect = {},
                      std::vector<int64_t>* shape = nullptr) const;

 protected:
  friend class File;
  Group() = default;
  Group(Id id, std::string where) : Object(std::move(id), std::move(where)) {}
  Dataset write_raw(const std::string& name, const std::vector<int64_t>& shape, Type t, const void* data);
  std::string child_where(const std::string& name) const;
};

class File : public Group {
 public:
  static File create(const std::string& path);  // truncates
  static File open_read(const std::string& path);
  static bool is_hdf5(const std::string& path);  // false for missing, empty or foreign files
  const std::string& path() const { return path_; }
  void flush();
  void close();  // closes now (errors are reported, unlike the destructor)

 private:
  File(Id id, std::string path) : Group(std::move(id), path + ":/"), path_(std::move(path)) {}
  std::string path_;
};

extern template void Dataset::read<float>(float*, int64_t) const;
extern template void Dataset::read<double>(double*, int64_t) const;
extern template void Dataset::read<int32_t>(int32_t*, int64_t) const;
extern template void Dataset::read<int64_t>(int64_t*, int64_t) const;
extern template void Dataset::read<uint64_t>(uint64_t*, int64_t) const;
extern template std::vector<float> Group::read<float>(const std::string&, const std::vector<int64_t>&,
                                                      std::vector<int64_t>*) const;
extern template std::vector<double> Group::read<double>(const std::string&, const std::vector<int64_t>&,
                                                        std::vector<int64_t>*) const;
extern template std::vector<int32_t> Group::read<int32_t>(const std::string&, const std::vector<int64_t>&,
                                                          std::vector<int64_t>*) const;
extern template std::vector<int64_t> Group::read<int64_t>(const std::string&, const std::vector<int64_t>&,
                                                          std::vector<int64_t>*) const;
extern template std::vector<uint64_t> Group::read<uint64_t>(const std::string&, const std::vector<int64_t>&,
                                                            std::vector<int64_t>*) const;

}  // namespace mla::h5
