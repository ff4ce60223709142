# Small helpers so every folder declares its library, tests and binaries the same way.

# -Wmaybe-uninitialized misfires inside Eigen's AVX-512 kernels with g++ 12. With clang,
# lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED) are checked: a call
# without the lock it requires stops the build.
set(TESSERA_WARNINGS -Wall -Wextra -Wno-unused-parameter
    $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>
    $<$<CXX_COMPILER_ID:Clang>:-Wthread-safety -Werror=thread-safety>)
# sqrt in the optimizer loops vectorises only without errno semantics; nothing reads errno.
set(TESSERA_CODEGEN -fno-math-errno)

function(tessera_apply_common target)
  target_compile_options(${target} PRIVATE ${TESSERA_WARNINGS} ${TESSERA_CODEGEN})
  if(TESSERA_NATIVE)
    target_compile_options(${target} PRIVATE -march=native)
  endif()
endfunction()

# tessera_cc_library(NAME name ALIAS ns::name SRCS ... DEPS ...)
function(tessera_cc_library)
  cmake_parse_arguments(T "" "NAME;ALIAS" "SRCS;DEPS" ${ARGN})
  add_library(${T_NAME} ${T_SRCS})
  target_include_directories(${T_NAME} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>)
  target_link_libraries(${T_NAME} PUBLIC ${T_DEPS})
  tessera_apply_common(${T_NAME})
  if(T_ALIAS)
    add_library(${T_ALIAS} ALIAS ${T_NAME})
  endif()
endfunction()

# tessera_cc_test(NAME name SRCS ... DEPS ... [TIMEOUT s] [LABELS ...] [RUNS program ...])
# One executable per test file, registered with CTest. RUNS: programs it starts (tessera_shard,
# ...), built before it, their paths as TESSERA_SHARD_BIN and so on, and this source tree
# as TESSERA_SOURCE_DIR.
function(tessera_cc_test)
  cmake_parse_arguments(T "OPTIMIZED" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;RUNS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  tessera_apply_common(${T_NAME})
  if(NOT T_OPTIMIZED AND NOT TESSERA_SANITIZE AND CMAKE_BUILD_TYPE STREQUAL "Release")
    # A test's own code (assertions, fixtures) compiles a quarter faster at -O1 and does not
    # need -O3: the code it tests is in the libraries, built as configured. OPTIMIZED: the
    # code under test is inline in headers (row_math.h, device/table_core.h), whose
    # bit-for-bit checks hold for the products' flags: the test builds with those.
    target_compile_options(${T_NAME} PRIVATE -O1)
  endif()
  if(T_RUNS)
    target_compile_definitions(${T_NAME} PRIVATE TESSERA_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    foreach(program ${T_RUNS})
      string(TOUPPER ${program} macro)
      target_compile_definitions(${T_NAME} PRIVATE ${macro}_BIN="$<TARGET_FILE:${program}>")
    endforeach()
    add_dependencies(${T_NAME} ${T_RUNS})
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(TESSERA_SANITIZE)
    # Sanitized code runs several times slower (the default training run most of all).
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 4")
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT})
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# tessera_sh_test(NAME name TIMEOUT seconds [ARGS ...] [RUN_SERIAL])
# The script NAME.sh beside the calling CMakeLists.txt, run by bash with ARGS (default:
# the source and the build folder); exit code 77 reports it skipped.
function(tessera_sh_test)
  cmake_parse_arguments(T "RUN_SERIAL" "NAME;TIMEOUT" "ARGS" ${ARGN})
  if(NOT T_ARGS)
    set(T_ARGS ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  endif()
  add_test(NAME ${T_NAME} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/${T_NAME}.sh ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77)
  if(T_RUN_SERIAL)
    set_tests_properties(${T_NAME} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()

# tessera_cc_binary(NAME name OUTPUT tessera-foo SRCS ... DEPS ...)
# Binaries land at the top of the build tree (build/tessera-train).
function(tessera_cc_binary)
  cmake_parse_arguments(T "" "NAME;OUTPUT" "SRCS;DEPS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS})
  tessera_apply_common(${T_NAME})
  if(T_OUTPUT)
    set_target_properties(${T_NAME} PROPERTIES OUTPUT_NAME ${T_OUTPUT})
  endif()
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
endfunction()

# Fails the configuration when `target` links a library whose name matches `pattern`,
# directly or through any library it links, as CMake's link graph says (not only what
# --as-needed leaves). `what` names the rule in the message.
function(tessera_assert_links_none target pattern what)
  set(seen "")
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue t)
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${t})
    if(t MATCHES "${pattern}")
      message(FATAL_ERROR "${target} links ${t}: ${what}")
    endif()
    if(NOT TARGET ${t})
      continue()
    endif()
    get_target_property(aliased ${t} ALIASED_TARGET)
    if(aliased)
      list(APPEND queue ${aliased})
      continue()
    endif()
    foreach(property LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(libs ${t} ${property})
      if(libs)
        foreach(lib ${libs})
          if(NOT lib MATCHES "^\\$<")
            list(APPEND queue ${lib})
          endif()
        endforeach()
      endif()
    endforeach()
  endwhile()
endfunction()

# Links with gold where the toolchain has it (binutils does): it links the tests and
# programs in about a third of ld.bfd's time. Not in sanitized builds (clang's ASan
# runtime makes gold warn about each of its symbols).
function(tessera_use_fast_linker)
  if(TESSERA_SANITIZE)
    return()
  endif()
  include(CheckLinkerFlag)
  check_linker_flag(CXX "-fuse-ld=gold" TESSERA_HAVE_GOLD)
  if(TESSERA_HAVE_GOLD)
    add_link_options("$<$<LINK_LANGUAGE:CXX>:-fuse-ld=gold>")
  endif()
endfunction()
