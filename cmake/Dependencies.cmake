# Third-party dependencies, all from Debian packages (build.sh installs them).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(PNG REQUIRED)
find_package(libjpeg-turbo REQUIRED)
# libprotobuf-lite and protoc: --tensorboard's Event messages (src/io/tensorboard.proto).
find_package(Protobuf REQUIRED)

# OpenBLAS: prefer the OpenMP build so GEMM shares the OpenMP thread pool instead of running a second pool of
# spinning pthreads next to it (which starves other ranks when several share a machine's cores).
find_path(CZ_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
find_library(CZ_OPENBLAS_LIB openblas PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
if(NOT CZ_CBLAS_INCLUDE OR NOT CZ_OPENBLAS_LIB)
  message(WARNING "OpenMP build of OpenBLAS not found (libopenblas-openmp-dev); falling back to the default one")
  find_package(OpenBLAS REQUIRED)
  set(CZ_CBLAS_INCLUDE ${OpenBLAS_INCLUDE_DIRS})
  set(CZ_OPENBLAS_LIB ${OpenBLAS_LIBRARIES})
endif()
add_library(cz_openblas INTERFACE)
target_include_directories(cz_openblas SYSTEM INTERFACE ${CZ_CBLAS_INCLUDE})
target_link_libraries(cz_openblas INTERFACE ${CZ_OPENBLAS_LIB})

add_library(cz_hdf5 INTERFACE)
target_include_directories(cz_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS})
target_link_libraries(cz_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_compile_definitions(cz_hdf5 INTERFACE ${HDF5_C_DEFINITIONS})

if(CZ_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(CZ_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
