# Run by `cmake --install` / `make install` (install(SCRIPT) in CMakeLists.txt), where the
# prefix is final: CMAKE_INSTALL_PREFIX is the one given with --prefix, if any. Writes gpumem.pc
# and makes the library findable at run time:
#   - a prefix whose library folder the system's linker and loader search (/usr, /usr/local):
#     no rpath in the .pc file; ldconfig is run (as root, without DESTDIR) so that programs find
#     the new libgpumem.so.0 at once, else the message says to run it;
#   - any other prefix: the .pc file's Libs add -Wl,-rpath,<libdir>, so a program built with
#     `pkg-config --libs gpumem` runs without LD_LIBRARY_PATH; the message says which
#     PKG_CONFIG_PATH (or CMAKE_PREFIX_PATH) finds the prefix.
# In: GM_PC_IN, GM_PC_OUT, GM_LIBDIR, GM_INCLUDEDIR, GM_VERSION, GM_SYSTEM_LIBDIRS.
foreach(v GM_LIBDIR GM_INCLUDEDIR)
  if(IS_ABSOLUTE "${${v}}")
    set(${v}_ABS "${${v}}")
  else()
    set(${v}_ABS "${CMAKE_INSTALL_PREFIX}/${${v}}")
  endif()
endforeach()
set(pc_dir "${GM_LIBDIR_ABS}/pkgconfig")
# Relocatable where it can be: libdir and includedir relative to the .pc file's own folder.
file(RELATIVE_PATH GM_PC_TO_PREFIX "${pc_dir}" "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/$" "" GM_PC_TO_PREFIX "${GM_PC_TO_PREFIX}")
file(RELATIVE_PATH lib_rel "${CMAKE_INSTALL_PREFIX}" "${GM_LIBDIR_ABS}")
file(RELATIVE_PATH inc_rel "${CMAKE_INSTALL_PREFIX}" "${GM_INCLUDEDIR_ABS}")
set(GM_PC_LIBDIR "\${prefix}/${lib_rel}")
set(GM_PC_INCLUDEDIR "\${prefix}/${inc_rel}")
set(GM_PC_VERSION "${GM_VERSION}")
get_filename_component(libdir_real "${GM_LIBDIR_ABS}" REALPATH)
set(system FALSE)
foreach(d IN LISTS GM_SYSTEM_LIBDIRS)
  get_filename_component(d_real "${d}" REALPATH)
  if(libdir_real STREQUAL d_real)
    set(system TRUE)
  endif()
endforeach()
if(system)
  set(GM_PC_RPATH "")
else()
  set(GM_PC_RPATH " -Wl,-rpath,\${libdir}")
endif()
configure_file("${GM_PC_IN}" "${GM_PC_OUT}" @ONLY)
file(INSTALL DESTINATION "${pc_dir}" TYPE FILE FILES "${GM_PC_OUT}")
if(NOT system)
  message(STATUS "gpumem is in ${CMAKE_INSTALL_PREFIX}, outside the system's library folders. "
          "Build against it with PKG_CONFIG_PATH=${pc_dir} (pkg-config --cflags --libs gpumem "
          "adds an rpath, so the program runs without LD_LIBRARY_PATH) or "
          "CMAKE_PREFIX_PATH=${CMAKE_INSTALL_PREFIX} (find_package(gpumem)); run the tool as "
          "${CMAKE_INSTALL_PREFIX}/bin/gpumem")
elseif("$ENV{DESTDIR}" STREQUAL "")
  find_program(GM_LDCONFIG ldconfig PATHS /sbin /usr/sbin)
  set(rc 1)
  if(GM_LDCONFIG)
    execute_process(COMMAND "${GM_LDCONFIG}" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(rc EQUAL 0)
    message(STATUS "ran ldconfig: programs find libgpumem.so.0 in ${GM_LIBDIR_ABS}")
  else()
    message(STATUS "could not run ldconfig (not root?): run `sudo ldconfig` once, or programs "
            "will not find libgpumem.so.0 in ${GM_LIBDIR_ABS}")
  endif()
endif()
