# The Python example client (clients/python) against monolith-ps + monolith-trainer +
# monolith-serving, with the stubs protoc and gRPC's Python plugin generate from proto/
# (mt_proto_python). Without protoc / the plugin / python3-grpcio the test fails with a
# message instead of being skipped silently (scripts/setup.sh installs them).
if(TARGET mt_serving)
  add_test(NAME test_e2e_python_client COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/python_client.sh)
  set_tests_properties(test_e2e_python_client PROPERTIES TIMEOUT 600 ENVIRONMENT
    "MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_SERVING_BIN=$<TARGET_FILE:monolith-serving>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_PY_STUBS=${CMAKE_BINARY_DIR}/python;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
