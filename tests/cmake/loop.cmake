# The loop (issue #6): deploy/local-cluster.sh --compare on one machine, shortened: after
# 30 s of training, a serving replica synced every second and one that never syncs again
# score the same pages against the same clicks for 60 s; the fresher one must have the
# higher AUC (the Monolith paper's Table 2 direction; tests/e2e/loop_sync.sh). Under the
# sanitizers the daemons are several times slower and a 2-core machine cannot keep the
# trainer up with the traffic, so there the loop runs at a lower rate and only its plumbing
# is checked (requests answered, clicks delivered, examples joined), not the AUC direction.
if(TARGET monolith-serving AND TARGET monolith-loadgen AND TARGET monolith-joiner)
  add_test(NAME test_e2e_loop_sync COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/loop_sync.sh)
  if(MT_SANITIZE)
    set(MT_LOOP_MODE smoke)
  else()
    set(MT_LOOP_MODE auc)
  endif()
  set_tests_properties(test_e2e_loop_sync PROPERTIES TIMEOUT 400 ENVIRONMENT
    "MT_BIN=${CMAKE_BINARY_DIR};MT_SOURCE_DIR=${CMAKE_SOURCE_DIR};MT_LOOP_MODE=${MT_LOOP_MODE}")
endif()
