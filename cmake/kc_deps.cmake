# cmake/kc_deps.cmake - every system dependency is found through these helpers,
# which name the Debian package to install when something is missing, so a fresh
# machine fails at configure time ("install opencl-c-headers"), not halfway
# through the build. scripts/setup.sh installs all of them; scripts/check-deps.sh
# checks after a build that nothing used comes from a package setup.sh omits.

set(KC_DEPS_HINT "bash scripts/setup.sh installs every package kcache needs")

# Stops the configure step naming what is missing and the package that has it.
function(kc_deps_fail_unless found what debpkg)
  if(NOT found)
    message(FATAL_ERROR "${what} not found: install the Debian package ${debpkg} "
      "(${KC_DEPS_HINT})")
  endif()
endfunction()

# kc_require_pkg(PREFIX MODULE DEBIAN_PACKAGE): pkg_check_modules with an
# IMPORTED_TARGET PkgConfig::PREFIX (a macro so PREFIX_* stay in the caller's scope).
macro(kc_require_pkg prefix module debpkg)
  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET GLOBAL ${module})
  kc_deps_fail_unless("${${prefix}_FOUND}" "pkg-config module '${module}'" ${debpkg})
endmacro()

# kc_require_library(VAR NAME DEBIAN_PACKAGE): find_library(VAR NAME) or fail.
function(kc_require_library var name debpkg)
  find_library(${var} ${name})
  kc_deps_fail_unless("${${var}}" "library '${name}'" ${debpkg})
endfunction()

# kc_require_header(VAR HEADER DEBIAN_PACKAGE): find_path(VAR HEADER) or fail.
function(kc_require_header var header debpkg)
  find_path(${var} ${header})
  kc_deps_fail_unless("${${var}}" "header <${header}>" ${debpkg})
endfunction()

# kc_require_program(VAR NAME DEBIAN_PACKAGE): find_program(VAR NAME) or fail
# (the toolchain programs the backends and tests run).
function(kc_require_program var name debpkg)
  find_program(${var} ${name})
  kc_deps_fail_unless("${${var}}" "program '${name}'" ${debpkg})
endfunction()
