// Internal to h5_file.cpp: the HDF5 file driver (VFD) that files being written use. Note [Abandoning a
// failed file].
#pragma once

#include <hdf5.h>

#include <string>

namespace cz::h5::detail {

// What the driver of one file being written reports back, and how it should treat further writes. Owned by
// the h5::File; the driver holds a pointer to it.
struct WriteStatus {
  std::string error;   // the first failed write or truncate ("" when none), with errno's reason
  bool drop = false;   // writes and truncates succeed without doing anything (set after a failure)
  bool quiet = false;  // a failure is recorded and dropped but not reported to HDF5 (the final close)
};

// Makes files created with `fapl` use the driver, reporting to `status`.
herr_t use_writer_driver(hid_t fapl, WriteStatus* status);

}  // namespace cz::h5::detail
