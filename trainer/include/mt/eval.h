/*
 * eval.h - streaming evaluation of scores against labels: ROC AUC and log loss over every
 * example seen (AUC from 65,536 probability bins: O(1) memory for any number of examples,
 * off from the exact value only by ties within a bin of width 1/65536) and over a sliding
 * window of the last W examples (exact, mt_model_auc()).
 *
 * Progressive validation (score each example before training on it, then add it here) makes
 * these the online AUC and log loss the trainer reports.
 *
 * Thread safety: one evaluator is used by one thread at a time.
 */
#ifndef MT_EVAL_H
#define MT_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

typedef struct mt_eval mt_eval_t;

typedef struct mt_eval_result {
    uint64_t n, positives; /* examples added since create / reset */
    double auc, logloss;   /* over all of them; auc is NaN without both classes */
    size_t window_n;       /* examples in the window (at most its size) */
    double window_auc;     /* exact, over the window; NaN without both classes */
    double window_logloss;
} mt_eval_result_t;

/** @param window  examples in the sliding window, >= 1. @returns MT_OK, MT_INVALID, MT_NOMEM. */
mt_err_t mt_eval_create(size_t window, mt_eval_t **out);
void mt_eval_destroy(mt_eval_t *e);
/** Adds n (score, label) pairs; scores are clamped into [1e-7, 1 - 1e-7] for the log loss;
 *  a label > 0.5 is a positive. */
void mt_eval_add(mt_eval_t *e, const float *probs, const float *labels, size_t n);
/** mt_eval_add() of task @p t of multi-task scores and labels ([n x ntasks] each, example
 *  i's task t at i * ntasks + t). */
void mt_eval_add_task(mt_eval_t *e, const float *probs, const float *labels, size_t n,
                      uint32_t ntasks, uint32_t t);
/** @returns MT_OK or MT_NOMEM (the window's scratch). */
mt_err_t mt_eval_result(mt_eval_t *e, mt_eval_result_t *r);
/** Forgets every example (overall and window). */
void mt_eval_reset(mt_eval_t *e);

#endif /* MT_EVAL_H */
