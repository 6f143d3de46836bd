// Decoding only the part of a JPEG that a crop needs, through libjpeg-turbo's libjpeg API:
// the rows above and below the crop are skipped (jpeg_skip_scanlines), only its columns decoded
// (jpeg_crop_scanline), and the IDCT scales by 1/2, 1/4 or 1/8 when the crop is resized down by at least
// that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "io/image/image.h"

namespace cz {

// Note [Decoding the crop]: libjpeg decodes in iMCU blocks (8 or 16 pixels square, times the scale), so
// jpeg_crop_scanline widens the columns to whole blocks on the left. The fancy (triangle) upsampling of
// horizontally subsampled chroma (4:2:2, 4:2:0) treats the first and last decoded columns as the image's
// edge, so the first column of a crop that starts on a block boundary came out different from the whole
// decode's (JpegRegion.WholeThenCropBitExact found it): the decoder asks for one column more on each side
// and drops the extra columns, and the region's pixels are then the whole decode's, bit for bit, for every
// subsampling. jpeg_skip_scanlines keeps the vertical upsampling's context row itself. Scaled, libjpeg's
// reduced IDCT approximates a box filter of the full decode (JpegRegion.ScaledPsnr, 480x640 textured
// images, q75 and q95): 4:4:4 51-53 dB, 4:2:0 35-48 dB, grey 58 dB or more at 1/2, 1/4 and 1/8; 4:2:2 and
// 4:4:0, whose chroma is scaled unevenly, 31-37 dB at 1/2 and 1/4 and 26.6-28.8 dB at 1/8.
struct JpegRegion {
  Image image;                                  // exactly the asked rows and columns at this scale, RGB
  int64_t top = 0, left = 0;                    // where `image` sits in the scaled image, in its pixels
  int64_t scaled_height = 0, scaled_width = 0;  // the whole image at this scale
  int denom = 1;                                // the scale: 1/denom
};

// The image's size from its header; nullopt for a stream this path does not decode (not a JPEG, CMYK or
// YCCK, which decode_image converts as PIL does), which then goes through decode_image. IoError naming
// `name` for a JPEG whose header cannot be read.
struct JpegInfo {
  int64_t height = 0, width = 0;
};
std::optional<JpegInfo> jpeg_region_info(const uint8_t* data, size_t size, const std::string& name);

// The largest of 8, 4, 2, 1 that keeps a crop of crop_h x crop_w at least out_size pixels on its shorter
// side after scaling (so the resize after it still shrinks, or keeps, the image).
int jpeg_scale_for(int64_t crop_h, int64_t crop_w, int64_t out_size);

// Rows [y, y + h) and columns [x, x + w) of the full-size image, decoded at 1/denom (denom 1, 2, 4 or 8): the
// scaled rows floor(y / denom) .. ceil((y + h) / denom) and the scaled columns likewise. IoError
// naming `name` for a corrupt stream (libjpeg's warnings included, as decode_image).
JpegRegion decode_jpeg_region(const uint8_t* data, size_t size, const std::string& name, int64_t y, int64_t x,
                              int64_t h, int64_t w, int denom);
// The same into `r`, whose image's memory is reused (the loader decodes image after image into one: issue
// 40, an allocation and its page faults per image).
void decode_jpeg_region(const uint8_t* data, size_t size, const std::string& name, int64_t y, int64_t x,
                        int64_t h, int64_t w, int denom, JpegRegion& r);

}  // namespace cz
