// Cold-read measurements: dropping a file's pages from the page cache.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <string>

namespace cz {

// Syncs the file and drops its pages, so that the next read comes from the disk. Silent when it cannot open
// it.
inline void evict_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace cz
