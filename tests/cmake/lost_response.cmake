# Exactly-once under a lost response (docs/checkpoint.md): mt_faultproxy
# (tests/e2e/faultproxy.c), a TCP proxy between monolith-trainer and PS shard 1 that lets an
# ApplyGradients reach the shard and drops its answer (until its trailers went by: however
# late the shard answers), then resets the connection; the trainer must recover to the last
# complete checkpoint instead of retrying, and every shard's examples_applied ends at
# exactly the number of examples produced
# (tests/e2e/lost_response_e2e.sh). Its waits are for conditions; TIMEOUT is a hang guard
# (a passing run takes about 30 s, longer on a loaded ASan machine).
add_executable(mt_faultproxy e2e/faultproxy.c)
target_compile_options(mt_faultproxy PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})

if(TARGET monolith-kafka-dev)
  add_test(NAME test_e2e_lost_response
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/lost_response_e2e.sh)
  set_tests_properties(test_e2e_lost_response PROPERTIES TIMEOUT 1800 ENVIRONMENT
    "MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_FAULTPROXY_BIN=$<TARGET_FILE:mt_faultproxy>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
