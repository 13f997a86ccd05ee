# Which trainer defaults train well: optimizer x sparse lr x dim x dense lr on Criteo,
# MovieLens and the generator, against a one-pass FTRL logistic regression on the same split
# (docs/trainer.md, "Choosing the defaults"). Reads the real-data folder next to the
# repository (or $MT_SHARED_DATA, or --data); a missing data set is skipped with a line.
add_executable(sweep_bench ${CMAKE_CURRENT_SOURCE_DIR}/sweep_bench.c)
target_compile_options(sweep_bench PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})
target_compile_definitions(sweep_bench PRIVATE MT_SHARED_DATA="${CMAKE_SOURCE_DIR}/../shared/data")
target_link_libraries(sweep_bench PRIVATE mt_bench_util mt_trainer mt_config mt_data
                                          PkgConfig::OPENBLAS m)
mt_link_malloc(sweep_bench)
