// Decoding a JPEG's crop only: jpeg_region.h, Note [Decoding the crop].
#include "io/decode/jpeg_region.h"

#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "io/decode/image_codec.h"
#include "tensor/check.h"

namespace cz {
namespace {

// libjpeg reports errors by calling error_exit, which must not return: it jumps back to the decode's
// setjmp, which destroys the decompressor and throws. Warnings (a truncated or corrupt stream) stop the
// decode too, as TJFLAG_STOPONWARNING does for decode_image. No C++ object with a destructor is created
// between setjmp and the last libjpeg call.
struct ErrorJump {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr c) {
  auto* e = reinterpret_cast<ErrorJump*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

void on_message(j_common_ptr c, int level) {
  if (level < 0) on_error(c);  // a warning: corrupt data
}

bool is_jpeg(const uint8_t* d, size_t n) {
  return n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF;
}

struct Decoder {
  jpeg_decompress_struct cinfo{};
  ErrorJump err{};
  Decoder(const uint8_t* data, size_t size) {
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = on_error;
    err.mgr.emit_message = on_message;
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  }
  ~Decoder() { jpeg_destroy_decompress(&cinfo); }
};

}  // namespace

std::optional<JpegInfo> jpeg_region_info(const uint8_t* data, size_t size, const std::string& name) {
  if (!is_jpeg(data, size)) return std::nullopt;
  Decoder d(data, size);
  if (setjmp(d.err.jump)) throw IoError(fmt::format("{}: not a readable JPEG: {}", name, d.err.message));
  jpeg_read_header(&d.cinfo, TRUE);
  const J_COLOR_SPACE cs = d.cinfo.jpeg_color_space;
  if (cs == JCS_CMYK || cs == JCS_YCCK) return std::nullopt;
  return JpegInfo{int64_t(d.cinfo.image_height), int64_t(d.cinfo.image_width)};
}

int jpeg_scale_for(int64_t crop_h, int64_t crop_w, int64_t out_size) {
  const int64_t side = std::min(crop_h, crop_w);
  for (int denom : {8, 4, 2})
    if (side / denom >= out_size) return denom;
  return 1;
}

JpegRegion decode_jpeg_region(const uint8_t* data, size_t size, const std::string& name, int64_t y, int64_t x,
                              int64_t h, int64_t w, int denom) {
  JpegRegion r;
  decode_jpeg_region(data, size, name, y, x, h, w, denom, r);
  return r;
}

void decode_jpeg_region(const uint8_t* data, size_t size, const std::string& name, int64_t y, int64_t x,
                        int64_t h, int64_t w, int denom, JpegRegion& r) {
  CZ_CHECK(denom == 1 || denom == 2 || denom == 4 || denom == 8, "decode_jpeg_region: scale 1/{}", denom);
  CZ_CHECK(is_jpeg(data, size), "{}: not a JPEG", name);
  r.denom = denom;
  std::vector<uint8_t> row_;  // one decoded row (before setjmp: see ErrorJump)
  Decoder d(data, size);
  jpeg_decompress_struct& c = d.cinfo;
  if (setjmp(d.err.jump)) throw IoError(fmt::format("{}: corrupt JPEG: {}", name, d.err.message));
  jpeg_read_header(&c, TRUE);
  CZ_CHECK_IO(int64_t(c.image_width) * c.image_height <= kMaxImagePixels && c.image_width > 0,
              "{}: JPEG of {}x{} pixels is over the limit", name, c.image_width, c.image_height);
  CZ_CHECK(y >= 0 && x >= 0 && h > 0 && w > 0 && y + h <= int64_t(c.image_height) &&
               x + w <= int64_t(c.image_width),
           "{}: crop ({}, {}) {}x{} outside the {}x{} image", name, y, x, h, w, c.image_height,
           c.image_width);
  c.out_color_space = JCS_RGB;  // grey replicated, as decode_image's TJPF_RGB
  c.scale_num = 1;
  c.scale_denom = unsigned(denom);
  jpeg_start_decompress(&c);
  r.scaled_height = c.output_height;
  r.scaled_width = c.output_width;
  const int64_t top = y / denom, bottom = std::min<int64_t>((y + h + denom - 1) / denom, c.output_height);
  const int64_t left = x / denom, right = std::min<int64_t>((x + w + denom - 1) / denom, c.output_width);
  // One column more on each side than asked: the upsampling of subsampled chroma treats the decoded columns'
  // first and last as the image's edge (Note [Decoding the crop]); those columns are then dropped.
  JDIMENSION xoff = JDIMENSION(std::max<int64_t>(left - 1, 0));
  JDIMENSION width = JDIMENSION(std::min<int64_t>(right + 1, c.output_width) - xoff);
  jpeg_crop_scanline(&c, &xoff, &width);  // widened to whole iMCUs on the left
  if (top > 0) jpeg_skip_scanlines(&c, JDIMENSION(top));
  r.top = top;
  r.left = left;
  r.image.height = bottom - top;
  r.image.width = right - left;
  r.image.pixels.resize(size_t(r.image.height * r.image.width * 3));
  row_.resize(size_t(c.output_width) * 3);
  JSAMPROW row = row_.data();
  const size_t skip = size_t(left - int64_t(xoff)) * 3, bytes = size_t(r.image.width) * 3;
  for (int64_t i = 0; i < r.image.height; ++i) {
    jpeg_read_scanlines(&c, &row, 1);
    std::memcpy(r.image.pixels.data() + size_t(i) * bytes, row + skip, bytes);
  }
  jpeg_abort_decompress(&c);  // the rows below the crop are never decoded
}

}  // namespace cz
