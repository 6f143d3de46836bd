// Fuzzes JPEG/PNG decoding and, for images that decode, the random-resized-crop and resampling that follow in
// the loader. Only IoError (a clean rejection) may come out.
#include <vector>

#include "io/image_codec.h"
#include "io/image_transform.h"
#include "tensor/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cz::Image img;
  try {
    cz::decode_image(data, size, "fuzz-input", img);
  } catch (const cz::IoError&) {
    return 0;
  }
  if (img.pixels.size() != size_t(img.height * img.width * 3)) __builtin_trap();
  cz::CounterRng rng(size, 0);
  const cz::CropBox box = cz::random_resized_crop(img.height, img.width, rng);
  std::vector<float> out(7 * 7 * 3);
  cz::resample_normalised(img, box, 7, out.data());
  return 0;
}
