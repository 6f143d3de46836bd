// Note [Abandoning a failed file]: once a write has failed (a full disk, a file-size limit), HDF5 1.10 can no
// longer close the file: closing flushes and truncates again, fails, and leaves a half-closed file behind
// that crashes HDF5's exit handler (H5F__close_cb on freed memory) — a failed checkpoint must not turn into
// a segfault at exit. Files we write therefore go through this driver: POSIX I/O like HDF5's sec2 driver,
// except that after the first failure (reported to HDF5 once, so the call that hit it fails with errno's
// reason) every further write and truncate is dropped, so the file always closes cleanly. The failure is
// also kept in a WriteStatus that h5::File checks before it commits, so a file whose write failed inside a
// call nobody checked (a dataset closed by a destructor) is never renamed into place.
#include "io/h5/h5_writer_driver.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>

#include <fmt/format.h>

namespace cz::h5::detail {
namespace {

struct DriverInfo {
  WriteStatus* status;
};

// Note [Write-behind]: the driver asks the kernel to start writing each 32 MiB it has been given
// (sync_file_range, which does not wait), so the disk works while we checksum and copy the next chunks and
// the final fsync has little left to do; without it the whole file sat in the page cache until the fsync, and
// a save took the CPU time plus the disk time instead of about the larger of the two.
constexpr size_t kWriteBehindBytes = size_t{32} << 20;

struct WriterFile {
  H5FD_t pub;  // must come first: HDF5 hands the driver an H5FD_t*
  int fd = -1;
  haddr_t eoa = 0, eof = 0;
  size_t unflushed = 0;  // bytes written since the last write-behind request
  dev_t device = 0;
  ino_t inode = 0;
  WriteStatus* status = nullptr;
};

WriterFile* cast(H5FD_t* f) {
  return reinterpret_cast<WriterFile*>(f);
}
const WriterFile* cast(const H5FD_t* f) {
  return reinterpret_cast<const WriterFile*>(f);
}

// Records a failure; returns what the driver callback returns (-1 reports it to HDF5, with a message on its
// error stack; quietly, 0).
herr_t failed(WriterFile* f, const char* what, haddr_t addr, size_t size) {
  const int err = errno;
  const std::string message =
      fmt::format("{} of {} bytes at offset {} failed: {}", what, size, addr, std::strerror(err));
  if (f->status->error.empty()) f->status->error = message;
  f->status->drop = true;
  if (f->status->quiet) return 0;
  H5Epush2(H5E_DEFAULT, __FILE__, "cz_writer_driver", __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_WRITEERROR, "%s",
           message.c_str());
  return -1;
}

void* info_copy(const void* info) {
  return new DriverInfo(*static_cast<const DriverInfo*>(info));
}
herr_t info_free(void* info) {
  delete static_cast<DriverInfo*>(info);
  return 0;
}

H5FD_t* open_file(const char* name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  if (info == nullptr || info->status == nullptr) return nullptr;
  int oflags = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) oflags |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) oflags |= O_CREAT;
  if (flags & H5F_ACC_EXCL) oflags |= O_EXCL;
  const int fd = ::open(name, oflags | O_CLOEXEC, 0666);
  if (fd < 0) {
    H5Epush2(H5E_DEFAULT, __FILE__, "cz_writer_driver", __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_CANTOPENFILE,
             "cannot open %s: %s", name, std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  ::fstat(fd, &st);
  auto* f = new WriterFile();
  f->fd = fd;
  f->eof = haddr_t(st.st_size);
  f->device = st.st_dev;
  f->inode = st.st_ino;
  f->status = info->status;
  return &f->pub;
}

herr_t close_file(H5FD_t* file) {
  WriterFile* f = cast(file);
  ::close(f->fd);
  delete f;
  return 0;
}

int compare(const H5FD_t* a, const H5FD_t* b) {
  const WriterFile *x = cast(a), *y = cast(b);
  if (x->device != y->device) return x->device < y->device ? -1 : 1;
  if (x->inode != y->inode) return x->inode < y->inode ? -1 : 1;
  return 0;
}

herr_t query(const H5FD_t*, unsigned long* flags) {
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
           H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t get_eoa(const H5FD_t* file, H5FD_mem_t) {
  return cast(file)->eoa;
}
herr_t set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  cast(file)->eoa = addr;
  return 0;
}
haddr_t get_eof(const H5FD_t* file, H5FD_mem_t) {
  return cast(file)->eof;
}
herr_t get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = &cast(file)->fd;
  return 0;
}

herr_t read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buffer) {
  WriterFile* f = cast(file);
  auto* out = static_cast<uint8_t*>(buffer);
  while (size > 0) {
    const ssize_t n = ::pread(f->fd, out, size, off_t(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      H5Epush2(H5E_DEFAULT, __FILE__, "cz_writer_driver", __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_READERROR,
               "read of %zu bytes at %llu failed: %s", size, static_cast<unsigned long long>(addr),
               std::strerror(errno));
      return -1;
    }
    if (n == 0) {  // past the end of the file (or of what was dropped): zeros, as sec2 gives
      std::memset(out, 0, size);
      break;
    }
    out += n;
    addr += haddr_t(n);
    size -= size_t(n);
  }
  return 0;
}

herr_t write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buffer) {
  WriterFile* f = cast(file);
  if (!f->status->drop) {
    const auto* in = static_cast<const uint8_t*>(buffer);
    haddr_t at = addr;
    size_t left = size;
    while (left > 0) {
      const ssize_t n = ::pwrite(f->fd, in, left, off_t(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) errno = EIO;
        return failed(f, "write", addr, size);
      }
      in += n;
      at += haddr_t(n);
      left -= size_t(n);
    }
  }
  if (addr + size > f->eof) f->eof = addr + size;
  f->unflushed += size;
  if (f->unflushed >= kWriteBehindBytes) {
    ::sync_file_range(f->fd, 0, 0, SYNC_FILE_RANGE_WRITE);  // only a hint: errors surface at the fsync
    f->unflushed = 0;
  }
  return 0;
}

herr_t truncate(H5FD_t* file, hid_t, hbool_t) {
  WriterFile* f = cast(file);
  if (f->eoa == f->eof) return 0;
  if (!f->status->drop && ::ftruncate(f->fd, off_t(f->eoa)) != 0) return failed(f, "truncate", f->eoa, 0);
  f->eof = f->eoa;
  return 0;
}

herr_t lock(H5FD_t*, hbool_t) {
  return 0;
}
herr_t unlock(H5FD_t*) {
  return 0;
}

hid_t driver_id() {
  static const hid_t id = [] {
    static H5FD_class_t cls{};
    cls.name = "cz_writer";
    cls.maxaddr = haddr_t(std::numeric_limits<off_t>::max());
    cls.fc_degree = H5F_CLOSE_WEAK;
    cls.fapl_size = sizeof(DriverInfo);
    cls.fapl_copy = info_copy;
    cls.fapl_free = info_free;
    cls.open = open_file;
    cls.close = close_file;
    cls.cmp = compare;
    cls.query = query;
    cls.get_eoa = get_eoa;
    cls.set_eoa = set_eoa;
    cls.get_eof = get_eof;
    cls.get_handle = get_handle;
    cls.read = read;
    cls.write = write;
    cls.truncate = truncate;
    cls.lock = lock;
    cls.unlock = unlock;
    const H5FD_mem_t map[] = H5FD_FLMAP_DICHOTOMY;
    std::copy(std::begin(map), std::end(map), cls.fl_map);
    return H5FDregister(&cls);
  }();
  return id;
}

}  // namespace

herr_t use_writer_driver(hid_t fapl, WriteStatus* status) {
  const DriverInfo info{status};
  const hid_t id = driver_id();
  return id < 0 ? -1 : H5Pset_driver(fapl, id, &info);
}

}  // namespace cz::h5::detail
