# CUDA backend: built when the toolkit is found, unless -DCZ_WITH_CUDA=OFF.
set(CZ_CUDA_ENABLED OFF)
if(CZ_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # RTX 4090 (sm_89) and H100/H200 (sm_90).
      set(CMAKE_CUDA_ARCHITECTURES 89 90)
    endif()
    # CMake 3.25 does not know nvcc's C++20 flag and refuses CUDA20 ("does not support this"); nvcc 12+ has
    # it. Tell CMake before the language is enabled, so its compile-feature detection records cuda_std_20.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    # cuDNN 9 and NCCL: beside the toolkit (/usr/local/cuda), in the system paths (/usr/include,
    # /usr/lib/<arch>), or under CZ_CUDNN_ROOT / CZ_NCCL_ROOT (e.g. the pip wheels' site-packages/nvidia/cudnn,
    # which ship only the versioned libcudnn.so.9 and libnccl.so.2).
    set(CZ_CUDNN_ROOT "$ENV{CZ_CUDNN_ROOT}" CACHE PATH "cuDNN install prefix, if not beside CUDA or in /usr")
    set(CZ_NCCL_ROOT "$ENV{CZ_NCCL_ROOT}" CACHE PATH "NCCL install prefix, if not beside CUDA or in /usr")
    find_library(CZ_CUDNN_LIB NAMES cudnn libcudnn.so.9 HINTS ${CZ_CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu REQUIRED)
    find_path(CZ_CUDNN_INCLUDE cudnn_version.h HINTS ${CZ_CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
              PATH_SUFFIXES include REQUIRED)
    find_library(CZ_NCCL_LIB NAMES nccl libnccl.so.2 HINTS ${CZ_NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu REQUIRED)
    find_path(CZ_NCCL_INCLUDE nccl.h HINTS ${CZ_NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include
              REQUIRED)
    # The convolutions use cuDNN 9's API (conv.cpp); an older header would fail far from the cause.
    file(STRINGS ${CZ_CUDNN_INCLUDE}/cudnn_version.h _cz_cudnn_major REGEX "^#define CUDNN_MAJOR [0-9]+")
    string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _cz_cudnn_major "${_cz_cudnn_major}")
    if(NOT _cz_cudnn_major OR _cz_cudnn_major LESS 9)
      message(FATAL_ERROR "convnext_zero needs cuDNN 9 or newer; ${CZ_CUDNN_INCLUDE}/cudnn_version.h says "
                          "'${_cz_cudnn_major}' (set CZ_CUDNN_ROOT to another install)")
    endif()
    message(STATUS "convnext_zero: cuDNN ${_cz_cudnn_major} (${CZ_CUDNN_LIB}), NCCL ${CZ_NCCL_LIB}")
    set(CZ_CUDA_ENABLED ON)
  else()
    message(STATUS "convnext_zero: no CUDA compiler found, building the CPU backend only")
  endif()
endif()
