# Enforces the library layering at compile time. Each library `cz_<name>` sees the headers of src/<name>/ and of
# the libraries it links, nothing else: its include path is a private folder holding one link per visible layer,
# so `#include "dist/comm.h"` from src/nn/ fails to compile instead of silently creating a cycle.
# DIR (default: the name) is the library's folder under src/, e.g. `dist/comm` for cz_comm.
function(cz_add_library name)
  cmake_parse_arguments(ARG "" "DIR" "SOURCES;DEPS" ${ARGN})
  if(NOT ARG_DIR)
    set(ARG_DIR ${name})
  endif()
  set(target cz_${name})
  add_library(${target} STATIC ${ARG_SOURCES})
  set(inc ${CMAKE_BINARY_DIR}/layers/${name})
  get_filename_component(parent ${inc}/${ARG_DIR} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  if(NOT EXISTS ${inc}/${ARG_DIR})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${ARG_DIR} ${inc}/${ARG_DIR} SYMBOLIC)
  endif()
  target_include_directories(${target} PUBLIC ${inc})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS})
endfunction()
