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

# wagma_add_test_variant(BASE SUFFIX LABEL label ENV K=V ...)
# Registers BASE_SUFFIX: the test BASE's executable again, with BASE's timeout, labels (plus
# LABEL), skip code and environment (plus ENV): the same assertions under another setting
# (e.g. WAGMA_TEST_TRAINER=program, WAGMA_ENGINE_ROUNDS=allreduce).
function(wagma_add_test_variant base suffix)
  cmake_parse_arguments(V "" "LABEL" "ENV" ${ARGN})
  get_test_property(${base} TIMEOUT timeout)
  get_test_property(${base} LABELS labels)
  get_test_property(${base} ENVIRONMENT env)
  get_test_property(${base} SKIP_RETURN_CODE skip)
  if(NOT env)
    set(env "")
  endif()
  list(APPEND env ${V_ENV})
  add_test(NAME ${base}_${suffix} COMMAND ${base})
  set_tests_properties(${base}_${suffix} PROPERTIES TIMEOUT ${timeout}
                       LABELS "${labels};${V_LABEL}" ENVIRONMENT "${env}")
  if(skip)
    set_tests_properties(${base}_${suffix} PROPERTIES SKIP_RETURN_CODE ${skip})
  endif()
endfunction()
