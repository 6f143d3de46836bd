// Fuzzes the h5 data set reader with arbitrary bytes as the file: open (checks of datasets, dtypes, shapes
// and labels), then read a few images. Only IoError may come out; crashes inside libhdf5 show up here too.
#include "fuzz_files.h"
#include "io/data/dataset.h"
#include "tensor/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = cz::fuzz::write_scratch("data.h5", data, size);
  try {
    auto set = cz::open_dataset("h5:" + dir + "/data.h5", cz::Split::train, {});
    cz::Image img;
    for (int64_t i = 0; i < set->size() && i < 4; ++i) {
      set->read(i, img);
      if (set->label(i) < 0 || set->label(i) >= set->num_classes()) __builtin_trap();
    }
  } catch (const cz::IoError&) {
  }
  return 0;
}
