# The serving replica end to end, in one process: PS shards, a trainer through them, a
# serving instance syncing from them, an embedded Kafka for the impression log
# (tests/e2e/test_serving.c; docs/serving.md).
if(TARGET mt_serving)
  mt_add_test(test_e2e_serving e2e/test_serving.c)
  target_include_directories(test_e2e_serving PRIVATE ${CMAKE_SOURCE_DIR}/tests/unit/ps)
  target_link_libraries(test_e2e_serving PRIVATE mt_serving mt_trainer mt_ps mt_store mt_psclient mt_route mt_kafka
                                                 mt_rpc mt_proto mt_data mt_model mt_embedding m)
  # --monolith-serving --check on a configuration that trains and serves (a multi-task model
  # too: serving answers its task scores)
  add_test(NAME test_serving_check_config COMMAND bash -c "\
set -e; f=$(mktemp); trap 'rm -f $f' EXIT; \
printf '[cluster]\\nps = 127.0.0.1:7100, 127.0.0.1:7101\\n[trainer]\\nslots = 1,2,3\\ndim = 8\\nhidden = 16\\n[serving]\\nsync_interval_ms = 1000\\n' > $f; \
$<TARGET_FILE:monolith-serving> --config $f --set serving.log_sample_rate=0.5 --check; \
$<TARGET_FILE:monolith-serving> --config $f --set model.type=mmoe --set model.tasks=3 --check; \
if $<TARGET_FILE:monolith-serving> --config $f --set serving.bogus=1 --check 2>/dev/null; then exit 1; else [ $? -eq 2 ]; fi; \
printf '[trainer]\\nslots = 1\\n' > $f; \
if $<TARGET_FILE:monolith-serving> --config $f --check 2>/dev/null; then exit 1; else [ $? -eq 2 ]; fi")
  # sharded serving: a subset of the shards with peers is good; without peers, a shard out of
  # range or listed twice is a configuration error (exit 2, naming the key)
  add_test(NAME test_serving_check_sharded_config COMMAND bash -c "\
set -e; f=$(mktemp); e=$(mktemp); trap 'rm -f $f $e' EXIT; \
printf '[cluster]\\nps = 127.0.0.1:7100, 127.0.0.1:7101\\n[trainer]\\nslots = 1,2,3\\ndim = 8\\nhidden = 16\\n' > $f; \
$<TARGET_FILE:monolith-serving> --config $f --set serving.shards=1 --set serving.peers=127.0.0.1:7200 --check; \
for bad in serving.shards=2 serving.shards=0,0 serving.peer_failure=maybe; do \
  if $<TARGET_FILE:monolith-serving> --config $f --set $bad --set serving.peers=127.0.0.1:7200 --check 2>$e; then echo accepted $bad; exit 1; else [ $? -eq 2 ]; grep -q serving. $e; fi; \
done; \
if $<TARGET_FILE:monolith-serving> --config $f --set serving.shards=1 --check 2>$e; then exit 1; else [ $? -eq 2 ]; grep -q serving.peers $e; fi")
  # 2 PS shards, 4 serving daemons holding different shards, one killed with SIGKILL under load
  # the parameters through Kafka: 2 publishing PS shards, 3 replicas on the topic, kill -9s
  if(TARGET monolith-kafka-dev)
    add_test(NAME test_e2e_fanout COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/fanout_e2e.sh)
    set_tests_properties(test_e2e_fanout PROPERTIES TIMEOUT 600 ENVIRONMENT
      "MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_SERVING_BIN=$<TARGET_FILE:monolith-serving>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_KAFKA_BIN=$<TARGET_FILE:monolith-kafka-dev>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  endif()
  add_test(NAME test_e2e_sharded_serving COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/sharded_serving_e2e.sh)
  set_tests_properties(test_e2e_sharded_serving PROPERTIES TIMEOUT 600 ENVIRONMENT
    "MT_PS_BIN=$<TARGET_FILE:monolith-ps>;MT_TRAINER_BIN=$<TARGET_FILE:monolith-trainer>;MT_SERVING_BIN=$<TARGET_FILE:monolith-serving>;MT_CLI_BIN=$<TARGET_FILE:monolith>;MT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
