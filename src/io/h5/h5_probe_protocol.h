// What the HDF5 probe helper (h5_probe_child.cpp, the executable cz_h5_probe) and its caller (h5_probe.cpp)
// agree on: its arguments, the lines it writes and its exit statuses (Note [Probing HDF5 files]).
#pragma once

namespace cz::h5::probe_protocol {

// argv: cz_h5_probe FILE MEMORY_BYTES SAMPLE_BYTES SECONDS

// Lines on stdout, each written with one write(2) so that a crash loses none of them:
//   "at <phase>"        before each step ("reading the metadata of 'images'"); the last one is where it died
//   "unsafe <reason>"   before exiting with kExitUnsafe
//   "memory <phase>"    before exiting with kExitMemory
//   "source <file>"     once per other file a virtual dataset maps from, as stored (relative to the file)
//   "external <file>"   once per file an external link points into, as stored
//   "done <objects> <datasets> <sampled bytes> <unsampled datasets>"  after closing the file and the library
// Anything else (libc's "malloc(): corrupted top size", a sanitizer report) is passed through as is.
constexpr const char* kAt = "at ";
constexpr const char* kUnsafe = "unsafe ";
constexpr const char* kMemory = "memory ";
constexpr const char* kDone = "done ";
constexpr const char* kSource = "source ";
constexpr const char* kExternal = "external ";

// The walk ended: nothing crashed. Errors HDF5 reported cleanly are left to the caller's own open, which
// reports them with its usual messages.
constexpr int kExitWalked = 0;
constexpr int kExitUsage = 2;
// The metadata is self-contradictory in a way libhdf5 1.10 does not check and reads out of bounds on.
constexpr int kExitUnsafe = 3;
// libhdf5 or the walk needed more memory than MEMORY_BYTES.
constexpr int kExitMemory = 4;

}  // namespace cz::h5::probe_protocol
