// Where a program finds the helper programs it starts (the HDF5 probe): beside itself, then on PATH, as git
// finds its git-* helpers; never at a path compiled in, so that a build or an installation can move.
#pragma once

#include <optional>
#include <string>

namespace cz {

// Note [Helpers beside the program]: a program starts a helper NAME from the folder of its own executable
// (/proc/self/exe), else from the first folder of PATH holding an executable NAME. The build puts the helpers
// beside the programs (apps/; the other folders of executables get a relative link to them), and
// `cmake --install` puts them beside the installed programs (bin/), so a build tree copied or moved
// elsewhere, or an installed prefix, runs without the folder it was built in.

// `name` in `self_dir` when an executable file is there, else in the first folder of `path` (PATH's syntax:
// folders separated by ':', an empty entry meaning the current folder) that has one; nullopt when none does.
std::optional<std::string> find_helper_in(const std::string& name, const std::string& self_dir,
                                          const std::string& path);
// The folder of the running executable; empty when /proc/self/exe cannot be read.
std::string self_dir();
// find_helper_in with self_dir() and $PATH; an IoError "cannot find WHAT (NAME): not beside this program
// (SELF_DIR) nor on PATH" otherwise.
std::string find_helper(const std::string& name, const std::string& what);

}  // namespace cz
