// Calls one function of every third-party library the build links (see CMakeLists.txt beside it) and prints
// their versions; MPI is asked for its version only, which needs no MPI_Init.
#include <cblas.h>
#include <hdf5.h>
#include <mpi.h>
#include <omp.h>
#include <png.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  benchmark::Initialize(&argc, argv);
  CLI::App app("deps_probe");
  CLI11_PARSE(app, argc, argv);

  const double x[2] = {1, 2}, y[2] = {3, 4};
  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  if (H5get_libversion(&h5_major, &h5_minor, &h5_release) < 0) return 1;
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int mpi_len = 0;
  MPI_Get_library_version(mpi, &mpi_len);
  tjhandle jpeg = tjInitDecompress();
  if (jpeg == nullptr) return 1;
  tjDestroy(jpeg);
  const nlohmann::json versions = {
      {"cblas_ddot", cblas_ddot(2, x, 1, y, 1)},
      {"hdf5", fmt::format("{}.{}.{}", h5_major, h5_minor, h5_release)},
      {"png", png_access_version_number()},
      {"zlib", zlibVersion()},
      {"mpi", std::string(mpi, size_t(mpi_len)).substr(0, 40)},
      {"openmp_threads", omp_get_max_threads()},
  };
  fmt::print("deps_probe: {}\n", versions.dump());
  return versions["cblas_ddot"] == 11.0 ? 0 : 1;
}
