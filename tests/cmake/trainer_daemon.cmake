# monolith-trainer end to end: batch mode locally and against a monolith-ps shard, bad input.
add_test(NAME test_e2e_trainer_daemon COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/trainer_daemon.sh)
set_tests_properties(test_e2e_trainer_daemon PROPERTIES TIMEOUT 600 ENVIRONMENT
  "MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")

# monolith-trainer --online on monolith-kafka-dev: exact counts through commits and groups,
# garbage messages skipped, against a PS shard too. kcat is the independent producer.
add_test(NAME test_e2e_trainer_online COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/trainer_online.sh)
set_tests_properties(test_e2e_trainer_online PROPERTIES TIMEOUT 600 ENVIRONMENT
  "MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
