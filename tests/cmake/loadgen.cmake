# monolith-loadgen's run as a library (mt/loadgen.h), in process: the exact AUC against a
# brute-force count, the flags, and a run against fake serving targets on loopback (an
# oracle scoring with the generator's true probabilities must match the truth's AUC).
if(TARGET mt_loadgen)
  mt_add_test(test_loadgen unit/loadgen/test_loadgen.c)
  target_link_libraries(test_loadgen PRIVATE mt_loadgen mt_data mt_rpc mt_proto m)
endif()
