# The daemons with [tls] (mutual TLS), limits and the admin token, as processes
# (tests/e2e/test_security.c; docs/security.md). Certificates are made at test time.
if(TARGET monolith-serving)
  find_program(MT_OPENSSL openssl REQUIRED)
  mt_add_test(test_e2e_security e2e/test_security.c e2e/testutil_daemon.c)
  target_link_libraries(test_e2e_security PRIVATE mt_psclient mt_rpc mt_proto mt_embedding)
  target_include_directories(test_e2e_security PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit/rpc)
  target_compile_definitions(test_e2e_security PRIVATE MT_PS_BIN="$<TARGET_FILE:monolith-ps>"
                             MT_CLI_BIN="$<TARGET_FILE:monolith>"
                             MT_SERVING_BIN="$<TARGET_FILE:monolith-serving>"
                             MT_TRAINER_BIN="$<TARGET_FILE:monolith-trainer>"
                             MT_LOADGEN_BIN="$<TARGET_FILE:monolith-loadgen>")
  add_dependencies(test_e2e_security monolith-ps monolith monolith-serving monolith-trainer
                   monolith-loadgen)
endif()
