// bench_loader: the data path alone (decode, crop and resize, flip, RandAugment, normalise, random erasing),
// in images per second per loader thread, on a folder of real JPEG files, with and without the ConvNeXt
// recipe's augmentations; then what each stage costs per image.
//
//   bench_loader DIR [--images 256] [--size 224] [--batch 32] [--threads 0] [--reps 3]
//
// DIR is a `folder:` data set; when it holds no class folders the bench first writes one there: --images
// photo-like JPEGs (smooth colour fields, edges and grain, quality 90) of ImageNet's typical sizes (500x375,
// 375x500, 500x333, 400x400), in two classes. The loader runs with --threads workers (0: on the calling
// thread, so img/s is one thread's); each configuration reads the whole folder --reps times, taking turns
// with the others, and its median pass is reported. The stage table times each function over every image
// once, on the calling thread, and the op table each RandAugment op alone.
#include <time.h>
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "host_time.h"
#include "io/data/loader.h"
#include "io/decode/image_codec.h"
#include "tensor/random.h"

namespace {

using namespace cz;
namespace fs = std::filesystem;
using bench::median;
using bench::thread_cpu_seconds;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A photo-like image: two colour gradients, a few discs and bars with hard edges, and grain.
std::vector<uint8_t> photo(int w, int h, uint64_t seed) {
  std::vector<uint8_t> px(size_t(w) * size_t(h) * 3);
  auto u = [&](uint64_t k) { return double(philox4x32(seed, k)[0]) * 0x1p-32; };
  double c0[3], c1[3];
  for (int c = 0; c < 3; ++c) c0[c] = 40 + 180 * u(uint64_t(c)), c1[c] = 40 + 180 * u(uint64_t(c + 3));
  const double cx = w * u(7), cy = h * u(8), r = 0.1 * w + 0.3 * w * u(9);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const double t = (double(x) / w + double(y) / h) / 2;
      const bool disc = (x - cx) * (x - cx) + (y - cy) * (y - cy) < r * r;
      const bool bar = (x / 23) % 5 == 0 && y > h / 3;
      const auto grain = philox4x32(seed + 1, uint64_t(y) * uint64_t(w) + uint64_t(x));
      for (int c = 0; c < 3; ++c) {
        double v = c0[c] * (1 - t) + c1[c] * t;
        if (disc) v = 255 - v * 0.6;
        if (bar) v *= 0.35;
        v += double(grain[size_t(c)] % 17) - 8;
        px[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)] = uint8_t(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return px;
}

void write_folder(const fs::path& dir, int images) {
  const int sizes[4][2] = {{500, 375}, {375, 500}, {500, 333}, {400, 400}};
  tjhandle tj = tjInitCompress();
  for (int i = 0; i < images; ++i) {
    const int w = sizes[i % 4][0], h = sizes[i % 4][1];
    const std::vector<uint8_t> px = photo(w, h, uint64_t(i) * 7919 + 1);
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    if (tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &jpeg, &size, TJSAMP_420, 90, 0) != 0)
      throw std::runtime_error(tjGetErrorStr2(tj));
    const fs::path cls = dir / (i % 2 ? "b" : "a");
    fs::create_directories(cls);
    std::FILE* f = std::fopen((cls / fmt::format("img_{:05d}.jpg", i)).c_str(), "wb");
    std::fwrite(jpeg, 1, size, f);
    std::fclose(f);
    tjFree(jpeg);
  }
  tjDestroy(tj);
}

struct Config {
  std::string name;
  Interpolation interpolation;
  std::string aa;
  double reprob;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"bench_loader: the loader alone, with and without RandAugment and random erasing"};
  std::string dir;
  int images = 256, reps = 3, threads = 0;
  int64_t size = 224, batch = 32;
  cli.add_option("dir", dir, "a folder: data set, or where to write one")->required();
  cli.add_option("--images", images, "images to write when DIR holds none");
  cli.add_option("--size", size, "output image side (--image-size)");
  cli.add_option("--batch", batch, "images per batch");
  cli.add_option("--threads", threads, "loader workers (0: the calling thread)");
  cli.add_option("--reps", reps, "passes over the folder per configuration (median reported)");
  CLI11_PARSE(cli, argc, argv);

  bool has_classes = false;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir)) has_classes |= e.is_directory();
  if (!has_classes) {
    std::printf("writing %d JPEGs to %s\n", images, dir.c_str());
    write_folder(dir, images);
  }
  auto data = open_dataset("folder:" + dir, Split::train, {});
  const int64_t n = data->size() / batch * batch;
  std::printf("bench_loader: %s, %lld images, %lldx%lld output, batch %lld, %d loader thread(s)%s\n",
              data->describe().c_str(), (long long)n, (long long)size, (long long)size, (long long)batch,
              threads, threads == 0 ? " (on the calling thread)" : "");

  const std::vector<Config> configs = {
      {"crop+flip, bilinear", Interpolation::bilinear, "", 0},
      {"crop+flip, bicubic", Interpolation::bicubic, "", 0},
      {"+ RandAugment rand-m9-mstd0.5-inc1", Interpolation::bicubic, "rand-m9-mstd0.5-inc1", 0},
      {"+ RandAugment + erasing 0.25 pixel", Interpolation::bicubic, "rand-m9-mstd0.5-inc1", 0.25},
      {"+ erasing 0.25 pixel (no RandAugment)", Interpolation::bicubic, "", 0.25},
  };
  // The configurations take turns, pass by pass, so that a change in the machine's load (it is shared) falls
  // on all of them alike; each one's median pass is reported.
  std::vector<std::unique_ptr<Loader>> loaders;
  for (const Config& c : configs) {
    LoaderOptions opt;
    opt.batch_size = batch;
    opt.image_size = size;
    opt.augment = true;
    opt.threads = threads;
    opt.interpolation = c.interpolation;
    opt.rand_augment = parse_rand_augment(c.aa);
    opt.erasing = {c.reprob, EraseMode::pixel, 1};
    loaders.push_back(std::make_unique<Loader>(data, opt));
  }
  std::vector<std::vector<double>> rates(configs.size()), cpu_rates(configs.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t c = 0; c < configs.size(); ++c) {
      loaders[c]->start_epoch(r);
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_seconds();
      int64_t seen = 0;
      while (auto b = loaders[c]->next()) seen += b->images.size(0);
      rates[c].push_back(double(seen) / seconds_since(t0));
      cpu_rates[c].push_back(double(seen) / (thread_cpu_seconds() - c0));
    }
  }
  // With workers the calling thread mostly waits, so its CPU time says nothing: that column is for --threads
  // 0.
  std::printf("%-40s %10s %14s %16s %16s\n", "configuration", "img/s", "img/s/thread", "passes min-max",
              threads == 0 ? "img/CPU-s" : "");
  for (size_t c = 0; c < configs.size(); ++c) {
    const double rate = median(rates[c]);
    const auto [lo, hi] = std::minmax_element(rates[c].begin(), rates[c].end());
    std::printf("%-40s %10.1f %14.1f %8.1f-%-7.1f", configs[c].name.c_str(), rate,
                rate / std::max(threads, 1), *lo, *hi);
    if (threads == 0) std::printf(" %16.1f", median(cpu_rates[c]));
    std::printf("\n");
  }
  loaders.clear();

  // Stages, one function at a time over every image (decoded once up front, except for the decode row).
  std::vector<Image> decoded(static_cast<size_t>(n));
  std::vector<std::string> paths;
  for (const auto& cls : fs::directory_iterator(dir))
    if (cls.is_directory())
      for (const auto& f : fs::directory_iterator(cls.path())) paths.push_back(f.path());
  std::sort(paths.begin(), paths.end());
  paths.resize(size_t(std::min<int64_t>(n, int64_t(paths.size()))));
  std::vector<std::vector<uint8_t>> bytes;
  for (const auto& p : paths) bytes.push_back(read_file_bytes(p));
  std::vector<CropBox> boxes(paths.size());
  std::vector<Image> crops(paths.size());
  std::vector<float> out(size_t(size * size * 3));
  const RandAugmentConfig ra = parse_rand_augment("rand-m9-mstd0.5-inc1");
  const RandomErasingConfig er{0.25, EraseMode::pixel, 1};
  const auto stage = [&](const char* name, const std::function<void(size_t)>& fn) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    for (size_t i = 0; i < paths.size(); ++i) fn(i);
    const double n_img = double(paths.size());
    std::printf("  %-44s %8.3f ms/img wall %8.3f ms/img CPU\n", name, 1e3 * seconds_since(t0) / n_img,
                1e3 * (thread_cpu_seconds() - c0) / n_img);
  };
  std::printf("stages (calling thread, mean over %zu images):\n", paths.size());
  stage("decode (libjpeg-turbo)",
        [&](size_t i) { decode_image(bytes[i].data(), bytes[i].size(), paths[i], decoded[i]); });
  stage("crop parameters", [&](size_t i) {
    CounterRng rng(rng_key(0, RngDomain::augment), uint64_t(i) << 6);
    boxes[i] = random_resized_crop(decoded[i].height, decoded[i].width, rng);
  });
  stage("crop+resize+normalise, float, bilinear", [&](size_t i) {
    resample_normalised(decoded[i], boxes[i], size, out.data(), Interpolation::bilinear);
  });
  stage("crop+resize+normalise, float, bicubic", [&](size_t i) {
    resample_normalised(decoded[i], boxes[i], size, out.data(), Interpolation::bicubic);
  });
  stage("crop+resize to 8 bits (PIL's), bicubic",
        [&](size_t i) { resample_u8(decoded[i], boxes[i], size, Interpolation::bicubic, crops[i]); });
  stage("RandAugment rand-m9-mstd0.5-inc1 (bicubic)", [&](size_t i) {
    CounterRng rng = sample_stream(0, RngDomain::randaugment, 0, int64_t(i));
    rand_augment(ra, crops[i], Interpolation::bicubic, rng);
  });
  stage("normalise 8 bits", [&](size_t i) { normalise_u8(crops[i], out.data()); });
  stage("random erasing 0.25 pixel", [&](size_t i) {
    CounterRng rng = sample_stream(0, RngDomain::erase, 0, int64_t(i));
    random_erase(er, out.data(), size, size, rng);
  });
  // Each op of the increasing set alone, at magnitude 9 (bicubic for the geometric ones), on copies of the
  // resized crops: where RandAugment's time goes.
  std::printf("RandAugment ops at magnitude 9, %lldx%lld (calling thread, mean over %zu images):\n",
              (long long)size, (long long)size, paths.size());
  std::vector<Image> scratch(paths.size());
  for (size_t i = 0; i < paths.size(); ++i)
    resample_u8(decoded[i], boxes[i], size, Interpolation::bicubic, crops[i]);
  for (RaOp op : ra_op_set(ra)) {
    for (size_t i = 0; i < paths.size(); ++i) scratch[i] = crops[i];
    const double arg = ra_op_argument(op, 9, false);
    stage(ra_op_name(op), [&](size_t i) { apply_ra_op(op, arg, scratch[i], Interpolation::bicubic); });
  }
  return 0;
}
