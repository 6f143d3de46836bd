// Writes the fuzz targets' starting corpora into OUT/<target>/: small valid files of each format.
#include <cstdio>
#include <filesystem>

#include "io/io_testing.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  namespace t = cz::testing;
  const fs::path out = argv[1];
  for (const char* d : {"fuzz_image_decode", "fuzz_cifar_batch", "fuzz_h5_dataset", "fuzz_weights"})
    fs::create_directories(out / d);
  const cz::Image small = t::smooth_image(8, 6, 1), cifar = t::smooth_image(32, 32, 2);
  t::write_bytes((out / "fuzz_image_decode/rgb.jpg").string(), t::encode_jpeg(small, 80));
  t::write_bytes((out / "fuzz_image_decode/grey.jpg").string(), t::encode_jpeg(small, 80, true));
  t::write_bytes((out / "fuzz_image_decode/rgb.png").string(), t::encode_png(small));
  t::write_bytes((out / "fuzz_cifar_batch/two.bin").string(), t::cifar_records({cifar, cifar}, {3, 9}));
  t::write_h5_images((out / "fuzz_h5_dataset/two.h5").string(), {small, small}, {0, 1});
  // The parity fixture: the weights of the very model fuzz_weights reads into, under "weights/".
  fs::copy_file(CZ_TEST_DATA_DIR "/parity_convnext.h5", out / "fuzz_weights/parity_convnext.h5",
                fs::copy_options::overwrite_existing);
  return 0;
}
