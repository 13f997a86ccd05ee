# Collisionless vs hashed embeddings on MovieLens, the Monolith paper's comparison in
# miniature (issue #4). Reads the real-data folder next to the repository (never copied into
# it); without it the bench prints {"skipped": ...} and exits 0.
add_executable(movielens_bench ${CMAKE_CURRENT_SOURCE_DIR}/movielens_bench.c)
target_compile_options(movielens_bench PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})
target_compile_definitions(movielens_bench PRIVATE MT_SHARED_DATA="${CMAKE_SOURCE_DIR}/../shared/data")
target_link_libraries(movielens_bench PRIVATE mt_bench_util mt_trainer mt_data PkgConfig::OPENBLAS m)
mt_link_malloc(movielens_bench)
