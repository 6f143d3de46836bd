# Note [Helpers beside the program] (src/io/h5/helper_programs.h) in the build tree: programs start their helpers
# from their own folder, then from PATH. The helpers are built in apps/, beside the programs; every other
# folder that holds an executable of the build (tests, benchmarks) gets a relative link to each helper, so
# that a test binary finds the probe as an installed program does, and a build tree copied or moved
# elsewhere (cp -a, tar) keeps working.

# Sets ${out} to the folders the executables of `dir` and of its subdirectories are written to.
function(_cz_executable_dirs dir out)
  set(dirs)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      get_target_property(where ${t} RUNTIME_OUTPUT_DIRECTORY)
      if(NOT where)
        get_target_property(where ${t} BINARY_DIR)
      endif()
      list(APPEND dirs ${where})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _cz_executable_dirs(${sub} sub_dirs)
    list(APPEND dirs ${sub_dirs})
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  set(${out} "${dirs}" PARENT_SCOPE)
endfunction()

# Called once, at the end of the top-level CMakeLists.txt: links to each helper target in every folder of
# executables but the helper's own; `library` (the one that starts them) depends on the links.
function(cz_link_helpers library)
  _cz_executable_dirs(${PROJECT_SOURCE_DIR} dirs)
  set(links)
  foreach(helper IN LISTS ARGN)
    get_target_property(home ${helper} RUNTIME_OUTPUT_DIRECTORY)
    foreach(dir IN LISTS dirs)
      if(NOT dir STREQUAL home)
        file(RELATIVE_PATH rel ${dir} ${home}/${helper})
        add_custom_command(OUTPUT ${dir}/${helper} COMMAND ${CMAKE_COMMAND} -E create_symlink ${rel} ${dir}/${helper}
                           DEPENDS ${helper} COMMENT "Linking ${rel} beside the executables of ${dir}" VERBATIM)
        list(APPEND links ${dir}/${helper})
      endif()
    endforeach()
  endforeach()
  add_custom_target(cz_helper_links ALL DEPENDS ${links})
  add_dependencies(${library} cz_helper_links)
endfunction()
