// HDF5 file access for weights and fixtures. Failures are IoErrors built here rather than through
// CZ_CHECK_STATUS: an HDF5 status alone cannot say which file and key went wrong, and that is what users
// need.
#include "io/h5_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "io/fletcher32.h"
#include "io/h5_detail.h"
#include "io/h5_probe.h"
#include "io/h5_writer_driver.h"

namespace cz::h5 {
using namespace detail;
namespace {

// HDF5 prints its error stack to stderr by default; we report through exceptions instead. The setting is
// per thread in a thread-safe build (checkpoints are written on a background thread).
void silence_hdf5() {
  thread_local const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
}

// The outermost and innermost messages of HDF5's error stack for the call that just failed.
std::string hdf5_reason() {
  struct Walk {
    std::string outer, inner;
  } walk;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        auto* w = static_cast<Walk*>(data);
        if (e->desc == nullptr || *e->desc == '\0') return 0;
        if (n == 0) w->outer = e->desc;
        w->inner = e->desc;
        return 0;
      },
      &walk);
  H5Eclear2(H5E_DEFAULT);
  if (walk.inner.empty()) return "HDF5 gave no reason";
  std::string reason = walk.outer == walk.inner ? walk.inner : walk.outer + ": " + walk.inner;
  std::replace(reason.begin(), reason.end(), '\n', ' ');  // HDF5's I/O errors embed ctime()'s newline
  return reason;
}

}  // namespace

namespace detail {
[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw IoError(fmt::format("{}: {}: {}", path, what, hdf5_reason()));
}
hid_t check_id(hid_t id, const std::string& path, const std::string& what) {
  if (id < 0) fail(path, what);
  return id;
}
void check_ok(herr_t status, const std::string& path, const std::string& what) {
  if (status < 0) fail(path, what);
}
}  // namespace detail

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

namespace detail {
hid_t memory_type(DType t) {
  switch (t) {
    case DType::f64:
      return H5T_NATIVE_DOUBLE;
    case DType::i64:
      return H5T_NATIVE_INT64;
    case DType::u8:
      return H5T_NATIVE_UINT8;
    default:
      return H5T_NATIVE_FLOAT;
  }
}

// IEEE binary16, little-endian, as numpy/h5py store float16 (HDF5 1.10 predefines no half type).
Id ieee_half_type(const std::string& path) {
  Id t(check_id(H5Tcopy(H5T_IEEE_F32LE), path, "creating a half type"));
  check_ok(H5Tset_fields(t.get(), 15, 10, 5, 0, 10), path, "creating a half type");
  check_ok(H5Tset_size(t.get(), 2), path, "creating a half type");
  check_ok(H5Tset_ebias(t.get(), 15), path, "creating a half type");
  return t;
}

FileTypes file_types(DType t, const std::string& path, const std::string& key) {
  FileTypes r;
  r.mem = memory_type(t);
  if (t == DType::f64)
    r.file = H5T_IEEE_F64LE;
  else if (t == DType::i64)
    r.file = H5T_STD_I64LE;
  else if (t == DType::u8)
    r.file = H5T_STD_U8LE;
  else if (t == DType::f16)
    r.half = ieee_half_type(path), r.file = r.mem = r.half.get();
  else
    CZ_CHECK_DTYPE(t == DType::f32, "{}: '{}' is {}; only f16, f32, f64, i64 and u8 are written", path, key,
                   dtype_name(t));
  return r;
}
}  // namespace detail

namespace {

DType read_dtype(DType file_dtype) {
  if (file_dtype == DType::f64) return DType::f64;
  return is_floating(file_dtype) ? DType::f32 : DType::i64;
}

// The source files of a virtual dataset in `path` that exist, resolved as HDF5 first tries them: relative to
// the folder of `path` (a missing one reads as the fill value, and an unresolvable name is HDF5's to refuse).
void probe_virtual_sources(const std::string& path, const std::vector<std::string>& sources) {
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  for (const std::string& source : sources) {
    const std::filesystem::path p =
        std::filesystem::path(source).is_absolute() ? std::filesystem::path(source) : folder / source;
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) probe_file(p.string(), p.string());
  }
}

}  // namespace

File::File(std::string path, std::string temp_path, int64_t id)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), id_(id) {}

File::File(File&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      id_(other.id_),
      abandoned_(other.abandoned_),
      status_(std::move(other.status_)) {
  other.id_ = -1;
  other.temp_path_.clear();
}

File::~File() {
  close();
}

void File::abandon() noexcept {
  abandoned_ = true;
  if (status_) status_->drop = true;
}

void File::check_writable(const char* what) const {
  CZ_ASSERT(!temp_path_.empty() && id_ >= 0, "h5::File::{} on a file not opened with create()", what);
  CZ_CHECK_IO(!abandoned_, "{}: an earlier write to it failed; it cannot be written or committed", path_);
}

void File::fail_write(const std::string& what) {
  std::string message = fmt::format("{}: {}: {}", path_, what, hdf5_reason());
  abandon();
  throw IoError(std::move(message));
}

void File::write_ok(int64_t status, const std::string& what) {
  if (status < 0) fail_write(what);
}

int64_t File::write_id(int64_t id, const std::string& what) {
  if (id < 0) fail_write(what);
  return id;
}

void File::close() noexcept {
  if (id_ >= 0 && !temp_path_.empty()) abandon();  // its contents are thrown away: nothing more is written
  if (id_ >= 0) H5Fclose(hid_t(id_));
  id_ = -1;
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  temp_path_.clear();
}

File File::open(const std::string& path, const OpenOptions& options) {
  silence_hdf5();
  struct stat st {};
  CZ_CHECK_IO(::stat(path.c_str(), &st) == 0, "{}: cannot open: {}", path, std::strerror(errno));
  CZ_CHECK_IO(S_ISREG(st.st_mode), "{}: not a regular file", path);
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 < 0) fail(path, "cannot read the file");
  CZ_CHECK_IO(is_hdf5 > 0, "{}: not an HDF5 file (no HDF5 signature)", path);
  if (options.probe) {
    const ProbeReport report = probe_file(path, path);
    if (options.probe_virtual_sources) probe_virtual_sources(path, report.virtual_sources);
  }
  // Strong close: closing the file closes every object still open in it, so nothing outlives a failed read.
  Id fapl(check_id(H5Pcreate(H5P_FILE_ACCESS), path, "creating a property list"));
  check_ok(H5Pset_fclose_degree(fapl.get(), options.vds_source ? H5F_CLOSE_WEAK : H5F_CLOSE_STRONG), path,
           "setting the close degree");
  const hid_t id = check_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), path, "cannot open as HDF5");
  return File(path, "", id);
}

File File::create(const std::string& path, const CreateOptions& options) {
  silence_hdf5();
  std::string temp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temp.data());
  CZ_CHECK_IO(fd >= 0, "{}: cannot create a temporary file beside it ({}): {}", path, temp,
              std::strerror(errno));
  // mkstemp makes the file private (0600); give it the permissions a plain create would have. Reading the
  // umask means setting it briefly, which is harmless here: export runs on one thread.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  ::close(fd);
  File file(path, temp, -1);  // from here on, the destructor removes the temporary file
  Id fapl(check_id(H5Pcreate(H5P_FILE_ACCESS), path, "creating a property list"));
  file.status_ = std::make_unique<detail::WriteStatus>();
  check_ok(detail::use_writer_driver(fapl.get(), file.status_.get()), path, "setting the file driver");
  if (options.modern_format)
    check_ok(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), path,
             "setting the format version");
  file.id_ = check_id(H5Fcreate(temp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), path,
                      fmt::format("cannot create HDF5 file {}", temp));
  return file;
}

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

void File::commit() {
  check_writable("commit");
  // Flushed first, so that most of what closing writes fails here, reported by HDF5; a write that failed
  // earlier inside a call nobody checks (a destructor) is in status_. The close itself only records a
  // failure (Note [Abandoning a failed file]).
  const std::string finishing = fmt::format("cannot finish writing {}", temp_path_);
  write_ok(H5Fflush(hid_t(id_), H5F_SCOPE_LOCAL), finishing);
  if (!status_->error.empty()) fail_write(fmt::format("{}: {}", finishing, status_->error));
  status_->quiet = true;
  const herr_t closed = H5Fclose(hid_t(id_));
  id_ = -1;
  check_ok(closed, path_, finishing);
  CZ_CHECK_IO(status_->error.empty(), "{}: {}: {}", path_, finishing, status_->error);
  // The data must be on disk before the rename makes it visible under the real name.
  const int fd = ::open(temp_path_.c_str(), O_RDONLY);
  const int sync_error = fd < 0 || ::fsync(fd) != 0 ? errno : 0;
  if (fd >= 0) ::close(fd);
  CZ_CHECK_IO(sync_error == 0, "{}: cannot sync {}: {}", path_, temp_path_, std::strerror(sync_error));
  CZ_CHECK_IO(::rename(temp_path_.c_str(), path_.c_str()) == 0, "{}: cannot rename {} to it: {}", path_,
              temp_path_, std::strerror(errno));
  temp_path_.clear();
  // Sync the directory so the rename itself survives a crash; failing that is not worth failing the export.
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace cz::h5
