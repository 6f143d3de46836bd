// The 8-bit image every part of the input pipeline passes along (decoders, data sets, augmentations, the
// loader), the crop window within it, and the ImageNet normalisation the model's input is made with.
#pragma once

#include <cstdint>
#include <vector>

namespace cz {

// An 8-bit RGB image, rows top to bottom, pixels interleaved: pixels[(y * width + x) * 3 + c].
struct Image {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> pixels;
};

// A crop of an image (rows y..y+h, columns x..x+w), mirrored left-right when `flip`.
struct CropBox {
  int64_t y = 0, x = 0, h = 0, w = 0;
  bool flip = false;  // mirror left-right
};

// ImageNet normalisation used by the loader, per RGB channel.
inline constexpr float kImageNetMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kImageNetStd[3] = {0.229f, 0.224f, 0.225f};

}  // namespace cz
