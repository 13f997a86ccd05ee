/*
 * eval.c - streaming AUC and log loss: binned overall, exact over a sliding window.
 */
#include "mt/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt/model.h"

#define NBINS 65536

struct mt_eval {
    uint64_t *pos, *neg; /* [NBINS] counts per probability bin */
    uint64_t n, npos;
    double loss_sum;
    size_t wcap, wlen, whead; /* ring of the last wcap examples */
    float *wp, *wl, *tmp_p, *tmp_l;
    double *wloss;
    double wloss_sum;
};

mt_err_t mt_eval_create(size_t window, mt_eval_t **out) {
    if (!out || window < 1) return MT_INVALID;
    mt_eval_t *e = calloc(1, sizeof(*e));
    if (!e) return MT_NOMEM;
    e->wcap = window;
    e->pos = calloc(NBINS, sizeof(uint64_t));
    e->neg = calloc(NBINS, sizeof(uint64_t));
    e->wp = malloc(window * sizeof(float));
    e->wl = malloc(window * sizeof(float));
    e->tmp_p = malloc(window * sizeof(float));
    e->tmp_l = malloc(window * sizeof(float));
    e->wloss = malloc(window * sizeof(double));
    if (!e->pos || !e->neg || !e->wp || !e->wl || !e->tmp_p || !e->tmp_l || !e->wloss) {
        mt_eval_destroy(e);
        return MT_NOMEM;
    }
    *out = e;
    return MT_OK;
}

void mt_eval_destroy(mt_eval_t *e) {
    if (!e) return;
    free(e->pos);
    free(e->neg);
    free(e->wp);
    free(e->wl);
    free(e->tmp_p);
    free(e->tmp_l);
    free(e->wloss);
    free(e);
}

void mt_eval_reset(mt_eval_t *e) {
    memset(e->pos, 0, NBINS * sizeof(uint64_t));
    memset(e->neg, 0, NBINS * sizeof(uint64_t));
    e->n = e->npos = 0;
    e->loss_sum = 0;
    e->wlen = e->whead = 0;
    e->wloss_sum = 0;
}

void mt_eval_add(mt_eval_t *e, const float *probs, const float *labels, size_t n) {
    mt_eval_add_task(e, probs, labels, n, 1, 0);
}

void mt_eval_add_task(mt_eval_t *e, const float *probs, const float *labels, size_t n,
                      uint32_t ntasks, uint32_t t) {
    for (size_t i = 0; i < n; i++) {
        double p = probs[i * ntasks + t];
        if (!(p >= 1e-7)) p = 1e-7; /* NaN too */
        if (p > 1 - 1e-7) p = 1 - 1e-7;
        int y = labels[i * ntasks + t] > 0.5f;
        double l = y ? -log(p) : -log1p(-p);
        size_t bin = (size_t)(p * NBINS);
        if (bin >= NBINS) bin = NBINS - 1;
        if (y) {
            e->pos[bin]++;
            e->npos++;
        } else {
            e->neg[bin]++;
        }
        e->n++;
        e->loss_sum += l;
        size_t at = e->whead;
        if (e->wlen == e->wcap)
            e->wloss_sum -= e->wloss[at];
        else
            e->wlen++;
        e->wp[at] = (float)p;
        e->wl[at] = y ? 1.0f : 0.0f;
        e->wloss[at] = l;
        e->wloss_sum += l;
        e->whead = (at + 1) % e->wcap;
    }
}

mt_err_t mt_eval_result(mt_eval_t *e, mt_eval_result_t *r) {
    memset(r, 0, sizeof(*r));
    r->n = e->n;
    r->positives = e->npos;
    r->logloss = e->n ? e->loss_sum / (double)e->n : NAN;
    r->auc = NAN;
    uint64_t nneg = e->n - e->npos;
    if (e->npos && nneg) {
        /* a positive beats every negative in a lower bin and half of those in its own */
        double wins = 0, neg_below = 0;
        for (size_t b = 0; b < NBINS; b++) {
            wins += (double)e->pos[b] * (neg_below + 0.5 * (double)e->neg[b]);
            neg_below += (double)e->neg[b];
        }
        r->auc = wins / ((double)e->npos * (double)nneg);
    }
    r->window_n = e->wlen;
    r->window_logloss = e->wlen ? e->wloss_sum / (double)e->wlen : NAN;
    r->window_auc = NAN;
    if (e->wlen) {
        memcpy(e->tmp_p, e->wp, e->wlen * sizeof(float));
        memcpy(e->tmp_l, e->wl, e->wlen * sizeof(float));
        double auc;
        mt_err_t err = mt_model_auc(e->tmp_p, e->tmp_l, e->wlen, &auc);
        if (err == MT_NOMEM) return err;
        if (err == MT_OK) r->window_auc = auc;
    }
    return MT_OK;
}
