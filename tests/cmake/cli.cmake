# monolith (the operators' tool) as a library (mt/cli.h), in process: bad usage, health,
# predict and stats against fakes on loopback, gen's TSV.
if(TARGET mt_cli)
  mt_add_test(test_cli unit/cli/test_cli.c)
  target_link_libraries(test_cli PRIVATE mt_cli mt_rpc mt_proto)
endif()
