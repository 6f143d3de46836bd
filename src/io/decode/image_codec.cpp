// JPEG and PNG decoding into Image, plus whole-file reads.
#include "io/decode/image_codec.h"

#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "tensor/check.h"

namespace cz {
namespace {

bool is_jpeg(const uint8_t* d, size_t n) {
  return n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF;
}
bool is_png(const uint8_t* d, size_t n) {
  return n >= 8 && png_sig_cmp(d, 0, 8) == 0;
}

void check_dims(int64_t w, int64_t h, const std::string& name, const char* format) {
  CZ_CHECK_IO(w > 0 && h > 0 && w * h <= kMaxImagePixels,
              "{}: {} image of {}x{} pixels is empty or larger than the {}-pixel limit", name, format, w, h,
              kMaxImagePixels);
}

// Note [CMYK JPEGs]: Photoshop and other Adobe software write CMYK JPEGs (an Adobe APP14 marker, transform 0
// for CMYK, 2 for YCCK, which libjpeg turns back into CMYK) with every channel inverted: a stored 255 means
// no ink. PIL assumes that polarity for every CMYK JPEG, marker or not (raw mode "CMYK;I": "always use Adobe
// polarity" in its JPEG plugin since 2009; it writes its own CMYK JPEGs that way too), and so do we, so that
// a file decodes to what torchvision and timm, which read through PIL, see. PIL then converts to RGB without
// a colour profile: with ink c and black k, R = (255 - k) - round(c (255 - k) / 255). On the stored values (s
// = 255 - ink) that is R = s_k - round((255 - s_c) s_k / 255), with PIL's integer rounding of a * b / 255
// (mul_div_255), so the RGB bytes equal PIL's `Image.open(f).convert("RGB")` for the same decoded samples
// (tests/io/test_cmyk.cpp; the samples themselves may differ by libjpeg's IDCT between builds).
inline uint8_t mul_div_255(int a, int b) {
  const int t = a * b + 128;
  return uint8_t(((t >> 8) + t) >> 8);
}

void adobe_cmyk_to_rgb(const uint8_t* stored, uint8_t* rgb, int64_t pixels) {
  for (int64_t p = 0; p < pixels; ++p, stored += 4, rgb += 3) {
    const int not_black = stored[3];  // 255 - k
    for (int c = 0; c < 3; ++c) rgb[c] = uint8_t(not_black - mul_div_255(255 - stored[c], not_black));
  }
}

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};

void decode_jpeg(const uint8_t* data, size_t size, const std::string& name, Image& out) {
  std::unique_ptr<void, TjDeleter> tj(tjInitDecompress());
  CZ_CHECK_IO(tj != nullptr, "{}: cannot create a JPEG decoder: {}", name, tjGetErrorStr2(nullptr));
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  // libjpeg-turbo's API takes a non-const buffer but does not write to it.
  auto* buf = const_cast<unsigned char*>(data);
  CZ_CHECK_IO(tjDecompressHeader3(tj.get(), buf, static_cast<unsigned long>(size), &w, &h, &subsamp,
                                  &colorspace) == 0,
              "{}: not a readable JPEG: {}", name, tjGetErrorStr2(tj.get()));
  check_dims(w, h, name, "JPEG");
  out.height = h;
  out.width = w;
  // libjpeg converts CMYK and YCCK JPEGs to CMYK only ("Unsupported color conversion request" for RGB):
  // those are decoded as CMYK and converted here (Note [CMYK JPEGs]).
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  std::vector<uint8_t> ink;
  if (cmyk) ink.resize(size_t(w) * size_t(h) * 4);
  out.pixels.resize(size_t(w) * size_t(h) * 3);
  // Stop at the first warning: a truncated or corrupt file would otherwise decode into grey filler that
  // silently trains the model on garbage.
  const int rc =
      tjDecompress2(tj.get(), buf, static_cast<unsigned long>(size), cmyk ? ink.data() : out.pixels.data(), w,
                    0, h, cmyk ? TJPF_CMYK : TJPF_RGB, TJFLAG_STOPONWARNING);
  CZ_CHECK_IO(rc == 0, "{}: corrupt JPEG ({}x{}{}): {}", name, w, h,
              cmyk ? (colorspace == TJCS_YCCK ? ", YCCK" : ", CMYK") : "", tjGetErrorStr2(tj.get()));
  if (cmyk) adobe_cmyk_to_rgb(ink.data(), out.pixels.data(), int64_t(w) * h);
}

void decode_png(const uint8_t* data, size_t size, const std::string& name, Image& out) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  // The simplified API frees its own state when a call fails; png_image_free covers the paths where we stop.
  struct Guard {
    png_image* p;
    ~Guard() { png_image_free(p); }
  } guard{&image};
  CZ_CHECK_IO(png_image_begin_read_from_memory(&image, data, size) != 0, "{}: not a readable PNG: {}", name,
              image.message);
  check_dims(image.width, image.height, name, "PNG");
  image.format = PNG_FORMAT_RGB;
  out.height = image.height;
  out.width = image.width;
  out.pixels.resize(PNG_IMAGE_SIZE(image));
  CZ_CHECK_IO(png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr) != 0,
              "{}: corrupt PNG ({}x{}): {}", name, out.width, out.height, image.message);
}

}  // namespace

void decode_image(const uint8_t* data, size_t size, const std::string& name, Image& out) {
  if (is_jpeg(data, size)) return decode_jpeg(data, size, name, out);
  if (is_png(data, size)) return decode_png(data, size, name, out);
  throw IoError(fmt::format("{}: neither a JPEG nor a PNG ({} bytes, no JPEG or PNG signature)", name, size));
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  CZ_CHECK_IO(f != nullptr, "{}: cannot open: {}", path, std::strerror(errno));
  // One read into a vector of the file's size (no growth and copy in chunks); a file that grew since is read
  // to its end all the same.
  struct stat st {};
  std::vector<uint8_t> bytes;
  if (fstat(fileno(f.get()), &st) == 0 && st.st_size > 0) bytes.resize(size_t(st.st_size));
  size_t have = std::fread(bytes.data(), 1, bytes.size(), f.get());
  uint8_t chunk[1 << 16];
  size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof(chunk), f.get())) > 0) {
    bytes.resize(have);
    bytes.insert(bytes.end(), chunk, chunk + got);
    have = bytes.size();
  }
  CZ_CHECK_IO(!std::ferror(f.get()), "{}: read failed: {}", path, std::strerror(errno));
  bytes.resize(have);
  return bytes;
}

}  // namespace cz
