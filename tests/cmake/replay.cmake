# The replay module (tests/unit/replay): datasets as time-ordered impressions and actions,
# on inline samples and, when ../shared/data is present, the real trivago and MovieLens
# files (counts checked against an independent parse). Then `monolith replay` end to end on
# monolith-kafka-dev, read back with kcat and our consumer; and the joiner on the replayed
# trivago stream, when monolith-joiner is built (tests/e2e/replay_trivago_join.sh).
find_package(ZLIB REQUIRED)
mt_add_test(test_replay unit/replay/test_replay.c)
target_link_libraries(test_replay PRIVATE mt_replay mt_data mt_proto ZLIB::ZLIB)
target_link_libraries(test_replay PRIVATE Threads::Threads)
# A user's own CSV / TSV log (--dataset csv), configured through [input] as the CLI does it,
# on files the test writes.
mt_add_test(test_replay_csv unit/replay/test_replay_csv.c)
target_link_libraries(test_replay_csv PRIVATE mt_replay mt_config mt_data ZLIB::ZLIB)

# monolith replay -> monolith-kafka-dev, read back with our consumer and kcat.
find_program(MT_REPLAY_KCAT kcat)
if(NOT MT_REPLAY_KCAT)
  set(MT_REPLAY_KCAT "")
endif()
mt_add_test(test_e2e_replay_kafka e2e/test_replay_kafka.c)
target_link_libraries(test_e2e_replay_kafka PRIVATE mt_kafka mt_proto mt_common)
target_compile_definitions(test_e2e_replay_kafka PRIVATE
                           MT_KAFKA_DEV_BIN="$<TARGET_FILE:monolith-kafka-dev>"
                           MT_CLI_BIN="$<TARGET_FILE:monolith>" MT_KCAT_BIN="${MT_REPLAY_KCAT}")
add_dependencies(test_e2e_replay_kafka monolith-kafka-dev monolith)

# The replayed trivago stream joined by monolith-joiner, checked against labels computed
# from the file itself (positives = click-outs whose clicked hotel was shown).
if(TARGET monolith-joiner)
  add_test(NAME test_e2e_replay_trivago_join
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/replay_trivago_join.sh)
  # Exit 77: the trivago sample is absent (a clone without ../shared/data): ctest skips it.
  # Under the sanitizers: the first 20,000 rows of the sample (MT_E2E_ROWS), the same checks.
  set(MT_TRIVAGO_ROWS "")
  if(MT_SANITIZE OR MT_TSAN)
    set(MT_TRIVAGO_ROWS 20000)
  endif()
  set_tests_properties(test_e2e_replay_trivago_join PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77 ENVIRONMENT
    "MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_JOINER_BIN=$<TARGET_FILE:monolith-joiner>;MT_SHARED_DATA_BUILD=${CMAKE_SOURCE_DIR}/../shared/data;MT_E2E_ROWS=${MT_TRIVAGO_ROWS}")
endif()

# A log the test writes itself, through the whole loop: `monolith replay --dataset csv` (its
# columns from [input]) -> monolith-kafka-dev -> monolith-joiner -> monolith-trainer --online
# -> monolith-ps; exact counts at every step (tests/e2e/replay_csv_loop.sh). No shared data.
if(TARGET monolith-joiner AND TARGET monolith-trainer AND TARGET monolith-ps)
  add_test(NAME test_e2e_replay_csv_loop COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/replay_csv_loop.sh)
  set_tests_properties(test_e2e_replay_csv_loop PROPERTIES TIMEOUT 900 ENVIRONMENT
    "MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_JOINER_BIN=$<TARGET_FILE:monolith-joiner>;MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_PS_BIN=$<TARGET_FILE:monolith-ps>")
endif()
