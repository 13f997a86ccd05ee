# The joiner: its core without Kafka (tests/unit/joiner: join rules, shuffled / duplicated /
# late events, sampling, memory bound, restarts and a crash with exact counts, per-task
# labels), and
# monolith-joiner end to end on monolith-kafka-dev with kcat as an independent producer of
# raw messages (tests/e2e/joiner_e2e.sh: kill -9 and restart mid-stream, counted).
if(TARGET mt_joiner)
  mt_add_test(test_joiner unit/joiner/test_join.c)
  target_link_libraries(test_joiner PRIVATE mt_joiner mt_proto)
  # joiner.task_actions: per-task labels (early close, window end, sampling, restarts) and the
  # config key's parsing against the joiner's names of the action types.
  mt_add_test(test_joiner_tasks unit/joiner/test_tasks.c)
  target_link_libraries(test_joiner_tasks PRIVATE mt_joiner mt_config mt_proto)

  # The run of monolith-joiner as a library (mt/joiner_run.h) over the mock cluster, in
  # process: joins delivered once, the report, /metrics, and Kafka down at the last commit
  # round (the outbox kept, delivered first by the next run, the inputs skipped as replayed).
  mt_add_test(test_joiner_run unit/joiner/test_run.c)
  target_link_libraries(test_joiner_run PRIVATE mt_joiner mt_config mt_kafka mt_proto)

  add_test(NAME test_e2e_joiner COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/joiner_e2e.sh)
  set_tests_properties(test_e2e_joiner PROPERTIES TIMEOUT 300 ENVIRONMENT
    "MT_JOINER_BIN=$<TARGET_FILE:monolith-joiner>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_JOINER_TOOL=$<TARGET_FILE:joiner_e2e_tool>")

  # The e2e test's own producer of Impressions/Actions and counter of Examples.
  add_executable(joiner_e2e_tool e2e/joiner_e2e_tool.c)
  target_compile_options(joiner_e2e_tool PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})
  target_link_libraries(joiner_e2e_tool PRIVATE mt_kafka mt_proto mt_common)
endif()
