// Internals of the HDF5 layer shared by its .cpp files (h5_file.cpp, h5_read.cpp, h5_write.cpp,
// h5_append.cpp): identifier ownership, failure reporting that names the file, and our dtypes' HDF5 types.
// Not for use outside src/io/h5/h5_*.
#pragma once

#include <hdf5.h>

#include <string>
#include <utility>

#include "tensor/dtype.h"

namespace cz::h5::detail {

// Owns one HDF5 identifier of any kind (H5Idec_ref closes files, groups, datasets, spaces, types, lists).
class Id {
 public:
  explicit Id(hid_t id = H5I_INVALID_HID) : id_(id) {}
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Id& operator=(Id&& o) noexcept {
    std::swap(id_, o.id_);
    return *this;
  }
  ~Id() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  hid_t get() const { return id_; }

 private:
  hid_t id_;
};

// IoError "PATH: WHAT: <HDF5's reason>".
[[noreturn]] void fail(const std::string& path, const std::string& what);
hid_t check_id(hid_t id, const std::string& path, const std::string& what);
void check_ok(herr_t status, const std::string& path, const std::string& what);

// The native type a CPU tensor of dtype t is handed to HDF5 in.
hid_t memory_type(DType t);
// IEEE binary16, little-endian, as numpy/h5py store float16.
Id ieee_half_type(const std::string& path);

// The file and memory types a tensor of dtype t is written with (f16 through `half`, which owns the type).
// DtypeError naming `key` for dtypes that are not written (only f16, f32, f64, i64, u8 are).
struct FileTypes {
  hid_t file = H5T_IEEE_F32LE, mem = H5T_NATIVE_FLOAT;
  Id half;
};
FileTypes file_types(DType t, const std::string& path, const std::string& key);

}  // namespace cz::h5::detail
