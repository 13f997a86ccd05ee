# The rpc layer's empty call plaintext vs TLS, connection set-up, and overload refusals
# (issue #7; docs/security.md). In process; certificates made with the openssl CLI.
add_executable(rpc_bench ${CMAKE_CURRENT_SOURCE_DIR}/rpc_bench.c)
target_compile_options(rpc_bench PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})
target_include_directories(rpc_bench PRIVATE ${CMAKE_SOURCE_DIR}/tests/unit/rpc)
target_link_libraries(rpc_bench PRIVATE mt_bench_util mt_rpc Threads::Threads m)
mt_link_malloc(rpc_bench)
