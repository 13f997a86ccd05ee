# The loop with the other model families (tests/e2e/loop_models.sh, about 45 s each):
# deploy/local-cluster.sh --quick with mmoe on two tasks (loadgen's conversions, the joiner's
# joiner.task_actions = click, conversion) or din on the users' recent clicks (loadgen
# --sequence). One per build flavour, to keep the suite's time: din in the release build, mmoe
# at a lower rate under the sanitizers (as test_e2e_loop_sync); the model code of each runs
# under the sanitizers in test_e2e_serving and the trainer tests anyway.
if(TARGET monolith-serving AND TARGET monolith-loadgen AND TARGET monolith-joiner)
  add_test(NAME test_e2e_loop_models COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/loop_models.sh)
  if(MT_SANITIZE)
    set(MT_LOOP_MODELS_ENV "MT_LOOP_MODE=smoke;MT_LOOP_MODEL=mmoe")
  else()
    set(MT_LOOP_MODELS_ENV "MT_LOOP_MODE=full;MT_LOOP_MODEL=din")
  endif()
  set_tests_properties(test_e2e_loop_models PROPERTIES TIMEOUT 400 ENVIRONMENT
    "MT_BIN=${CMAKE_BINARY_DIR};MT_SOURCE_DIR=${CMAKE_SOURCE_DIR};${MT_LOOP_MODELS_ENV}")
endif()
