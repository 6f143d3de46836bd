// Fuzzes the CIFAR-10 reader with arbitrary bytes as test_batch.bin: open, then read every record (up to 64).
#include "fuzz_files.h"
#include "io/data/dataset.h"
#include "tensor/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = cz::fuzz::write_scratch("test_batch.bin", data, size);
  try {
    auto set = cz::open_dataset("cifar10:" + dir, cz::Split::eval, {});
    cz::Image img;
    for (int64_t i = 0; i < set->size() && i < 64; ++i) {
      set->read(i, img);
      if (set->label(i) < 0 || set->label(i) >= set->num_classes()) __builtin_trap();
    }
  } catch (const cz::IoError&) {
  }
  return 0;
}
