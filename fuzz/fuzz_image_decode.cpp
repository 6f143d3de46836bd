// Fuzzes JPEG/PNG decoding and, for images that decode, the random-resized-crop, resampling (float and 8-bit)
// and RandAugment ops that follow in the loader. Only IoError (a clean rejection) may come out.
#include <vector>

#include "io/augment/image_transform.h"
#include "io/augment/randaugment.h"
#include "io/decode/image_codec.h"
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
  cz::resample_normalised(img, box, 7, out.data(), cz::Interpolation::bicubic);
  // The RandAugment path: PIL's 8-bit resize, then every op (geometric ones bicubic) at a magnitude taken
  // from the input, on the resized crop and on the decoded image itself (any size and aspect).
  cz::Image crop;
  cz::resample_u8(img, box, 7, cz::Interpolation::bicubic, crop);
  const double m = double(size % 11);
  for (int op = 0; op < cz::kRaOpCount; ++op) {
    for (cz::Image* target : {&crop, &img}) {
      if (target == &img && img.pixels.size() > (1u << 16)) continue;  // keep each input fast
      cz::apply_ra_op(cz::RaOp(op), cz::ra_op_argument(cz::RaOp(op), m, size % 2), *target,
                      cz::Interpolation::bicubic);
    }
  }
  return 0;
}
