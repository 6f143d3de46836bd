// Reads an HDF5 file's metadata in a separate process before this one opens it, so that a corrupt file
// that crashes libhdf5 becomes an IoError naming the file instead of killing the program. Every HDF5 file
// the program reads goes through it: h5: data sets, weight files, checkpoint indexes and rank files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cz::h5 {

// Note [Probing HDF5 files]
// libhdf5 trusts much of what a file says: a corrupt file can make it copy from a NULL it failed to
// allocate, read past its own buffers, or allocate gigabytes (fuzz/known_crashes/, docs/data.md). None of
// that can be caught in the process where it happens. So before a file is opened for real, a helper process
// (cz_h5_probe, h5_probe_child.cpp) opens it with the same library under a memory limit and walks it as
// our readers would and more: every object header reachable by hard links, every attribute (its value read
// when up to 1 MiB), every dataset's type, extent, layout, filters, chunk index (every entry) and
// virtual-dataset mappings, and a sample of the data (the first and the last element, hence the first and
// the last chunk through its filters) while the sample stays within a budget. Files that external links point
// into are probed in turn (opening a dataset by name follows such a link); the source files of virtual
// datasets are listed, and probed by whoever reads through them. If the helper dies by a signal,
// runs out of memory, finds metadata that libhdf5 would read out of bounds on, or overruns the clock,
// probe_file throws an IoError naming the file and what happened; if it finishes, the caller opens the file
// itself and HDF5's clean failures are reported by the caller's usual messages.
//
// Spawn and exec, not fork. The caller may have threads: loader workers and a background checkpoint writer
// inside libhdf5 (holding its global lock, which a forked child would inherit locked and wait on forever),
// OpenMP and MPI progress threads, a CUDA context. After fork() only async-signal-safe calls are allowed
// until exec, and libhdf5 is not that. posix_spawn (clone(CLONE_VM | CLONE_VFORK) in glibc) runs nothing of
// ours in the child before exec: it copies no page tables however large the caller is (a trainer with
// gigabytes mapped, or CUDA's terabytes of reserved address space, which would also make an address-space
// limit on a forked child meaningless), touches no memory registered with a network card (Open MPI warns
// about fork for that reason; exec is safe), and the helper starts with a fresh libhdf5, its own limits and
// default signal handlers. The price is an exec and the loading of libhdf5 per file: a few milliseconds,
// measured in docs/data.md. The helper gets no file descriptor of ours but its output pipe.
//
// Limits: 1 GiB of address space (a valid file needs tens of MiB: libhdf5's metadata cache is capped at
// 32 MiB and its chunk cache at 1 MiB per dataset; the fuzzers' corrupt files ask for up to 2^48 bytes),
// 16 MiB of sampled data per file (whole chunks count: a sample of a dataset in 4 MiB chunks costs 8 MiB),
// and 60 s of wall-clock time (a valid file takes milliseconds; the limit is for a slow or stalled file
// system, not for the file). Reaching the time limit is an error, not a pass: a stalled probe would
// otherwise be followed by a stalled open. The limits are not flags: nothing valid comes near them.
//
// Not covered: data beyond the sample (the chunk index is walked whole, but only the sampled chunks go
// through the filters; an image in the middle of a dataset is decoded in-process as before), files that
// change after the probe, and memory errors inside libhdf5 that neither crash nor show in the metadata (the
// helper is not a sanitizer build). One check is ours rather than libhdf5's: a compact dataset whose stored
// bytes are fewer than its shape and type need is refused (libhdf5 1.10 copies past them).
struct ProbeLimits {
  int64_t memory_bytes = int64_t{1} << 30;
  int64_t sample_bytes = int64_t{16} << 20;
  double seconds = 60;
  std::string helper{};  // the probe executable; empty: cz_h5_probe found as io/h5/helper_programs.h says
};

// What the helper walked, for tests and measurements.
struct ProbeReport {
  int64_t objects = 0;
  int64_t datasets = 0;
  int64_t sampled_bytes = 0;
  int64_t unsampled_datasets = 0;  // not sampled: the sample budget was spent
  // Other files its virtual datasets map from, as stored: relative to the file's folder unless absolute.
  std::vector<std::string> virtual_sources;
  // Files its external links point into, as stored (probe_file has probed those that exist).
  std::vector<std::string> external_files;
};

// `name` starts every error message: the path, or how the user gave it ("h5:/data/train.h5"). The files the
// file's external links point into are probed as well (each once), since opening a dataset by name follows
// them; those of its virtual datasets are only listed (h5::File::open probes them on request).
ProbeReport probe_file(const std::string& path, const std::string& name, const ProbeLimits& limits = {});

}  // namespace cz::h5
