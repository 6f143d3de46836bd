// HDF5 file access for weights, checkpoints and fixtures: opening, creating and committing files, and the
// layer's shared pieces (h5_detail.h); reading is h5_read.cpp, writing h5_write.cpp, appending h5_append.cpp.
// Failures are IoErrors built here rather than through CZ_CHECK_STATUS: an HDF5 status alone cannot say which
// file and key went wrong, and that is what users need.
#include "io/h5/h5_file.h"

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

#include "io/h5/fletcher32.h"
#include "io/h5/h5_detail.h"
#include "io/h5/h5_probe.h"
#include "io/h5/h5_writer_driver.h"

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