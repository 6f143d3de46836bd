// Decoding of stored images (JPEG through libjpeg-turbo, PNG through libpng's simplified API) into 8-bit RGB,
// and reading whole files; used by the folder source and its fuzzer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/image/image.h"

namespace cz {

// Larger images are refused before any pixel buffer is allocated: a corrupt header must not cost gigabytes.
inline constexpr int64_t kMaxImagePixels = int64_t(1) << 26;

// Decodes JPEG or PNG bytes (told apart by their signature, not by the file name) into `out`. Grey, palette
// and 16-bit images become 8-bit RGB; alpha is dropped. IoError naming `name` for anything else, a corrupt or
// truncated stream (libjpeg's recoverable warnings included), or an image over kMaxImagePixels.
void decode_image(const uint8_t* data, size_t size, const std::string& name, Image& out);

// The whole file; IoError naming `path` when it cannot be opened or read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

}  // namespace cz
