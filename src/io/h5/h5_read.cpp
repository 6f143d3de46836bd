// Reading HDF5 files: datasets, their ranges (checkpoints' checksummed chunks read directly) and root
// attributes. Opening, creating and committing files is h5_file.cpp; writing is h5_write.cpp.
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

// The file's element type as one of ours. Floats must have exactly the IEEE half/single/double layout and
// integers no padding bits: anything else is refused here rather than handed to HDF5's generic conversions.
DType element_dtype(hid_t type, const std::string& path, const std::string& key) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  const size_t precision = H5Tget_precision(type);
  const int offset = H5Tget_offset(type);
  const H5T_order_t order = H5Tget_order(type);
  const bool plain = precision == size * 8 && offset == 0 && (order == H5T_ORDER_LE || order == H5T_ORDER_BE);
  if (cls == H5T_FLOAT && plain) {
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    const bool fields = H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) >= 0;
    const size_t ebias = H5Tget_ebias(type);
    const bool normalised = H5Tget_norm(type) == H5T_NORM_IMPLIED;
    auto ieee = [&](size_t e, size_t m) {
      return fields && normalised && spos == size * 8 - 1 && epos == m && esize == e && mpos == 0 &&
             msize == m && ebias == (size_t{1} << (e - 1)) - 1;
    };
    if (size == 2 && ieee(5, 10)) return DType::f16;
    if (size == 4 && ieee(8, 23)) return DType::f32;
    if (size == 8 && ieee(11, 52)) return DType::f64;
  }
  if (cls == H5T_INTEGER && plain) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 1 && !is_signed) return DType::u8;
    if (size <= 4 && is_signed) return DType::i32;
    if (size == 8 && is_signed) return DType::i64;
  }
  throw IoError(
      fmt::format("{}: dataset '{}' has an unsupported element type (HDF5 class {}, {} bytes, {} bits); "
                  "expected IEEE f16/f32/f64 or a plain integer",
                  path, key, int(cls), size, precision));
}

// The extent of a dataspace (scalar: rank 0), refusing sizes that overflow our int64 element counts.
Shape extent(hid_t space, const std::string& path, const std::string& key) {
  const H5S_class_t cls = H5Sget_simple_extent_type(space);
  CZ_CHECK_IO(cls == H5S_SIMPLE || cls == H5S_SCALAR,
              "{}: dataset '{}' has no data (null or unknown dataspace)", path, key);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) fail(path, fmt::format("cannot read the shape of '{}'", key));
  std::vector<hsize_t> dims(size_t(rank), 0);
  if (rank > 0) check_ok(H5Sget_simple_extent_dims(space, dims.data(), nullptr), path, "reading a shape");
  Shape shape;
  int64_t numel = 1;
  for (hsize_t d : dims) {
    CZ_CHECK_IO(d <= hsize_t(std::numeric_limits<int64_t>::max()) &&
                    !__builtin_mul_overflow(numel, int64_t(d), &numel),
                "{}: dataset '{}' claims an impossible size ({} dims, one of {})", path, key, rank, d);
    shape.push_back(int64_t(d));
  }
  return shape;
}

}  // namespace

namespace {

DType read_dtype(DType file_dtype) {
  if (file_dtype == DType::f64) return DType::f64;
  return is_floating(file_dtype) ? DType::f32 : DType::i64;
}

}  // namespace

std::vector<std::string> File::datasets() const {
  struct Visit {
    std::vector<std::string> found;
    std::string failed;
  } visit;
  const herr_t status = H5Lvisit(
      hid_t(id_), H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t group, const char* name, const H5L_info_t* info, void* data) -> herr_t {
        auto* v = static_cast<Visit*>(data);
        if (info->type != H5L_TYPE_HARD) return 0;  // soft and external links are not followed
        const Id object(H5Oopen(group, name, H5P_DEFAULT));
        if (object.get() < 0) {
          v->failed = name;
          return -1;
        }
        if (H5Iget_type(object.get()) == H5I_DATASET) v->found.emplace_back(name);
        return 0;
      },
      &visit);
  if (status < 0)
    fail(path_, visit.failed.empty() ? std::string("cannot list the datasets")
                                     : fmt::format("cannot open object '{}'", visit.failed));
  std::sort(visit.found.begin(), visit.found.end());
  return visit.found;
}

DatasetInfo File::info(const std::string& key) const {
  const Id ds(
      check_id(H5Dopen2(hid_t(id_), key.c_str(), H5P_DEFAULT), path_, fmt::format("no dataset '{}'", key)));
  const Id type(check_id(H5Dget_type(ds.get()), path_, fmt::format("reading the type of '{}'", key)));
  const Id space(check_id(H5Dget_space(ds.get()), path_, fmt::format("reading the shape of '{}'", key)));
  return {extent(space.get(), path_, key), element_dtype(type.get(), path_, key)};
}

Tensor File::read(const std::string& key) const {
  const DatasetInfo in = info(key);
  Tensor t = empty(in.shape, read_dtype(in.dtype));
  if (t.numel() == 0) return t;
  const Id ds(
      check_id(H5Dopen2(hid_t(id_), key.c_str(), H5P_DEFAULT), path_, fmt::format("no dataset '{}'", key)));
  check_ok(H5Dread(ds.get(), memory_type(t.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw_data()), path_,
           fmt::format("reading dataset '{}' {}", key, shape_str(in.shape)));
  return t;
}

namespace {

// Note [Reading checksummed chunks]: a range of a 1-D f32 dataset stored in Fletcher-32 chunks (what
// checkpoints write) is read chunk by chunk with H5Dread_chunk and checked with our vectorised sum (Note
// [Fletcher-32 by blocks]) instead of going through HDF5's filter pipeline, which sums byte by byte and
// copies twice, and held a checkpoint's load to about half the disk's read speed. The verdict is HDF5's: the
// stored sum must equal ours or its byte-swapped form (which HDF5 before 1.6.3 wrote on little-endian hosts).
// Returns false, having read nothing, for any other kind of dataset; HDF5's own path reads those.
bool read_checksummed_chunks(hid_t ds, int64_t begin, int64_t count, float* out, const std::string& path,
                             const std::string& key) {
  const Id dcpl(H5Dget_create_plist(ds));
  const Id type(H5Dget_type(ds));
  if (dcpl.get() < 0 || type.get() < 0 || H5Pget_layout(dcpl.get()) != H5D_CHUNKED ||
      H5Pget_nfilters(dcpl.get()) != 1 || H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0)
    return false;
  unsigned flags = 0, config = 0;
  size_t nvalues = 0;
  if (H5Pget_filter2(dcpl.get(), 0, &flags, &nvalues, nullptr, 0, nullptr, &config) != H5Z_FILTER_FLETCHER32)
    return false;
  hsize_t chunk = 0;
  if (H5Pget_chunk(dcpl.get(), 1, &chunk) != 1 || chunk == 0) return false;
  const size_t chunk_bytes = size_t(chunk) * 4;
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < chunk_bytes + 4) buffer.resize(chunk_bytes + 4);
  const int64_t end = begin + count;
  for (int64_t first = begin / int64_t(chunk) * int64_t(chunk); first < end; first += int64_t(chunk)) {
    hsize_t offset = hsize_t(first), stored_bytes = 0;
    if (H5Dget_chunk_storage_size(ds, &offset, &stored_bytes) < 0 || stored_bytes != chunk_bytes + 4) {
      H5Eclear2(H5E_DEFAULT);
      if (first == begin / int64_t(chunk) * int64_t(chunk)) return false;  // nothing read yet: HDF5's path
      throw IoError(fmt::format("{}: dataset '{}': the chunk at element {} is {} bytes, expected {}", path,
                                key, first, stored_bytes, chunk_bytes + 4));
    }
    uint32_t mask = 0;
    check_ok(H5Dread_chunk(ds, H5P_DEFAULT, &offset, &mask, buffer.data()), path,
             fmt::format("reading dataset '{}' chunk at element {}", key, first));
    CZ_CHECK_IO(mask == 0, "{}: dataset '{}': the chunk at element {} was stored unfiltered", path, key,
                first);
    uint32_t stored = 0;
    std::memcpy(&stored, buffer.data() + chunk_bytes, 4);
    const uint32_t sum = fletcher32(buffer.data(), chunk_bytes);
    const uint32_t swapped = ((sum & 0x00ff00ffu) << 8) | ((sum >> 8) & 0x00ff00ffu);
    CZ_CHECK_IO(
        stored == sum || stored == swapped,
        "{}: reading dataset '{}' elements [{}, {}): data error detected by Fletcher32 checksum in the "
        "chunk at element {} (stored {:#010x}, computed {:#010x})",
        path, key, begin, end, first, stored, sum);
    const int64_t lo = std::max(begin, first), hi = std::min(end, first + int64_t(chunk));
    std::memcpy(out + (lo - begin), buffer.data() + size_t(lo - first) * 4, size_t(hi - lo) * 4);
  }
  return true;
}

}  // namespace

void File::read_range(const std::string& key, int64_t begin, const Tensor& out) const {
  const DatasetInfo in = info(key);
  CZ_CHECK_IO(in.shape.size() == 1, "{}: dataset '{}' is {}, not 1-D", path_, key, shape_str(in.shape));
  CZ_ASSERT(out.defined() && out.is_cpu() && out.is_contiguous() && out.dtype() == read_dtype(in.dtype),
            "h5::File::read_range: out must be a contiguous CPU {} tensor", dtype_name(read_dtype(in.dtype)));
  const int64_t count = out.numel();
  CZ_CHECK_IO(begin >= 0 && begin <= in.shape[0] && count <= in.shape[0] - begin,
              "{}: dataset '{}' has {} elements; elements [{}, {}) were asked for", path_, key, in.shape[0],
              begin, begin + count);
  if (count == 0) return;
  const Id ds(
      check_id(H5Dopen2(hid_t(id_), key.c_str(), H5P_DEFAULT), path_, fmt::format("no dataset '{}'", key)));
  if (out.dtype() == DType::f32 &&
      read_checksummed_chunks(ds.get(), begin, count, out.data<float>(), path_, key))
    return;
  const Id space(check_id(H5Dget_space(ds.get()), path_, fmt::format("reading the shape of '{}'", key)));
  const hsize_t start = hsize_t(begin), n = hsize_t(count);
  check_ok(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr), path_,
           "selecting a range");
  const Id mem(check_id(H5Screate_simple(1, &n, nullptr), path_, "creating a dataspace"));
  check_ok(H5Dread(ds.get(), memory_type(out.dtype()), mem.get(), space.get(), H5P_DEFAULT, out.raw_data()),
           path_, fmt::format("reading dataset '{}' elements [{}, {})", key, begin, begin + count));
}

namespace {
// An open root attribute with its element class and element count.
struct Attr {
  Id attr, type, space;
  H5T_class_t cls;
  int64_t count;
};
Attr open_attr(hid_t file, const std::string& path, const std::string& name) {
  Id attr(check_id(H5Aopen(file, name.c_str(), H5P_DEFAULT), path, fmt::format("no attribute '{}'", name)));
  Id type(check_id(H5Aget_type(attr.get()), path, fmt::format("reading the type of attribute '{}'", name)));
  Id space(
      check_id(H5Aget_space(attr.get()), path, fmt::format("reading the shape of attribute '{}'", name)));
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  if (count < 0) fail(path, fmt::format("reading the shape of attribute '{}'", name));
  const H5T_class_t cls = H5Tget_class(type.get());
  return {std::move(attr), std::move(type), std::move(space), cls, int64_t(count)};
}
}  // namespace

std::vector<int64_t> File::int_attrs(const std::string& name) const {
  const Attr a = open_attr(hid_t(id_), path_, name);
  CZ_CHECK_IO(a.cls == H5T_INTEGER && a.count <= 4096, "{}: attribute '{}' is not a (small) integer array",
              path_, name);
  std::vector<int64_t> v(size_t(a.count));
  if (!v.empty())
    check_ok(H5Aread(a.attr.get(), H5T_NATIVE_INT64, v.data()), path_, "reading attribute " + name);
  return v;
}

int64_t File::int_attr(const std::string& name) const {
  const std::vector<int64_t> v = int_attrs(name);
  CZ_CHECK_IO(v.size() == 1, "{}: attribute '{}' has {} values, expected one", path_, name, v.size());
  return v[0];
}

double File::double_attr(const std::string& name) const {
  const Attr a = open_attr(hid_t(id_), path_, name);
  CZ_CHECK_IO((a.cls == H5T_FLOAT || a.cls == H5T_INTEGER) && a.count == 1,
              "{}: attribute '{}' is not a single number", path_, name);
  double v = 0;
  check_ok(H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, &v), path_, "reading attribute " + name);
  return v;
}

bool File::has_attr(const std::string& name) const {
  const htri_t exists = H5Aexists(hid_t(id_), name.c_str());
  if (exists < 0) fail(path_, fmt::format("looking for attribute '{}'", name));
  return exists > 0;
}

std::string File::string_attr(const std::string& name) const {
  const Attr a = open_attr(hid_t(id_), path_, name);
  CZ_CHECK_IO(a.cls == H5T_STRING && a.count == 1, "{}: attribute '{}' is not a string", path_, name);
  const htri_t variable = H5Tis_variable_str(a.type.get());
  if (variable < 0) fail(path_, "reading attribute " + name);
  const Id mem(check_id(H5Tcopy(H5T_C_S1), path_, "creating a string type"));
  check_ok(H5Tset_cset(mem.get(), H5Tget_cset(a.type.get())), path_,
           "creating a string type");  // ASCII or UTF-8
  if (variable > 0) {
    check_ok(H5Tset_size(mem.get(), H5T_VARIABLE), path_, "creating a string type");
    char* s = nullptr;
    check_ok(H5Aread(a.attr.get(), mem.get(), &s), path_, "reading attribute " + name);
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(a.type.get());
  CZ_CHECK_IO(size > 0 && size <= (1 << 20), "{}: attribute '{}' has a bad string size {}", path_, name,
              size);
  check_ok(H5Tset_size(mem.get(), size), path_, "creating a string type");
  std::string out(size, '\0');
  check_ok(H5Aread(a.attr.get(), mem.get(), out.data()), path_, "reading attribute " + name);
  out.resize(std::strlen(out.c_str()));
  return out;
}

}  // namespace cz::h5
