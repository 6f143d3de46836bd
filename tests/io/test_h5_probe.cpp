// The HDF5 probe (io/h5/h5_probe.h, Note [Probing HDF5 files]): files that crash libhdf5 are IoErrors naming
// the file through every reader, valid files pass with their walk reported, and each way the helper can end
// (signal, memory limit, clock, missing helper) gives its message. Stand-in helpers are shell scripts.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "common/error_of.h"
#include "io/data/dataset.h"
#include "io/h5/h5_file.h"
#include "io/h5/h5_probe.h"
#include "io/h5/helper_programs.h"
#include "io_testing.h"
#include "tensor/check.h"

namespace cz {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

std::vector<std::string> known_crashes() {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(CZ_KNOWN_CRASHES)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// A stand-in helper: a shell script, made executable.
std::string script(const TempDir& dir, const std::string& name, const std::string& body) {
  const std::string path = dir.str(name);
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

std::string valid_data_file(const TempDir& dir) {
  const std::string path = dir.str("data.h5");
  testing::write_h5_images(path, {testing::smooth_image(8, 6, 1), testing::smooth_image(8, 6, 2)}, {0, 1});
  return path;
}

TEST(H5Probe, KnownLibhdf5CrashesAreIoErrorsThroughEveryReader) {
  const std::vector<std::string> files = known_crashes();
  ASSERT_GE(files.size(), 2u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const std::string as_data = error_of<IoError>([&] { open_dataset("h5:" + f, Split::train, {}); });
    EXPECT_HAS(as_data, "h5:" + f + ": ");
    EXPECT_HAS(as_data, "the file is corrupt");
    // Weight files and checkpoints open through h5::File.
    const std::string as_file = error_of<IoError>([&] { h5::File::open(f); });
    EXPECT_HAS(as_file, f + ": ");
    EXPECT_HAS(as_file, "the file is corrupt");
  }
}

TEST(H5Probe, MessagesSayWhatHappened) {
  const std::string dir = CZ_KNOWN_CRASHES;
  EXPECT_HAS(error_of<IoError>([&] { h5::probe_file(dir + "/libhdf5_accum_read_null_memcpy.h5", "x"); }),
             "x: libhdf5 crashed (SIGSEGV) while reading the file's links: the file is corrupt or not HDF5");
  EXPECT_HAS(error_of<IoError>([&] { h5::probe_file(dir + "/libhdf5_memcpyvv_heap_overflow.h5", "x"); }),
             "x: dataset 'labels' is stored compactly in 9 bytes, but its 2 elements of 8 bytes need 16: the "
             "file is corrupt");
  // Size fields claiming more than glibc grants, and 4 GiB, which it grants (in-process, H5Fopen then took
  // 7.7 s and 4.2 GB before failing): refused under the probe's memory limit instead.
  EXPECT_HAS(
      error_of<IoError>([] { h5::probe_file(CZ_FUZZ_REGRESSIONS "/h5_huge_metadata_alloc.h5", "x"); }),
      "x: libhdf5 needed more than 1 GiB of memory while reading the file's links: the file is corrupt");
  EXPECT_HAS(
      error_of<IoError>([] { h5::probe_file(CZ_FUZZ_REGRESSIONS "/h5_superblock_realloc_4gib.h5", "x"); }),
      "x: libhdf5 needed more than 1 GiB of memory while opening the file: the file is corrupt");
}

TEST(H5Probe, ValidFilesPassAndLoadAsBefore) {
  TempDir dir;
  const std::string path = valid_data_file(dir);
  const h5::ProbeReport r = h5::probe_file(path, path);
  EXPECT_EQ(r.objects, 3);  // the root group, images, labels
  EXPECT_EQ(r.datasets, 2);
  EXPECT_EQ(r.sampled_bytes, 2 * 1 + 2 * 8);  // first and last element of each (contiguous)
  EXPECT_EQ(r.unsampled_datasets, 0);
  auto data = open_dataset("h5:" + path, Split::train, {});
  EXPECT_EQ(data->size(), 2);
  Image img;
  data->read(1, img);
  EXPECT_EQ(img.pixels, testing::smooth_image(8, 6, 2).pixels);
  data.reset();  // HDF5 would go on serving the open file
  // Not HDF5: the probe passes it on and the reader's own message stays.
  testing::write_bytes(path, {'n', 'o', 't', ' ', 'h', 'd', 'f'});
  EXPECT_EQ(h5::probe_file(path, path).objects, 0);
  EXPECT_HAS(error_of<IoError>([&] { open_dataset("h5:" + path, Split::train, {}); }),
             "not a readable HDF5 file");
}

// Opening a dataset by name follows an external link into another file, so the probe walks that file too.
TEST(H5Probe, ExternalLinksAreFollowed) {
  TempDir dir;
  auto link = [&](const std::string& from, const std::string& to, const std::string& name) {
    const hid_t f = H5Fcreate(dir.str(from).c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_external(to.c_str(), "/images", f, name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
  };
  const std::string crash = known_crashes().front();
  link("linking.h5", crash, "images");
  const std::string path = dir.str("linking.h5");
  EXPECT_HAS(error_of<IoError>([&] { open_dataset("h5:" + path, Split::train, {}); }),
             crash + " (external link from h5:" + path + "): libhdf5 crashed (SIGSEGV)");
  // A cycle of links ends; relative names are taken from the linking file's folder.
  link("a.h5", "b.h5", "x");
  link("b.h5", "a.h5", "x");
  const h5::ProbeReport r = h5::probe_file(dir.str("a.h5"), "a");
  EXPECT_EQ(r.external_files, std::vector<std::string>{"b.h5"});
}

TEST(H5Probe, SampleBudgetBoundsTheDataRead) {
  TempDir dir;
  const std::string path = valid_data_file(dir);
  const h5::ProbeReport r = h5::probe_file(path, path, {.sample_bytes = 10});
  EXPECT_EQ(r.sampled_bytes, 2);  // images' two bytes fit; labels' sixteen would not
  EXPECT_EQ(r.unsampled_datasets, 1);
}

TEST(H5Probe, HelperDeathLimitsAndClock) {
  TempDir dir;
  const std::string file = valid_data_file(dir);
  auto with = [&](const std::string& helper, double seconds = 60) {
    return error_of<IoError>([&] { h5::probe_file(file, "h5:f", {.seconds = seconds, .helper = helper}); });
  };
  EXPECT_HAS(with(script(dir, "segv", "echo \"at reading a sample of dataset 'images'\"; kill -SEGV $$")),
             "h5:f: libhdf5 crashed (SIGSEGV) while reading a sample of dataset 'images'");
  EXPECT_HAS(with(script(dir, "abort", "echo 'malloc(): corrupted top size' >&2; kill -ABRT $$")),
             "h5:f: libhdf5 crashed (SIGABRT: malloc(): corrupted top size) while starting");
  EXPECT_HAS(with(script(dir, "killed", "kill -KILL $$")),
             "h5:f: the process reading it with libhdf5 was killed (SIGKILL)");
  // A stop request sent to every process of the caller's tree (a preempted Slurm step) does not end the
  // probe: it comes blocked (Note [Stop signals and the probe]), and this helper exits by itself after it.
  EXPECT_HAS(
      with(script(dir, "stopped", "kill -USR1 $$; kill -TERM $$; kill -INT $$; exit 0")),
      "h5:f: cannot check the file: the HDF5 probe " + dir.str("stopped") + " ended with exit status 0");
  EXPECT_HAS(with(script(dir, "memory", "echo 'memory opening the file'; exit 4")),
             "h5:f: libhdf5 needed more than 1 GiB of memory while opening the file");
  EXPECT_HAS(with(script(dir, "silent", "exit 0")), "h5:f: cannot check the file: the HDF5 probe " +
                                                        dir.str("silent") + " ended with exit status 0");
  EXPECT_HAS(with(dir.str("nonexistent")), "h5:f: cannot check the file: cannot start the HDF5 probe");
  // A helper that hangs (in the background too, holding the pipe open) is killed at the deadline.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_HAS(with(script(dir, "hang", "echo 'at opening the file'; exec sleep 30"), 0.5),
             "h5:f: libhdf5 did not finish reading the file within 0.5 s (it was opening the file)");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// Note [Helpers beside the program]: beside the program first, then PATH's folders in order, skipping what
// is not an executable file; nothing compiled in.
TEST(HelperPrograms, BesideTheProgramThenPath) {
  TempDir dir;
  for (const char* d : {"self", "p1", "p2", "p3"}) fs::create_directory(dir.str(d));
  const std::string self = dir.str("self"), path = dir.str("p1") + ":" + dir.str("p2") + ":" + dir.str("p3");
  EXPECT_EQ(find_helper_in("tool", self, path), std::nullopt);
  std::ofstream(dir.str("p1/tool")) << "not executable\n";  // skipped: no run bit
  fs::create_directory(dir.str("p2/tool"));                 // skipped: a folder
  script(dir, "p3/tool", "exit 0");
  EXPECT_EQ(find_helper_in("tool", self, path), dir.str("p3/tool"));
  script(dir, "self/tool", "exit 0");
  EXPECT_EQ(find_helper_in("tool", self, path), dir.str("self/tool"));
  EXPECT_EQ(find_helper_in("tool", "", path), dir.str("p3/tool"));  // /proc/self/exe unreadable
  EXPECT_EQ(find_helper_in("tool", dir.str("p1"), ""), std::nullopt);
}

// This test program finds the probe as the installed programs do: the build links it beside every
// executable (cmake/Helpers.cmake); a missing helper is an error naming where it was looked for.
TEST(HelperPrograms, TheBuildPutsTheProbeBesideItsPrograms) {
  EXPECT_EQ(find_helper("cz_h5_probe", "the HDF5 probe"), self_dir() + "/cz_h5_probe");
  EXPECT_HAS(
      error_of<IoError>([] { find_helper("cz_no_such_helper", "a helper"); }),
      "cannot find a helper (cz_no_such_helper): not beside this program (" + self_dir() + ") nor on PATH");
}

// Probes from several threads at once, as loader threads and a checkpoint reader might: each gets its own
// helper's verdict, and the pipe of one is never held open by another's child.
TEST(H5Probe, ConcurrentProbesKeepTheirOwnVerdicts) {
  TempDir dir;
  const std::string valid = valid_data_file(dir);
  const std::string crash = known_crashes().front();
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        const bool bad = (t + i) % 2 == 1;
        const std::string e = error_of<IoError>([&] { h5::probe_file(bad ? crash : valid, "f"); });
        wrong[size_t(t)] += bad ? e.find("the file is corrupt") == std::string::npos : e != "(no error)";
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace cz
