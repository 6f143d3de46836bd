// HDF5's Fletcher-32 checksum (the H5Z_FILTER_FLETCHER32 filter), bit-identical to the library's, computed a
// block at a time so that the compiler vectorises it. Checkpoints write their checksummed chunks directly
// (H5Dwrite_chunk) with this sum appended, which costs a fraction of the filter pipeline's copy-and-sum.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cz::h5 {

// The checksum HDF5 appends (little-endian) to a chunk of `bytes` bytes at `data`.
uint32_t fletcher32(const void* data, size_t bytes);

}  // namespace cz::h5
