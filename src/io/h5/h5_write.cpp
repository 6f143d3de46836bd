// Writing HDF5 files: datasets (checkpoints' chunks written with their checksums directly), virtual datasets
// over other files, and root attributes. Opening, creating and committing files is h5_file.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include <hdf5.h>

#include <string>
#include <vector>

#include "io/h5/fletcher32.h"
#include "io/h5/h5_detail.h"
#include "io/h5/h5_file.h"

namespace cz::h5 {
using namespace detail;

namespace {

// Writes the chunks of a chunked, Fletcher-32-filtered dataset directly (H5Dwrite_chunk), each with its
// checksum appended as the filter would (little-endian): one copy into a reused buffer and a vectorised sum
// (Note [Fletcher-32 by blocks]) instead of the filter pipeline's allocation, copy and byte-wise sum per
// chunk, which halved the write bandwidth of a checkpoint. Edge chunks are padded with zeros, as HDF5 stores
// them. Raw bytes go to the file, so the file types are the host's (little-endian) ones.
// Returns the first row of the chunk that could not be written, or -1.
int64_t write_checksummed_chunks(hid_t ds, const Tensor& t, int64_t rows_per_chunk) {
  static_assert(std::endian::native == std::endian::little, "checkpoint chunks are written as raw LE bytes");
  const int64_t rows = t.size(0);
  const size_t row_bytes = t.nbytes() / size_t(rows);
  const size_t chunk_bytes = row_bytes * size_t(rows_per_chunk);
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < chunk_bytes + 4) buffer.resize(chunk_bytes + 4);
  const auto* src = static_cast<const uint8_t*>(t.raw_data());
  std::vector<hsize_t> offset(size_t(t.dim()), 0);
  for (int64_t row = 0; row < rows; row += rows_per_chunk) {
    const size_t bytes = row_bytes * size_t(std::min(rows_per_chunk, rows - row));
    std::memcpy(buffer.data(), src + size_t(row) * row_bytes, bytes);
    std::memset(buffer.data() + bytes, 0, chunk_bytes - bytes);
    const uint32_t sum = fletcher32(buffer.data(), chunk_bytes);
    std::memcpy(buffer.data() + chunk_bytes, &sum, 4);
    offset[0] = hsize_t(row);
    if (H5Dwrite_chunk(ds, H5P_DEFAULT, 0, offset.data(), chunk_bytes + 4, buffer.data()) < 0) return row;
  }
  return -1;
}

}  // namespace

void File::write(const std::string& key, const Tensor& t, const WriteOptions& options) {
  check_writable("write");
  CZ_CHECK_IO(t.defined() && t.is_cpu() && t.is_contiguous(), "{}: '{}' must be a contiguous CPU tensor",
              path_, key);
  const FileTypes types = file_types(t.dtype(), path_, key);
  const hid_t file_type = types.file, mem_type = types.mem;
  std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
  const Id space(check_id(
      dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(dims.size()), dims.data(), nullptr), path_,
      "creating a dataspace"));
  const Id lcpl(check_id(H5Pcreate(H5P_LINK_CREATE), path_, "creating a property list"));
  check_ok(H5Pset_create_intermediate_group(lcpl.get(), 1), path_, "creating a property list");
  const Id dcpl(check_id(H5Pcreate(H5P_DATASET_CREATE), path_, "creating a property list"));
  const bool chunked = options.checksum && t.dim() > 0 && t.numel() > 0;
  int64_t rows_per_chunk = 0;
  if (chunked) {
    // Equal chunks of at most max_chunk_bytes (but at least one row), so little is padded.
    const int64_t rows = t.size(0);
    const int64_t row_bytes = int64_t(t.nbytes()) / rows;
    const int64_t most = std::clamp<int64_t>(options.max_chunk_bytes / row_bytes, 1, rows);
    const int64_t chunks = (rows + most - 1) / most;
    rows_per_chunk = (rows + chunks - 1) / chunks;
    std::vector<hsize_t> chunk_dims = dims;
    chunk_dims[0] = hsize_t(rows_per_chunk);
    check_ok(H5Pset_chunk(dcpl.get(), int(chunk_dims.size()), chunk_dims.data()), path_, "setting chunks");
    check_ok(H5Pset_fletcher32(dcpl.get()), path_, "setting the Fletcher-32 filter");
    check_ok(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), path_, "setting the fill time");
  }
  const Id ds(write_id(
      H5Dcreate2(hid_t(id_), key.c_str(), file_type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
      fmt::format("creating dataset '{}'", key)));
  if (chunked) {
    const int64_t failed = write_checksummed_chunks(ds.get(), t, rows_per_chunk);
    if (failed >= 0)
      fail_write(fmt::format("writing dataset '{}' rows [{}, {})", key, failed,
                             std::min(failed + rows_per_chunk, t.size(0))));
  } else if (t.numel() > 0) {
    write_ok(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw_data()),
             fmt::format("writing dataset '{}'", key));
  }
}

namespace {

// A box of a row-major array: indices start[d] .. start[d] + count[d] - 1 in each dimension.
struct Box {
  std::vector<hsize_t> start, count;
};

// Note [Flat ranges as boxes]: the elements [b, e) of a row-major array are a union of boxes that are each
// contiguous in the flattening: a partial run along the last dimension, then whole rows, then whole planes,
// ..., and back down on the far side — at most 2 * rank - 1 boxes. Each maps in order onto a 1-D range of a
// source, which is how a virtual dataset can present a flat shard range in the parameter's own shape.
void flat_range_boxes(const Shape& shape, size_t dim, std::vector<hsize_t>& prefix, int64_t b, int64_t e,
                      std::vector<Box>& out) {
  if (b >= e) return;
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t i0 = b / inner, r0 = b % inner, i1 = e / inner, r1 = e % inner;
  auto descend = [&](int64_t index, int64_t lo, int64_t hi) {
    prefix.push_back(hsize_t(index));
    flat_range_boxes(shape, dim + 1, prefix, lo, hi, out);
    prefix.pop_back();
  };
  if (i0 == i1) {  // within one index of this dimension
    descend(i0, r0, r1);
    return;
  }
  int64_t full_begin = i0;
  if (r0 != 0) {
    descend(i0, r0, inner);
    ++full_begin;
  }
  if (i1 > full_begin) {
    Box box{prefix, std::vector<hsize_t>(prefix.size(), 1)};
    box.start.push_back(hsize_t(full_begin));
    box.count.push_back(hsize_t(i1 - full_begin));
    for (size_t d = dim + 1; d < shape.size(); ++d) {
      box.start.push_back(0);
      box.count.push_back(hsize_t(shape[d]));
    }
    out.push_back(std::move(box));
  }
  if (r1 != 0) descend(i1, 0, r1);
}

// HDF5 expands printf-style patterns in virtual source names; '%' must be doubled to mean itself.
std::string escape_percent(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '%' ? std::string("%%") : std::string(1, c);
  return out;
}

}  // namespace

void File::write_virtual(const std::string& key, const Shape& shape,
                         const std::vector<VirtualSource>& sources, float fill) {
  check_writable("write_virtual");
  const int64_t numel = shape_numel(shape);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  const Id vspace(check_id(
      dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(dims.size()), dims.data(), nullptr), path_,
      "creating a dataspace"));
  const Id dcpl(check_id(H5Pcreate(H5P_DATASET_CREATE), path_, "creating a property list"));
  check_ok(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_FLOAT, &fill), path_, "setting a fill value");
  std::vector<Box> boxes;
  std::vector<hsize_t> prefix;
  for (const VirtualSource& src : sources) {
    CZ_ASSERT(src.begin >= 0 && src.numel > 0 && src.begin + src.numel <= numel,
              "write_virtual: source {} [{}, {}) outside {}", src.dataset, src.begin, src.begin + src.numel,
              shape_str(shape));
    const hsize_t src_dims = hsize_t(src.numel);
    const Id sspace(check_id(H5Screate_simple(1, &src_dims, nullptr), path_, "creating a dataspace"));
    const std::string file = escape_percent(src.file), dataset = escape_percent(src.dataset);
    if (dims.empty()) {
      check_ok(H5Sselect_all(vspace.get()), path_, "selecting a box");
      check_ok(H5Pset_virtual(dcpl.get(), vspace.get(), file.c_str(), dataset.c_str(), sspace.get()), path_,
               fmt::format("mapping '{}' to {}:{}", key, src.file, src.dataset));
      continue;
    }
    boxes.clear();
    flat_range_boxes(shape, 0, prefix, src.begin, src.begin + src.numel, boxes);
    hsize_t consumed = 0;
    for (const Box& box : boxes) {
      hsize_t n = 1;
      for (hsize_t c : box.count) n *= c;
      check_ok(H5Sselect_hyperslab(vspace.get(), H5S_SELECT_SET, box.start.data(), nullptr, box.count.data(),
                                   nullptr),
               path_, "selecting a box");
      check_ok(H5Sselect_hyperslab(sspace.get(), H5S_SELECT_SET, &consumed, nullptr, &n, nullptr), path_,
               "selecting a range");
      check_ok(H5Pset_virtual(dcpl.get(), vspace.get(), file.c_str(), dataset.c_str(), sspace.get()), path_,
               fmt::format("mapping '{}' to {}:{}", key, src.file, src.dataset));
      consumed += n;
    }
    CZ_ASSERT(consumed == src_dims, "write_virtual: boxes cover {} of {} elements", consumed, src_dims);
  }
  const Id lcpl(check_id(H5Pcreate(H5P_LINK_CREATE), path_, "creating a property list"));
  check_ok(H5Pset_create_intermediate_group(lcpl.get(), 1), path_, "creating a property list");
  const Id ds(write_id(
      H5Dcreate2(hid_t(id_), key.c_str(), H5T_IEEE_F32LE, vspace.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
      fmt::format("creating virtual dataset '{}'", key)));
}

void File::set_attr(const std::string& name, const std::string& value) {
  check_writable("set_attr");
  // Variable-length UTF-8, as h5py writes str attributes, so Python reads it back as str.
  const Id type(check_id(H5Tcopy(H5T_C_S1), path_, "creating a string type"));
  check_ok(H5Tset_size(type.get(), H5T_VARIABLE), path_, "creating a string type");
  check_ok(H5Tset_cset(type.get(), H5T_CSET_UTF8), path_, "creating a string type");
  const Id space(check_id(H5Screate(H5S_SCALAR), path_, "creating a dataspace"));
  const Id attr(
      write_id(H5Acreate2(hid_t(id_), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
               fmt::format("creating attribute '{}'", name)));
  const char* s = value.c_str();
  write_ok(H5Awrite(attr.get(), type.get(), &s), fmt::format("writing attribute '{}'", name));
}

void File::set_attr(const std::string& name, int64_t value) {
  check_writable("set_attr");
  const Id space(check_id(H5Screate(H5S_SCALAR), path_, "creating a dataspace"));
  const Id attr(
      write_id(H5Acreate2(hid_t(id_), name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
               fmt::format("creating attribute '{}'", name)));
  write_ok(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), fmt::format("writing attribute '{}'", name));
}

void File::set_attr(const std::string& name, const std::vector<int64_t>& values) {
  check_writable("set_attr");
  const hsize_t n = values.size();
  const Id space(check_id(H5Screate_simple(1, &n, nullptr), path_, "creating a dataspace"));
  const Id attr(
      write_id(H5Acreate2(hid_t(id_), name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
               fmt::format("creating attribute '{}'", name)));
  write_ok(H5Awrite(attr.get(), H5T_NATIVE_INT64, values.data()),
           fmt::format("writing attribute '{}'", name));
}

void File::set_attr(const std::string& name, double value) {
  check_writable("set_attr");
  const Id space(check_id(H5Screate(H5S_SCALAR), path_, "creating a dataspace"));
  const Id attr(
      write_id(H5Acreate2(hid_t(id_), name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
               fmt::format("creating attribute '{}'", name)));
  write_ok(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value), fmt::format("writing attribute '{}'", name));
}

}  // namespace cz::h5
