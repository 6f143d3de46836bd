// bench_decode_phases: where a JPEG's decode time goes (entropy decoding, IDCT and upsampling, colour
// conversion, resize), for the whole-image decode the loader used to do (tjDecompress2) and for the
// crop-only, DCT-scaled decode of io/decode/jpeg_region.{h,cpp}; and, with --decode-only, whole decodes alone
// on T threads in img/s (the "decode only" row of bench/loader_vs_torchvision.py, issue 32 item 5).
//
//   bench_decode_phases DIR [--images 300] [--size 224] [--reps 3]
//   bench_decode_phases DIR --decode-only [--threads 1] [--images 1000]
//
// DIR: a `folder:` data set (tools/make_imagenet_like.py writes one). Phases, per image and on the calling
// thread, each the median of --reps runs (the machine is shared: a median resists a neighbour's build):
//   entropy   jpeg_read_coefficients: Huffman decoding of every block, no IDCT
//   ycc       a decode to YCbCr (out_color_space JCS_YCbCr): entropy + IDCT + chroma upsampling
//   rgb       a decode to RGB: ycc + the colour conversion
//   resize    resample_u8 of the crop to --size x --size (the loader's resize, bilinear)
// The split is entropy, ycc - entropy (IDCT + upsampling), rgb - ycc (colour), resize. "Whole" decodes the
// whole image and resizes a crop of it; "crop" decodes only the crop's rows and columns at the scale
// jpeg_scale_for picks (libjpeg's jpeg_skip_scanlines / jpeg_crop_scanline / scale_denom, as
// jpeg_region.cpp); its entropy decoding cannot be timed apart (jpeg_skip_scanlines still Huffman-decodes the
// rows above the crop, the IDCT only the crop's), so its first column is entropy + IDCT. The crop is the one
// RandomResizedCrop(scale=(0.08, 1)) gives on average: a centred square of 54% of the image's area (the
// mean of U(0.08, 1)), clipped to the image.
#include <stdio.h>  // before jpeglib.h, which needs FILE
#include <time.h>

#include <jpeglib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "host_time.h"
#include "io/augment/image_transform.h"
#include "io/decode/image_codec.h"
#include "io/decode/jpeg_region.h"

namespace {

using namespace cz;
namespace fs = std::filesystem;
using bench::median;
using bench::thread_cpu_seconds;

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Every .jpeg/.jpg under DIR's class folders, sorted.
std::vector<fs::path> jpegs(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::string ext = e.path().extension().string();
    for (char& c : ext) c = char(std::tolower(c));
    if (e.is_regular_file() && (ext == ".jpeg" || ext == ".jpg")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct ErrorMgr {
  jpeg_error_mgr pub;
  jmp_buf jump;
};
void on_error(j_common_ptr cinfo) {
  longjmp(reinterpret_cast<ErrorMgr*>(cinfo->err)->jump, 1);
}

enum class Phase { entropy, ycc, rgb };

// Decodes rows [y, y+h) and columns [x, x+w) of the image at 1/denom in `phase`'s way (as jpeg_region.cpp
// does for rgb); h == 0 decodes no rows at all (the crop's "entropy" run: header and start only). Returns a
// checksum so the work cannot be optimised away; exits on a corrupt file (the inputs are generated).
uint64_t decode(const std::vector<uint8_t>& data, Phase phase, int denom, int64_t y, int64_t x, int64_t h,
                int64_t w, const std::string& name) {
  jpeg_decompress_struct cinfo;
  ErrorMgr err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    std::fprintf(stderr, "bench_decode_phases: %s: corrupt JPEG\n", name.c_str());
    std::exit(1);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data.data(), static_cast<unsigned long>(data.size()));
  jpeg_read_header(&cinfo, TRUE);
  uint64_t sum = 0;
  if (phase == Phase::entropy) {
    jvirt_barray_ptr* coefs = jpeg_read_coefficients(&cinfo);
    sum = reinterpret_cast<uintptr_t>(coefs) & 1;
    jpeg_destroy_decompress(&cinfo);
    return sum;
  }
  const bool grey = cinfo.num_components == 1;
  cinfo.out_color_space = grey ? JCS_GRAYSCALE : (phase == Phase::ycc ? JCS_YCbCr : JCS_RGB);
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(denom);
  jpeg_start_decompress(&cinfo);
  const int64_t sh = cinfo.output_height, sw = cinfo.output_width;
  const int64_t y0 = std::min<int64_t>(y / denom, sh),
                y1 = std::min<int64_t>((y + h + denom - 1) / denom, sh);
  JDIMENSION cx = static_cast<JDIMENSION>(std::min<int64_t>(x / denom, sw - 1));
  JDIMENSION cw = static_cast<JDIMENSION>(
      std::max<int64_t>(1, std::min<int64_t>((x + w + denom - 1) / denom, sw) - int64_t(cx)));
  if (cx != 0 || cw != JDIMENSION(sw)) jpeg_crop_scanline(&cinfo, &cx, &cw);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  std::vector<uint8_t> row(size_t(cinfo.output_width) * size_t(cinfo.output_components));
  for (int64_t r = y0; r < y1; ++r) {
    JSAMPROW p = row.data();
    jpeg_read_scanlines(&cinfo, &p, 1);
    sum += row[size_t(r) % row.size()];
  }
  jpeg_abort_decompress(&cinfo);  // the rows below the crop are never decoded
  jpeg_destroy_decompress(&cinfo);
  return sum;
}

CropBox mean_rrc_crop(int64_t h, int64_t w) {  // centred square of 54% of the area, clipped
  const int64_t side = std::min({h, w, int64_t(std::sqrt(0.54 * double(h) * double(w)))});
  return CropBox{(h - side) / 2, (w - side) / 2, side, side, false};
}

int decode_only(const std::vector<fs::path>& files, int threads, int64_t images) {
  std::atomic<int64_t> next{0};
  std::atomic<uint64_t> sink{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      Image img;
      for (int64_t i; (i = next++) < images;) {
        const fs::path& p = files[size_t(i) % files.size()];
        std::vector<uint8_t> data = read_file(p);  // read each time, as a loader does
        decode_image(data.data(), data.size(), p.string(), img);
        sink += img.pixels[0];
      }
    });
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("decode only: {} images in {:.3f} s: {:.1f} img/s, {:.1f} img/s per thread ({} thread(s))\n",
             images, s, double(images) / s, double(images) / s / threads, threads);
  return sink == 0xFFFFFFFFFFFFFFFFull;  // never: keeps the decodes
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_decode_phases: JPEG decode time split, whole vs crop-only; or decode-only img/s"};
  std::string dir;
  int64_t images = 300, size = 224;
  int reps = 3, threads = 1;
  bool only = false;
  app.add_option("dir", dir, "folder: data set of JPEGs")->required();
  app.add_option("--images", images, "images to time (phases: the first N files)")
      ->check(CLI::PositiveNumber);
  app.add_option("--size", size, "output side of the resize")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "repetitions per phase (median taken)")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "--decode-only: decoding threads")->check(CLI::PositiveNumber);
  app.add_flag("--decode-only", only,
               "whole decodes to RGB alone, on --threads threads, for --images images");
  CLI11_PARSE(app, argc, argv);
  if (!fs::is_directory(dir)) {
    std::fprintf(stderr, "bench_decode_phases: %s: not a directory\n", dir.c_str());
    return 2;
  }
  const std::vector<fs::path> files = jpegs(dir);
  if (files.empty()) {
    std::fprintf(stderr, "bench_decode_phases: %s: no .jpeg/.jpg files\n", dir.c_str());
    return 2;
  }
  if (only) return decode_only(files, threads, images);

  const size_t n = std::min<size_t>(size_t(images), files.size());
  // [path][phase]: seconds summed over the images, per repetition.
  enum { kEntropy, kYcc, kRgb, kResize, kPhases };
  std::vector<double> sums[2][kPhases];
  uint64_t sink = 0;
  std::vector<int> denoms(9, 0);
  for (int rep = 0; rep < reps; ++rep) {
    double acc[2][kPhases] = {};
    for (size_t i = 0; i < n; ++i) {
      const std::vector<uint8_t> data = read_file(files[i]);
      const std::string name = files[i].string();
      auto info = jpeg_region_info(data.data(), data.size(), name);
      if (!info) continue;
      const CropBox box = mean_rrc_crop(info->height, info->width);
      const int denom = jpeg_scale_for(box.h, box.w, size);
      if (rep == 0) ++denoms[size_t(denom)];
      auto time = [&](double& slot, auto&& f) {
        const double t0 = thread_cpu_seconds();
        f();
        slot += thread_cpu_seconds() - t0;
      };
      // Whole: every row and column at full size, then the crop resized.
      time(acc[0][kEntropy], [&] { sink += decode(data, Phase::entropy, 1, 0, 0, 0, 0, name); });
      time(acc[0][kYcc], [&] { sink += decode(data, Phase::ycc, 1, 0, 0, info->height, info->width, name); });
      time(acc[0][kRgb], [&] { sink += decode(data, Phase::rgb, 1, 0, 0, info->height, info->width, name); });
      Image whole, out;
      decode_image(data.data(), data.size(), name, whole);
      time(acc[0][kResize], [&] { resample_u8(whole, box, size, Interpolation::bilinear, out); });
      // Crop: the loader's path (jpeg_region.cpp), its phases through the same libjpeg calls.
      time(acc[1][kYcc], [&] { sink += decode(data, Phase::ycc, denom, box.y, box.x, box.h, box.w, name); });
      JpegRegion region;
      time(acc[1][kRgb], [&] {
        region = decode_jpeg_region(data.data(), data.size(), name, box.y, box.x, box.h, box.w, denom);
      });
      const CropBox in_region{box.y / denom - region.top, box.x / denom - region.left,
                              std::min(region.image.height, box.h / denom),
                              std::min(region.image.width, box.w / denom), false};
      time(acc[1][kResize],
           [&] { resample_u8(region.image, in_region, size, Interpolation::bilinear, out); });
      sink += out.pixels[0];
    }
    for (int p = 0; p < 2; ++p)
      for (int k = 0; k < kPhases; ++k) sums[p][k].push_back(acc[p][k] / double(n) * 1e3);
  }
  fmt::print("{} images of {}, crop = centred square of 54% of the area, resized to {}; DCT scale used:", n,
             dir, size);
  for (int d : {1, 2, 4, 8}) fmt::print(" 1/{} x{}", d, denoms[size_t(d)]);
  fmt::print("\nms per image (thread CPU time, median of {} reps)\n", reps);
  fmt::print(
      "| path | entropy | IDCT + upsampling | colour | resize | total |\n| --- | --- | --- | --- | --- | --- "
      "|\n");
  const char* names[2] = {"whole decode + crop (before)", "crop-only, DCT-scaled (after)"};
  for (int p = 0; p < 2; ++p) {
    const double e = median(sums[p][kEntropy]), y = median(sums[p][kYcc]), r = median(sums[p][kRgb]),
                 z = median(sums[p][kResize]);
    if (p == 0)
      fmt::print("| {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} |\n", names[p], e, y - e, r - y, z,
                 r + z);
    else  // entropy decoding is not separable here: skipping rows still Huffman-decodes them
      fmt::print("| {} | {:.3f} (with IDCT) | | {:.3f} | {:.3f} | {:.3f} |\n", names[p], y, r - y, z, r + z);
  }
  return sink == 1 ? 0 : 0;
}
