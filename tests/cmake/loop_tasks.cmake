# The loop with two tasks (tests/e2e/loop_tasks.sh, about 45 s): deploy/local-cluster.sh
# --quick with loadgen's conversions and joiner.task_actions = click, conversion; the joiner's
# per-task positives must equal the clicks and conversions made. Under the sanitizers the
# loop runs at a lower rate (as test_e2e_loop_sync).
if(TARGET monolith-serving AND TARGET monolith-loadgen AND TARGET monolith-joiner)
  add_test(NAME test_e2e_loop_tasks COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/loop_tasks.sh)
  if(MT_SANITIZE)
    set(MT_LOOP_TASKS_MODE smoke)
  else()
    set(MT_LOOP_TASKS_MODE full)
  endif()
  set_tests_properties(test_e2e_loop_tasks PROPERTIES TIMEOUT 400 ENVIRONMENT
    "MT_BIN=${CMAKE_BINARY_DIR};MT_SOURCE_DIR=${CMAKE_SOURCE_DIR};MT_LOOP_MODE=${MT_LOOP_TASKS_MODE}")
endif()
