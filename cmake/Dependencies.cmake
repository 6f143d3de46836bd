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
# libprotobuf-lite and protoc: --tensorboard's Event messages (src/io/log/tensorboard.proto).
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

# The other CPU GEMM libraries measured per shape beside OpenBLAS (issue 43): oneDNN (its C API; the package's
# CMake config wants OpenCL's development files, which the CPU path does not need), BLIS's OpenMP build and
# libxsmm (static only in Debian; it falls back to the BLAS it is linked with). BLIS also exports the CBLAS
# symbols: it comes after OpenBLAS on every link line, so cblas_* stays OpenBLAS's, and its header (which sits
# beside a cblas.h of its own) is named by path instead of adding its folder to the include path.
find_path(CZ_DNNL_INCLUDE oneapi/dnnl/dnnl.h)
find_library(CZ_DNNL_LIB dnnl)
find_file(CZ_BLIS_HEADER blis.h PATHS /usr/include/x86_64-linux-gnu/blis-openmp NO_DEFAULT_PATH)
find_library(CZ_BLIS_LIB NAMES libblis.so.4 blis PATHS /usr/lib/x86_64-linux-gnu/blis-openmp NO_DEFAULT_PATH)
find_path(CZ_XSMM_INCLUDE libxsmm.h)
find_library(CZ_XSMM_LIB NAMES libxsmm.a xsmm)
foreach(v CZ_DNNL_INCLUDE CZ_DNNL_LIB CZ_BLIS_HEADER CZ_BLIS_LIB CZ_XSMM_INCLUDE CZ_XSMM_LIB)
  if(NOT ${v})
    message(FATAL_ERROR "${v} not found: install libdnnl-dev libblis-openmp-dev libxsmm-dev (./build.sh does)")
  endif()
endforeach()
add_library(cz_cpu_gemm_libs INTERFACE)
target_include_directories(cz_cpu_gemm_libs SYSTEM INTERFACE ${CZ_DNNL_INCLUDE} ${CZ_XSMM_INCLUDE})
target_compile_definitions(cz_cpu_gemm_libs INTERFACE CZ_BLIS_HEADER="${CZ_BLIS_HEADER}")
target_link_libraries(cz_cpu_gemm_libs INTERFACE ${CZ_DNNL_LIB} ${CZ_XSMM_LIB} ${CZ_OPENBLAS_LIB} ${CZ_BLIS_LIB})

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
