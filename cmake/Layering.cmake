# Enforces the library layering at compile time. Each library `cz_<name>` sees the headers of src/<name>/ and of
# the libraries it links, nothing else: its include path is a private folder holding one link per visible layer,
# so `#include "dist/comm.h"` from src/nn/ fails to compile instead of silently creating a cycle.
function(cz_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  set(target cz_${name})
  add_library(${target} STATIC ${ARG_SOURCES})
  set(inc ${CMAKE_BINARY_DIR}/layers/${name})
  file(MAKE_DIRECTORY ${inc})
  if(NOT EXISTS ${inc}/${name})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${name} ${inc}/${name} SYMBOLIC)
  endif()
  target_include_directories(${target} PUBLIC ${inc})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS})
endfunction()
