# The kafka module (tests/unit/kafka) against its embedded mock cluster, and the
# monolith-kafka-dev daemon as a process, checked with kcat as an independent client.
# kcat missing: the e2e test fails with a message saying so (it is never skipped).
mt_add_test(test_kafka unit/kafka/test_kafka.c)
target_link_libraries(test_kafka PRIVATE mt_kafka mt_common)

find_program(MT_KCAT kcat)
if(NOT MT_KCAT)
  set(MT_KCAT "")
endif()
mt_add_test(test_e2e_kafka_dev e2e/test_kafka_dev.c)
target_link_libraries(test_e2e_kafka_dev PRIVATE mt_kafka mt_common)
target_compile_definitions(test_e2e_kafka_dev PRIVATE
                           MT_KAFKA_DEV_BIN="$<TARGET_FILE:monolith-kafka-dev>"
                           MT_KCAT_BIN="${MT_KCAT}")
add_dependencies(test_e2e_kafka_dev monolith-kafka-dev)
