// For readers that take paths: the fuzzer's bytes written to a file in a per-process scratch directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cz::fuzz {

// Writes `size` bytes to `name` inside the scratch directory (created on first use) and returns the
// directory.
std::string write_scratch(const std::string& name, const uint8_t* data, size_t size);

}  // namespace cz::fuzz
