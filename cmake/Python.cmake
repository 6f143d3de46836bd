# The one Python interpreter the test suite runs (issue 41 item 8): every test that starts Python, and every
# script a test starts, uses Python3_EXECUTABLE, never whichever python3 comes first on PATH (a pyenv or venv
# python3 without Debian's packages would fail the tests that import them).
#
# Without -DPython3_EXECUTABLE=..., the candidates are Debian's /usr/bin/python3 (where ./build.sh's
# python3-h5py and python3-matplotlib, with their numpy and Pillow, are installed), then each python3 on PATH;
# the first that imports every module of CZ_PYTHON_MODULES is taken, else the one missing the fewest. The
# configure output says which one and why. A given -DPython3_EXECUTABLE is used as it is (with a warning
# naming the modules it lacks).
#
# Tests see the choice as the environment variable CZ_PYTHON (cz_tests_use_python() below); shell tests run
# "${CZ_PYTHON:-python3}".
set(CZ_PYTHON_MODULES numpy PIL h5py matplotlib)

# Sets ${out} to the modules of CZ_PYTHON_MODULES that ${python} cannot import (all of them when it does not run).
function(_cz_python_missing python out)
  execute_process(COMMAND ${python} -c [=[
import importlib, sys
missing = []
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
    except Exception:
        missing.append(m)
print(";".join(missing))
]=] ${CZ_PYTHON_MODULES}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE missing ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 60)
  if(NOT rc EQUAL 0)
    set(missing ${CZ_PYTHON_MODULES})
  endif()
  set(${out} "${missing}" PARENT_SCOPE)
endfunction()

# A Python3_EXECUTABLE that differs from the one chosen here last time was given by the user.
if(DEFINED Python3_EXECUTABLE AND NOT "${Python3_EXECUTABLE}" STREQUAL "${CZ_PYTHON_CHOSEN}")
  _cz_python_missing("${Python3_EXECUTABLE}" missing)
  if(missing)
    string(REPLACE ";" ", " missing "${missing}")
    message(WARNING "Python for the tests: ${Python3_EXECUTABLE} (given) cannot import ${missing}; "
                    "the tests that need them skip or fail")
  else()
    string(REPLACE ";" ", " wanted "${CZ_PYTHON_MODULES}")
    message(STATUS "Python for the tests: ${Python3_EXECUTABLE} (given; it imports ${wanted})")
  endif()
  set(CZ_PYTHON_CHOSEN "" CACHE INTERNAL "")
else()
  set(candidates)
  if(EXISTS /usr/bin/python3)
    list(APPEND candidates /usr/bin/python3)
  endif()
  string(REPLACE ":" ";" path_dirs "$ENV{PATH}")
  foreach(dir IN LISTS path_dirs)
    if(dir AND EXISTS "${dir}/python3" AND NOT IS_DIRECTORY "${dir}/python3")
      list(APPEND candidates "${dir}/python3")
    endif()
  endforeach()
  # One entry per interpreter (/bin/python3 is /usr/bin/python3 on a merged /usr).
  set(seen)
  set(unique)
  foreach(c IN LISTS candidates)
    file(REAL_PATH "${c}" real)
    if(NOT real IN_LIST seen)
      list(APPEND seen "${real}")
      list(APPEND unique "${c}")
    endif()
  endforeach()

  # Every candidate is probed, so that the output says what the others lack (a pyenv python3 first on PATH).
  set(chosen "")
  set(chosen_missing "")
  set(others "")
  foreach(c IN LISTS unique)
    _cz_python_missing("${c}" missing)
    list(LENGTH missing n)
    string(REPLACE ";" ", " m "${missing}")
    if(NOT chosen OR n LESS chosen_n)
      if(chosen)
        list(APPEND others "${chosen_note}")
      endif()
      set(chosen "${c}")
      set(chosen_missing "${missing}")
      set(chosen_n ${n})
      set(chosen_note "${c} lacks ${m}")
    elseif(n EQUAL 0)
      list(APPEND others "${c} has them too")
    else()
      list(APPEND others "${c} lacks ${m}")
    endif()
  endforeach()
  string(REPLACE ";" "; " others "${others}")
  if(others)
    set(others " (${others})")
  endif()
  string(REPLACE ";" ", " wanted "${CZ_PYTHON_MODULES}")
  if(NOT chosen)
    message(WARNING "Python for the tests: no python3 found; the tests that run Python are left out")
  elseif(chosen_missing)
    string(REPLACE ";" ", " m "${chosen_missing}")
    message(WARNING "Python for the tests: ${chosen}, which lacks ${m}${others}: the tests that need them "
                    "skip or fail (Debian: apt-get install python3-h5py python3-matplotlib python3-pil, or "
                    "-DPython3_EXECUTABLE=a python3 that has them)")
  else()
    message(STATUS "Python for the tests: ${chosen}, the first that imports ${wanted}${others}; "
                   "-DPython3_EXECUTABLE=... chooses another")
  endif()
  if(chosen)
    set(Python3_EXECUTABLE "${chosen}" CACHE FILEPATH "The Python interpreter of the test suite (cmake/Python.cmake)"
        FORCE)
    set(CZ_PYTHON_CHOSEN "${chosen}" CACHE INTERNAL "")
  endif()
endif()
find_package(Python3 COMPONENTS Interpreter)

function(_cz_python_env_of_directory_tests)
  get_property(tests DIRECTORY PROPERTY TESTS)
  if(tests AND Python3_Interpreter_FOUND)
    set_property(TEST ${tests} APPEND PROPERTY ENVIRONMENT "CZ_PYTHON=${Python3_EXECUTABLE}")
  endif()
endfunction()

# Called at the top of a CMakeLists.txt: at the end of that file, every test it added gets CZ_PYTHON in its
# environment (GoogleTest suites start no Python and are left as they are).
macro(cz_tests_use_python)
  cmake_language(DEFER CALL _cz_python_env_of_directory_tests)
endmacro()
