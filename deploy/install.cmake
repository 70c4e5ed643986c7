# deploy/install.cmake - `cmake --install` rules, included by the top-level
# CMakeLists.txt after every target exists: binaries, static libraries, public
# headers, libkcache.so, kcache.pc, man pages, the systemd unit and the deploy examples.
include(GNUInstallDirs)

install(TARGETS kcache kcached RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# each static library with its own public headers below (kconnx: the ONNX importer)
install(TARGETS kccore kcremote kccompiler kconnx ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# libkcache.so.MAJOR.MINOR.PATCH, its soname link libkcache.so.MAJOR.MINOR and the
# development link libkcache.so.
if(TARGET kcache_shared)
  install(TARGETS kcache_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

# Public headers: each library's include/kcache/ (nothing else is public), all under
# include/kcache/; users include them as <kcache/kc_cache.h> (kcache.pc's Cflags name
# include/, as the libraries' own include paths do in the tree).
file(GLOB KC_PUBLIC_HEADERS ${PROJECT_SOURCE_DIR}/cachecore/include/kcache/*.h
     ${PROJECT_SOURCE_DIR}/client/include/kcache/*.h
     ${PROJECT_SOURCE_DIR}/compiler_stub/include/kcache/*.h
     ${PROJECT_SOURCE_DIR}/compiler_stub/onnx/include/kcache/*.h)
install(FILES ${KC_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kcache)

# pkg-config: the prefix is ${pcfiledir}/../.. (as many ".." as LIBDIR has
# parts, plus one for pkgconfig/), so `cmake --install --prefix X` works.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "deploy/install.cmake: use relative CMAKE_INSTALL_LIBDIR/INCLUDEDIR")
endif()
string(REGEX REPLACE "[^/]+" ".." KC_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
set(KC_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
set(KC_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
configure_file(${PROJECT_SOURCE_DIR}/deploy/kcache.pc.in ${PROJECT_BINARY_DIR}/kcache.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kcache.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(FILES ${PROJECT_SOURCE_DIR}/deploy/man/kcache.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/man/kcached.8 DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)

# The systemd unit, pointing at the installed kcached. The path is fixed at
# install time, so it follows `cmake --install --prefix X` too.
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/deploy/kcached.service\" unit)
  string(REPLACE \"ExecStart=/usr/bin/kcached\"
         \"ExecStart=\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/kcached\" unit \"\${unit}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/kcached.service.install\" \"\${unit}\")
")
install(FILES ${PROJECT_BINARY_DIR}/kcached.service.install
        DESTINATION lib/systemd/system RENAME kcached.service)

install(FILES
  ${PROJECT_SOURCE_DIR}/deploy/kcached.conf
  ${PROJECT_SOURCE_DIR}/deploy/tokens.example
  ${PROJECT_SOURCE_DIR}/deploy/nginx-kcache.conf
  ${PROJECT_SOURCE_DIR}/deploy/scale-out.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
