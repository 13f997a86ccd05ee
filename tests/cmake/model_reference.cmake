# The model's C math against an independent PyTorch implementation (Debian's python3-torch,
# installed by scripts/setup.sh; without it the test fails and says so): model_dump writes
# one computation of mt_model as JSON, torch_reference.py recomputes it in float64.
add_executable(model_dump reference/model_dump.c)
target_compile_options(model_dump PRIVATE ${MT_WARNINGS} ${MT_C_FLAGS})
target_link_libraries(model_dump PRIVATE mt_model m)
add_test(NAME test_model_torch_reference
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/reference/torch_reference.py
                 $<TARGET_FILE:model_dump>)
set_tests_properties(test_model_torch_reference PROPERTIES TIMEOUT 600)
