# The trainer's streaming evaluator (binned and windowed AUC, log loss).
mt_add_test(test_trainer_eval unit/trainer/test_eval.c)
target_link_libraries(test_trainer_eval PRIVATE mt_trainer mt_model m)
