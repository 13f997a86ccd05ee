# Consistent checkpoints (docs/checkpoint.md): a shard's Snapshot / Checkpoints / Restore with
# the examples counter, and the trainer's coordinator (mt/coord.h) over them, in process on
# RocksDB stores (tests/unit/ps/test_ckpt.c); and the
# whole loop with kill -9 of a PS shard and of the trainer, counted
# (tests/e2e/checkpoint_e2e.sh).
mt_add_test(test_ps_ckpt unit/ps/test_ckpt.c)
target_link_libraries(test_ps_ckpt PRIVATE mt_trainer mt_ps mt_route mt_psclient mt_store mt_rpc mt_proto
                                           mt_embedding Threads::Threads)

if(TARGET monolith-serving AND TARGET monolith-loadgen AND TARGET monolith-kafka-dev)
  add_test(NAME test_e2e_checkpoint COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/checkpoint_e2e.sh)
  set_tests_properties(test_e2e_checkpoint PROPERTIES TIMEOUT 300 ENVIRONMENT
    "MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_SERVING_BIN=$<TARGET_FILE:monolith-serving>;MT_LOADGEN_BIN=$<TARGET_FILE:monolith-loadgen>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()

# Many trainers, exactly once (docs/checkpoint.md, "Many trainers"): three online trainers
# with covered steps, two shards with their own snapshots, kill -9 of a trainer and of a
# shard, a trainer joining; counted (tests/e2e/many_trainers_e2e.sh).
# Under the sanitizers a third of the stream (the same steps, a shorter run).
if(TARGET monolith-kafka-dev)
  set(MT_MANY_ENV "")
  if(MT_SANITIZE OR MT_TSAN)
    set(MT_MANY_ENV ";MT_MANY_EXAMPLES=8000;MT_MANY_EXTRA=2000;MT_MANY_RATE=1000")
  endif()
  add_test(NAME test_e2e_many_trainers COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/many_trainers_e2e.sh)
  set_tests_properties(test_e2e_many_trainers PROPERTIES TIMEOUT 600 ENVIRONMENT
    "MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}${MT_MANY_ENV}")
endif()

# Many trainers at least once (checkpoints and covers off): the same kills and joins, the
# duplicates counted (tests/e2e/many_trainers_alo_e2e.sh).
if(TARGET monolith-kafka-dev)
  add_test(NAME test_e2e_many_trainers_alo COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/many_trainers_alo_e2e.sh)
  set_tests_properties(test_e2e_many_trainers_alo PROPERTIES TIMEOUT 600 ENVIRONMENT
    "MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}${MT_MANY_ENV}")
endif()

# Kafka's retention passed the shards' marks: the trainer stops, says where, applies nothing
# (tests/e2e/retention_e2e.sh).
if(TARGET monolith-kafka-dev)
  add_test(NAME test_e2e_retention COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/retention_e2e.sh)
  set_tests_properties(test_e2e_retention PROPERTIES TIMEOUT 600 ENVIRONMENT
    "MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
