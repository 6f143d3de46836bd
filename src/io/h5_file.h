// A small RAII layer over the HDF5 C library for weight files and test fixtures: list, inspect and read
// datasets, read root attributes, and write a new file crash-safely (temp file beside it, renamed on
// commit()). Every failure is an IoError naming the file (and the key), with HDF5's own reason appended.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace cz::h5 {

struct DatasetInfo {
  Shape shape;
  DType dtype = DType::f32;  // the file's element type: f16/f32/f64 for floats, i32/i64/u8 for integers
};

class File {
 public:
  // Read-only. IoError naming `path` when it is missing, unreadable or not an HDF5 file.
  static File open(const std::string& path);
  // A new file that appears under `path` only when commit() succeeds; until then it is written to a temporary
  // file in the same directory (so the final rename is atomic), which is removed if the File dies
  // uncommitted.
  static File create(const std::string& path);

  File(File&& other) noexcept;
  File& operator=(File&&) = delete;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }

  // Every dataset reachable through hard links, as slash-separated paths without the leading '/', sorted.
  std::vector<std::string> datasets() const;
  bool has_dataset(const std::string& key) const;
  DatasetInfo info(const std::string& key) const;
  // A contiguous CPU tensor of the dataset's shape: f64 datasets as f64, other floats (f16, f32) as f32,
  // integers as i64.
  Tensor read(const std::string& key) const;

  // Attributes of the root group. Numbers are converted (an int attribute reads as a double); int_attrs reads
  // a scalar or a 1-D array.
  bool has_attr(const std::string& name) const;
  std::vector<int64_t> int_attrs(const std::string& name) const;
  int64_t int_attr(const std::string& name) const;
  double double_attr(const std::string& name) const;
  std::string string_attr(const std::string& name) const;

  // Writing (files from create() only). `key` may contain '/' (groups are created); t: CPU, f16/f32/f64/i64.
  void write(const std::string& key, const Tensor& t);
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, int64_t value);
  // Flushes, syncs and renames the temporary file to path(); the File is closed afterwards.
  void commit();

 private:
  File(std::string path, std::string temp_path, int64_t id);
  void close() noexcept;

  std::string path_;
  std::string temp_path_;  // non-empty while a created file is uncommitted
  int64_t id_ = -1;        // hid_t
};

}  // namespace cz::h5
