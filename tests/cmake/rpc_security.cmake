# The rpc layer's TLS (certificates made by the openssl CLI at test time) and admission
# (overload answered RESOURCE_EXHAUSTED, Health under load, streams beside unary calls).
find_program(MT_OPENSSL openssl REQUIRED)
mt_add_test(test_rpc_security unit/rpc/test_rpc_security.c)
target_link_libraries(test_rpc_security PRIVATE mt_rpc Threads::Threads)
