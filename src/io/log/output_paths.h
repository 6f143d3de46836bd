// Start-up checks of the paths a run will write, so that a typo or a read-only mount fails the run before it
// trains instead of after (the flag and the path are named, as for any bad flag).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cz {

// Creates `dir` (with its parents) when missing and proves that this process can create files in it by
// creating and removing one. IoError "FLAG DIR: cannot write there: REASON".
void check_writable_dir(const std::string& dir, std::string_view flag);
// The same for the folder `path` will be written in; `path` itself is left alone (an existing file is only
// replaced when the run writes it) but must not be a folder.
void check_writable_file(const std::string& path, std::string_view flag);
// Bytes an unprivileged writer may still use on the file system holding `path` (statvfs); -1 if unknown.
int64_t free_bytes(const std::string& path);

}  // namespace cz
