/*
 * test_eval.c - the streaming evaluator: binned AUC within 1e-3 of the exact one, the
 * window's AUC exactly mt_model_auc() of the last W examples, log loss, reset.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "mt/eval.h"
#include "mt/model.h"

static uint64_t rng = 88172645463325252ull;
static double uni(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

Test(eval, binned_auc_and_window) {
    enum { N = 20000, W = 3000 };
    float *p = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    double loss = 0;
    for (int i = 0; i < N; i++) {
        y[i] = uni() < 0.1 ? 1.0f : 0.0f;
        double z = (y[i] > 0.5f ? 1.0 : 0.0) + 1.5 * (uni() - 0.5) * 2.0 - 2.5;
        p[i] = (float)(1.0 / (1.0 + exp(-z)));
        loss += y[i] > 0.5f ? -log(p[i]) : -log1p(-(double)p[i]);
    }
    mt_eval_t *e;
    cr_assert_eq(mt_eval_create(W, &e), MT_OK);
    for (int i = 0; i < N; i += 777)
        mt_eval_add(e, p + i, y + i, (size_t)(N - i < 777 ? N - i : 777));
    mt_eval_result_t r;
    cr_assert_eq(mt_eval_result(e, &r), MT_OK);
    double exact, wexact;
    cr_assert_eq(mt_model_auc(p, y, N, &exact), MT_OK);
    cr_assert_eq(mt_model_auc(p + N - W, y + N - W, W, &wexact), MT_OK);
    cr_assert_eq(r.n, N);
    cr_assert(fabs(r.auc - exact) < 1e-3, "binned %f exact %f", r.auc, exact);
    cr_assert(exact > 0.6 && exact < 0.95, "exact %f", exact);
    cr_assert_eq(r.window_n, W);
    cr_assert_float_eq(r.window_auc, wexact, 1e-12);
    cr_assert_float_eq(r.logloss, loss / N, 1e-6);
    mt_eval_reset(e);
    cr_assert_eq(mt_eval_result(e, &r), MT_OK);
    cr_assert_eq(r.n, 0);
    cr_assert(isnan(r.auc) && isnan(r.window_auc));
    /* one class only: AUC undefined, log loss defined */
    float ones[4] = {1, 1, 1, 1}, ps[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    mt_eval_add(e, ps, ones, 4);
    cr_assert_eq(mt_eval_result(e, &r), MT_OK);
    cr_assert(isnan(r.auc) && isnan(r.window_auc) && r.logloss > 0);
    cr_assert_eq(mt_eval_create(0, &e), MT_INVALID);
    mt_eval_destroy(e);
    free(p);
    free(y);
}
