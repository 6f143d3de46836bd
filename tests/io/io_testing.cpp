// Writers for the io tests' fixtures.
#include "io_testing.h"

#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "tensor/random.h"

namespace cz::testing {

TempDir::TempDir() {
  std::string templ = (std::filesystem::temp_directory_path() / "cz_io_XXXXXX").string();
  if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Image smooth_image(int64_t height, int64_t width, uint32_t seed) {
  const auto r = philox4x32(seed, 0);
  const double a = 1 + r[0] % 5, b = 1 + r[1] % 5, c = r[2] % 64, d = r[3] % 7;
  Image img{height, width, std::vector<uint8_t>(size_t(height * width * 3))};
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) {
      const double u = double(x) / double(width), v = double(y) / double(height);
      const double vals[3] = {40 + 170 * u, 60 + 120 * (0.5 + 0.5 * std::sin(a * u * 3.14 + b * v * 2.1)),
                              c + 150 * v + 20 * std::cos(d * v * 3.14)};
      for (int ch = 0; ch < 3; ++ch)
        img.pixels[size_t((y * width + x) * 3 + ch)] = uint8_t(std::lround(std::clamp(vals[ch], 0.0, 255.0)));
    }
  return img;
}

void write_h5_dataset(hid_t file, const std::string& name, hid_t mem_type, hid_t file_type,
                      const std::vector<hsize_t>& dims, const void* data) {
  const hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  const hid_t dset = H5Dcreate2(file, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (dset < 0 || H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    throw std::runtime_error("writing HDF5 dataset " + name + " failed");
  H5Dclose(dset);
  H5Sclose(space);
}

void write_h5_images(const std::string& path, const std::vector<Image>& images,
                     const std::vector<int64_t>& labels) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) throw std::runtime_error("cannot create " + path);
  std::vector<uint8_t> all;
  for (const Image& img : images) all.insert(all.end(), img.pixels.begin(), img.pixels.end());
  write_h5_dataset(file, "images", H5T_NATIVE_UINT8, H5T_STD_U8LE,
                   {images.size(), hsize_t(images[0].height), hsize_t(images[0].width), 3}, all.data());
  write_h5_dataset(file, "labels", H5T_NATIVE_INT64, H5T_STD_I64LE, {labels.size()}, labels.data());
  H5Fclose(file);
}

std::vector<uint8_t> cifar_records(const std::vector<Image>& images, const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i < images.size(); ++i) {
    out.push_back(labels[i]);
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < 1024; ++p) out.push_back(images[i].pixels[size_t(p * 3 + c)]);
  }
  return out;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
    throw std::runtime_error("write " + path);
  std::fclose(f);
}

std::vector<uint8_t> encode_jpeg(const Image& img, int quality, bool grey) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj, img.pixels.data(), int(img.width), 0, int(img.height), TJPF_RGB, &buf, &size,
                  grey ? TJSAMP_GRAY : TJSAMP_444, quality, 0) != 0)
    throw std::runtime_error(std::string("tjCompress2: ") + tjGetErrorStr2(tj));
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

std::vector<uint8_t> encode_png(const Image& img) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = png_uint_32(img.width);
  image.height = png_uint_32(img.height);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, img.pixels.data(), 0, nullptr))
    throw std::runtime_error(std::string("png size: ") + image.message);
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, img.pixels.data(), 0, nullptr))
    throw std::runtime_error(std::string("png write: ") + image.message);
  out.resize(size);
  return out;
}

PixelDiff pixel_diff(const Image& a, const Image& b) {
  PixelDiff d;
  if (a.pixels.size() != b.pixels.size()) throw std::runtime_error("pixel_diff: sizes differ");
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    const int e = std::abs(int(a.pixels[i]) - int(b.pixels[i]));
    sum += e;
    d.max = std::max(d.max, e);
  }
  d.mean = sum / double(a.pixels.size());
  return d;
}

}  // namespace cz::testing
