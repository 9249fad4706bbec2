# wagma_add_test(NAME SOURCES a.c b.c LIBS x y TIMEOUT 60 [LABELS unit;timing] [ENV K=V ...])
# One cmocka executable per module, registered with ctest under a timeout.
# Label "timing" marks tests whose assertions depend on wall-clock speed: sanitizer
# builds skip them. Label "integration" marks tests that start real processes.
function(wagma_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 60)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} PkgConfig::CMOCKA Threads::Threads)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  if(T_ENV)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${T_ENV}")
  endif()
endfunction()
