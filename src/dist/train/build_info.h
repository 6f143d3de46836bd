// What this build is, for the log's start record: the project's version and, when built from a git checkout,
// its commit ("0.1.0 (commit 36ec8b7a1c2d, modified)"). Generated at build time (cmake/BuildInfo.cmake).
#pragma once

namespace cz::train {

const char* build_version();

}  // namespace cz::train
