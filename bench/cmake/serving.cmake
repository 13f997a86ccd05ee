# monolith-serving against its floors (issue #6): Predict throughput and p50/p99 for 100
# candidates x 26 slots (dim 16, MLP 256-128) at 1/4/8 in flight, an empty gRPC call, the
# model's compute floor from single-core sgemm measured in the same run, and sync lag under
# training load. Starts monolith-ps and monolith-serving processes.
if(TARGET monolith-serving)
  # the calls on a replica both serving benchmarks make (bench_serving.h)
  add_library(mt_bench_serving STATIC ${CMAKE_CURRENT_SOURCE_DIR}/bench_serving.c)
  target_compile_options(mt_bench_serving PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})
  target_link_libraries(mt_bench_serving PUBLIC mt_rpc PRIVATE mt_proto)
  add_executable(serving_bench ${CMAKE_CURRENT_SOURCE_DIR}/serving_bench.c)
  target_compile_options(serving_bench PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})
  target_link_libraries(serving_bench PRIVATE mt_bench_util mt_bench_serving mt_trainer mt_psclient mt_rpc mt_proto mt_data
                                              PkgConfig::OPENBLAS Threads::Threads m)
  target_compile_definitions(serving_bench PRIVATE MT_PS_BIN="$<TARGET_FILE:monolith-ps>"
                             MT_SERVING_BIN="$<TARGET_FILE:monolith-serving>")
  add_dependencies(serving_bench monolith-ps monolith-serving)
  mt_link_malloc(serving_bench)
endif()

# The parameters' fan-out to 1/4/8 replicas: directly against through Kafka (starts
# monolith-kafka-dev, monolith-ps and monolith-serving processes).
if(TARGET monolith-serving AND TARGET monolith-kafka-dev)
  add_executable(fanout_bench ${CMAKE_CURRENT_SOURCE_DIR}/fanout_bench.c)
  target_compile_options(fanout_bench PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})
  target_link_libraries(fanout_bench PRIVATE mt_bench_util mt_bench_serving mt_trainer mt_psclient mt_rpc mt_proto
                                             mt_data m)
  target_compile_definitions(fanout_bench PRIVATE MT_PS_BIN="$<TARGET_FILE:monolith-ps>"
                             MT_SERVING_BIN="$<TARGET_FILE:monolith-serving>"
                             MT_KAFKA_BIN="$<TARGET_FILE:monolith-kafka-dev>")
  add_dependencies(fanout_bench monolith-ps monolith-serving monolith-kafka-dev)
  mt_link_malloc(fanout_bench)
endif()
